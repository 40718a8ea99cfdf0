package onebox

import (
	"context"
	"fmt"
	"github.com/strandhq/strand/internal/clustertest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// history records every assignment and pending recovery written for one
// stream, from an etcd watch opened before the test acts, so a test can
// say what never happened (a broker never named in an assignment).
type history struct {
	mu          sync.Mutex
	assignments []cluster.Assignment
	recoveries  []cluster.Recovery
}

func watchHistory(t *testing.T, c *Cluster, stream string) *history {
	t.Helper()
	ctx, cancel := context.WithCancel(c.Ctx())
	head, err := c.Cli.Get(ctx, c.Schema.AssignmentKey(stream))
	if err != nil {
		cancel()
		t.Fatalf("read %s: %v", stream, err)
	}
	h := &history{}
	for _, kv := range head.Kvs {
		if a, err := cluster.Decode[cluster.Assignment](kv.Value); err == nil {
			h.assignments = append(h.assignments, a)
		}
	}
	from := clientv3.WithRev(head.Header.Revision + 1)
	wa := c.Cli.Watch(ctx, c.Schema.AssignmentKey(stream), from)
	wr := c.Cli.Watch(ctx, c.Schema.RecoveryKey(stream), from)
	var wg sync.WaitGroup
	wg.Go(func() {
		for resp := range wa {
			for _, ev := range resp.Events {
				if a, err := cluster.Decode[cluster.Assignment](ev.Kv.Value); ev.Type == clientv3.EventTypePut && err == nil {
					h.mu.Lock()
					h.assignments = append(h.assignments, a)
					h.mu.Unlock()
				}
			}
		}
	})
	wg.Go(func() {
		for resp := range wr {
			for _, ev := range resp.Events {
				if r, err := cluster.Decode[cluster.Recovery](ev.Kv.Value); ev.Type == clientv3.EventTypePut && err == nil {
					h.mu.Lock()
					h.recoveries = append(h.recoveries, r)
					h.mu.Unlock()
				}
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return h
}

// named returns the assignments that include node.
func (h *history) named(node string) []cluster.Assignment {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []cluster.Assignment
	for _, a := range h.assignments {
		if a.Includes(node) {
			out = append(out, a)
		}
	}
	return out
}

func (h *history) recorded() []cluster.Recovery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recoveries)
}

// replaceScenario starts four brokers with replaceAfter, a three-copy
// majority_durable stream published to throughout, and crash-kills the
// member victim names (the owner when nil) once the publisher confirms. It
// returns the first assignment, the broker left without a copy, the
// stream's history and the publisher.
func replaceScenario(t *testing.T, stream string, replaceAfter time.Duration, victim func(cluster.Assignment) string) (*Cluster, cluster.Assignment, string, *history, *ledger.Ledger, *ledger.Publisher) {
	brokers := []string{"b1", "b2", "b3", "b4"}
	c := Start(t, Options{Brokers: brokers, Controllers: 1, Recoverers: 1, ReplaceAfter: replaceAfter})
	a0 := c.CreateStream(stream, 3, majority)
	spare := ""
	for _, b := range brokers {
		if !a0.Includes(b) {
			spare = b
		}
	}
	h := watchHistory(t, c, stream)
	l := ledger.New()
	pub := ledger.Start(c.Client().Publish, stream, stream, 2, 30*time.Second, l)
	t.Cleanup(pub.Stop)
	clustertest.Eventually(t, 20*time.Second, "the publisher confirms before the kill", func() error {
		if n := l.Count(); n < 20 {
			return fmt.Errorf("%d confirmed; last error %q", n, pub.LastError())
		}
		return nil
	})
	killed := a0.Owner
	if victim != nil {
		killed = victim(a0)
	}
	select {
	case err := <-c.KillBroker(killed):
		if err != nil {
			t.Fatalf("kill %s: %v", killed, err)
		}
	case <-time.After(ReadyTimeout):
		t.Fatalf("kill %s did not finish within %s", killed, ReadyTimeout)
	}
	return c, a0, spare, h, l, pub
}

// confirmsAt waits until the publisher has confirmed records at epoch.
func confirmsAt(t *testing.T, l *ledger.Ledger, pub *ledger.Publisher, epoch uint64) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, fmt.Sprintf("the publisher confirms at epoch %d", epoch), func() error {
		if n := l.AtEpoch(epoch); n < 10 {
			return fmt.Errorf("%d confirmed at epoch %d; last error %q", n, epoch, pub.LastError())
		}
		return nil
	})
}

// The returning copy rejoins; replacement waits. The owner of a
// three-copy stream on four brokers is crash-killed and comes back within
// --replace-after: the recovery keeps its copy as a follower, it rejoins
// and catches up from its own tail, and the spare broker is never given a
// copy of the stream. Every confirmed record is on the owner and on the
// returned copy.
func TestReturningOwnerRejoinsWithoutReplacement(t *testing.T) {
	const stream = "rejoin"
	c, a0, spare, h, l, pub := replaceScenario(t, stream, 0, nil)
	old := a0.Owner

	a1 := waitRecovered(t, c, stream, a0.Epoch, 30*time.Second)
	if a1.Copies() != 3 || !slices.Contains(a1.Followers, old) || a1.Includes(spare) {
		t.Fatalf("recovered assignment %+v: want the 3 old copies, %s a follower, no copy on the spare %s", a1, old, spare)
	}
	confirmsAt(t, l, pub, a1.Epoch)

	c.StartBroker(old)
	confirmsAt(t, l, pub, a1.Epoch)
	pub.Stop()
	a2 := waitRejoined(t, c, stream, old, a1.Epoch)
	if a2.Epoch != a1.Epoch {
		t.Fatalf("assignment moved to %+v: the returning copy needs no other change", a2)
	}
	verify(t, c, a2.Owner, stream, l)
	verify(t, c, old, stream, l)

	if got := h.named(spare); len(got) > 0 {
		t.Fatalf("spare %s was named in assignments %+v", spare, got)
	}
	if tails, ok := c.Tails(spare, stream); ok {
		t.Fatalf("spare %s publishes a copy of %s: %+v", spare, stream, tails)
	}
	for _, r := range h.recorded() {
		if len(r.AddedMembers) > 0 || len(r.RemovedMembers) > 0 {
			t.Fatalf("a recovery changed the membership: %+v", r)
		}
	}
}

// Replacement after the window. The owner is crash-killed and stays away
// past a short --replace-after: the controller replaces it through a
// pending recovery (reason replace) that removes it and adds the spare,
// which starts empty and catches up from the owner, while the stream
// keeps confirming. The stream ends with three live copies and every
// confirmed record on the owner and on the new copy.
func TestMissingOwnerReplacedAfterWindow(t *testing.T) {
	const stream = "replace"
	c, a0, spare, h, l, pub := replaceScenario(t, stream, 2*time.Second, nil)
	old := a0.Owner

	a := c.WaitAssignment(stream, 60*time.Second, spare+" replaces "+old, func(a cluster.Assignment) error {
		if a.Includes(old) || !a.Includes(spare) || a.Copies() != 3 {
			return fmt.Errorf("assignment %+v", a)
		}
		if r, pending := c.Recovery(stream); pending {
			return fmt.Errorf("recovery to epoch %d still pending", r.FenceEpoch)
		}
		return nil
	})
	confirmsAt(t, l, pub, a.Epoch)
	pub.Stop()
	c.WaitApplied(a)
	for _, m := range a.Members() {
		if c.Broker(m) == nil {
			t.Fatalf("member %s of %+v is not running", m, a)
		}
	}
	clustertest.Eventually(t, 30*time.Second, spare+" catches up", func() error {
		ot, _ := c.Tails(a.Owner, stream)
		st, ok := c.Tails(spare, stream)
		if !ok || st.Role != cluster.RoleFollower || st.RecordTail != ot.RecordTail {
			return fmt.Errorf("spare %+v (present %v), owner %+v", st, ok, ot)
		}
		return nil
	})
	verify(t, c, a.Owner, stream, l)
	verify(t, c, spare, stream, l)

	var replace *cluster.Recovery
	for _, r := range h.recorded() {
		if strings.HasPrefix(r.Reason, "replace") {
			replace = &r
		}
	}
	if replace == nil || !slices.Equal(replace.RemovedMembers, []string{old}) || !slices.Equal(replace.AddedMembers, []string{spare}) {
		t.Fatalf("no replace recovery removing %s and adding %s among %+v", old, spare, h.recorded())
	}
	// The owner loss itself replaced nothing: the first recovery kept
	// every copy.
	first := h.recorded()[0]
	if len(first.AddedMembers) > 0 || len(first.RemovedMembers) > 0 {
		t.Fatalf("the owner-loss recovery changed the membership: %+v", first)
	}
}

// A follower missing past the window is replaced the same way, and the
// healthy owner keeps its stream: the replace recovery proposes it, and the
// recoverer's pick prefers it among copies tied at the furthest tails
// (docs/protocol.md, "Stream failover"). A follower never holds more than
// its owner wrote, so the sealed owner is furthest or tied with the live
// follower, which catches up while the seal stops publishes; were that
// follower to sort before the owner by node id, the plain tie-break would
// promote it.
func TestMissingFollowerReplacedOwnerKeepsStream(t *testing.T) {
	const stream = "follower"
	c, a0, spare, h, l, pub := replaceScenario(t, stream, 2*time.Second, func(a cluster.Assignment) string { return slices.Max(a.Followers) })
	dead := slices.Max(a0.Followers)

	a := c.WaitAssignment(stream, 60*time.Second, spare+" replaces "+dead, func(a cluster.Assignment) error {
		if a.Includes(dead) || !a.Includes(spare) || a.Copies() != 3 {
			return fmt.Errorf("assignment %+v", a)
		}
		if r, pending := c.Recovery(stream); pending {
			return fmt.Errorf("recovery to epoch %d still pending", r.FenceEpoch)
		}
		return nil
	})
	if a.Owner != a0.Owner {
		t.Fatalf("the replacement moved the stream from its healthy owner %s: %+v", a0.Owner, a)
	}
	confirmsAt(t, l, pub, a.Epoch)
	pub.Stop()
	clustertest.Eventually(t, 30*time.Second, spare+" catches up", func() error {
		ot, _ := c.Tails(a.Owner, stream)
		st, ok := c.Tails(spare, stream)
		if !ok || st.Role != cluster.RoleFollower || st.RecordTail != ot.RecordTail {
			return fmt.Errorf("spare %+v (present %v), owner %+v", st, ok, ot)
		}
		return nil
	})
	verify(t, c, a.Owner, stream, l)
	verify(t, c, spare, stream, l)
	recs := h.recorded()
	if len(recs) != 1 || recs[0].ProposedOwner != a0.Owner || !strings.HasPrefix(recs[0].Reason, "replace") ||
		!slices.Equal(recs[0].RemovedMembers, []string{dead}) || !slices.Equal(recs[0].AddedMembers, []string{spare}) {
		t.Fatalf("recoveries %+v: want one replace recovery proposing %s, removing %s, adding %s", recs, a0.Owner, dead, spare)
	}
}
