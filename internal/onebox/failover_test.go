package onebox

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

var majority = cluster.Policy{Name: cluster.MajorityDurable}

// three is the usual cluster: three brokers, one controller, one recoverer.
func three(t *testing.T) *Cluster {
	return Start(t, Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1, Recoverers: 1})
}

// publishAll publishes payloads one call each through the Go client and
// records the confirms in l.
func publishAll(t *testing.T, c *Cluster, stream string, l *ledger.Ledger, payloads ...string) {
	t.Helper()
	cl := c.Client()
	for _, p := range payloads {
		ctx, cancel := context.WithTimeout(c.Ctx(), 30*time.Second)
		res, err := cl.Publish(ctx, stream, []*strandv1.Record{{Payload: []byte(p)}})
		cancel()
		if err != nil {
			t.Fatalf("publish %s to %s: %v", p, stream, err)
		}
		l.Confirm(p, res.GetOffsets()[0], res.GetEpoch())
	}
}

// verify reads the stream from node and checks it against the ledger. A
// follower shows a record once the owner's next message brings it the
// confirm watermark, which may come just after the confirm reached the
// client: verify waits (bounded) until node shows every confirmed record
// with nothing wrong, and fails the test with what it found otherwise.
func verify(t *testing.T, c *Cluster, node, stream string, l *ledger.Ledger) []*strandv1.StoredRecord {
	t.Helper()
	var recs []*strandv1.StoredRecord
	clustertest.Eventually(t, 10*time.Second, fmt.Sprintf("%s on %s shows every confirmed record", stream, node), func() error {
		var err error
		if recs, err = c.ReadAll(node, stream); err != nil {
			return err
		}
		if found, problems := l.Verify(recs); found != l.Count() || len(problems) > 0 {
			return fmt.Errorf("%d of %d confirmed records found; %v", found, l.Count(), problems)
		}
		return nil
	})
	return recs
}

// waitRecovered waits until stream's assignment moved past epoch with no
// recovery pending, and returns it.
func waitRecovered(t *testing.T, c *Cluster, stream string, from uint64, within time.Duration) cluster.Assignment {
	t.Helper()
	return c.WaitAssignment(stream, within, fmt.Sprintf("%s recovered past epoch %d", stream, from), func(a cluster.Assignment) error {
		if a.Epoch <= from {
			return fmt.Errorf("still at epoch %d", a.Epoch)
		}
		if r, pending := c.Recovery(stream); pending {
			return fmt.Errorf("recovery to epoch %d still pending", r.FenceEpoch)
		}
		return nil
	})
}

// waitRejoined waits until node follows stream at epoch with the owner's
// record tail and returns the assignment.
func waitRejoined(t *testing.T, c *Cluster, stream, node string, epoch uint64) cluster.Assignment {
	t.Helper()
	a := c.WaitAssignment(stream, 20*time.Second, node+" added back as a follower of "+stream, func(a cluster.Assignment) error {
		if !slices.Contains(a.Followers, node) {
			return fmt.Errorf("assignment %+v", a)
		}
		return nil
	})
	clustertest.Eventually(t, 20*time.Second, node+" follows "+stream+" caught up", func() error {
		ot, ok := c.Tails(a.Owner, stream)
		if !ok {
			return fmt.Errorf("owner %s publishes no copy", a.Owner)
		}
		t, ok := c.Tails(node, stream)
		if !ok || t.Role != cluster.RoleFollower || t.Epoch != epoch || t.SealEpoch != 0 || t.RecordTail != ot.RecordTail {
			return fmt.Errorf("%s publishes %+v (present %v); owner %+v", node, t, ok, ot)
		}
		return nil
	})
	return a
}

// TestCleanShutdownOfOwnerFailsOverEagerly: the owner's app closes cleanly,
// which revokes its lease, so the controller records the recovery at once
// and the recoverer commits without waiting for the lease TTL (eager
// failover on a clean shutdown of the owner). The copy it promotes is released from its
// seal and serves at its own tails; the old owner comes back as a follower
// with no further recovery.
func TestCleanShutdownOfOwnerFailsOverEagerly(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "eager"
	a0 := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("before", 30)...)
	if _, err := c.Client().CommitCursor(c.Ctx(), stream, "reader", 12); err != nil {
		t.Fatal(err)
	}
	for _, f := range a0.Followers {
		waitTails(t, c, f, stream, 30, 1)
	}
	hist0 := c.History(stream)

	// The owner drains while the cluster fails over: the recovery and the
	// first confirm on the new owner are timed from the start of its
	// shutdown (logged only; correctness is what is asserted).
	stopped := time.Now()
	closing := c.StopBrokerAsync(a0.Owner)
	a1 := waitRecovered(t, c, stream, a0.Epoch, 15*time.Second)
	recovered := time.Since(stopped)
	// The old owner stays a member, as a follower: it rejoins when it
	// returns, and nothing is re-replicated meanwhile.
	if a1.Epoch != a0.Epoch+1 || a1.Owner == a0.Owner || !slices.Contains(a0.Followers, a1.Owner) || !slices.Contains(a1.Followers, a0.Owner) {
		t.Fatalf("after the failover: %+v, from %+v", a1, a0)
	}
	if a1.Policy != majority || a1.Copies() != 3 {
		t.Errorf("recovered assignment %+v, want the three copies under %s", a1, majority)
	}
	hist1 := c.History(stream)
	start, _ := hist1.Latest()
	want := cluster.HistoryStart{Epoch: a1.Epoch, RecordTail: 30, CursorEventTail: 1, Node: a1.Owner}
	if len(hist1) != len(hist0)+1 || start != want {
		t.Fatalf("history %+v after %+v, want %+v appended", hist1, hist0, want)
	}

	// The promoted copy was sealed; the assignment releases it in place
	// and it owns at its own tails: the next offset is its sealed tail.
	res, err := c.Client().Publish(c.Ctx(), stream, []*strandv1.Record{{Payload: []byte("after-0")}})
	if err != nil {
		t.Fatalf("publish after the failover: %v", err)
	}
	confirmed := time.Since(stopped)
	select {
	case err := <-closing:
		if err != nil {
			t.Fatalf("close %s: %v", a0.Owner, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not finish its shutdown", a0.Owner)
	}
	t.Logf("clean shutdown of %s: recovery committed within %s, first confirm on %s %s after the shutdown began; the shutdown itself took %s",
		a0.Owner, recovered.Round(time.Millisecond), a1.Owner, confirmed.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
	if res.GetOffsets()[0] != start.RecordTail || res.GetEpoch() != a1.Epoch {
		t.Fatalf("first publish on the new owner at offset %d epoch %d, want offset %d (its sealed tail) epoch %d",
			res.GetOffsets()[0], res.GetEpoch(), start.RecordTail, a1.Epoch)
	}
	l.Confirm("after-0", res.GetOffsets()[0], res.GetEpoch())
	publishAll(t, c, stream, l, Numbered("after", 10)[1:]...)
	for _, n := range a1.Members() {
		if c.Broker(n) == nil {
			continue // the old owner, away
		}
		tails, ok := c.Tails(n, stream)
		if !ok || tails.SealEpoch != 0 {
			t.Errorf("%s still sealed after the recovered assignment: %+v", n, tails)
		}
	}
	owner := verify(t, c, a1.Owner, stream, l)
	// A cursor commit that reached the followers survives the failover.
	if cur, err := c.Client().GetCursor(c.Ctx(), stream, "reader"); err != nil || !cur.GetFound() || cur.GetOffset() != 12 {
		t.Errorf("cursor reader on the new owner: %v (%v), want 12", cur, err)
	}

	// The old owner returns with its data: still a member, it follows at
	// the same epoch, with no new recovery and no change of assignment.
	c.StartBroker(a0.Owner)
	a2 := waitRejoined(t, c, stream, a0.Owner, a1.Epoch)
	if a2.Epoch != a1.Epoch || a2.Owner != a1.Owner {
		t.Errorf("rejoin moved the stream: %+v, was %+v", a2, a1)
	}
	if hist2 := c.History(stream); len(hist2) != len(hist1) {
		t.Errorf("the rejoin changed the history: %+v, was %+v", hist2, hist1)
	}
	if r, pending := c.Recovery(stream); pending {
		t.Errorf("recovery pending after the rejoin: %+v", r)
	}
	clustertest.Eventually(t, 10*time.Second, "the rejoined copy shows the owner's records", func() error {
		got, err := c.ReadAll(a0.Owner, stream)
		if err != nil {
			return err
		}
		return SameRecords(a1.Owner, owner, a0.Owner, got)
	})
}
