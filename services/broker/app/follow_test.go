package app

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// followCalls reads an owner's Follow series: calls being served, calls
// served in all, and stream follows on them.
func (h *harness) followCalls(node string) (now, total, follows float64) {
	h.t.Helper()
	m := h.scrape(node)
	return gaugeValue(m, "strand_broker_follow_calls"), counterValue(m, "strand_broker_follow_calls_total"), gaugeValue(m, "strand_broker_follows")
}

// waitFollows waits until node serves calls Follow calls carrying follows
// stream follows.
func (h *harness) waitFollows(node string, calls, follows float64) {
	h.t.Helper()
	clustertest.Eventually(h.t, 15*time.Second, fmt.Sprintf("%s serves %v follows on %v calls", node, follows, calls), func() error {
		now, _, f := h.followCalls(node)
		if now != calls || f != follows {
			return fmt.Errorf("%v follows on %v calls", f, now)
		}
		return nil
	})
}

// everyCopy is three copies on b1, b2 and b3 confirming only once all
// three hold a record: a confirmed publish proves both followers follow.
func everyCopy(stream, owner string) cluster.Assignment {
	var followers []string
	for _, n := range []string{"b1", "b2", "b3"} {
		if n != owner {
			followers = append(followers, n)
		}
	}
	return cluster.Assignment{Stream: stream, Epoch: 1, Owner: owner, Followers: followers, Policy: cluster.Policy{Name: cluster.LocalDurable}}
}

// Many streams between two brokers share one Follow call: with 24 streams
// owned by b1 and 8 by b2, each followed on the two other brokers, b1
// serves exactly two calls (b2's and b3's) carrying 48 follows, and b2
// two carrying 16.
func TestManyStreamsShareOneFollowCall(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	for i := range 24 {
		h.assign(everyCopy(fmt.Sprintf("s%02d", i), "b1"))
	}
	for i := range 8 {
		h.assign(everyCopy(fmt.Sprintf("t%02d", i), "b2"))
	}
	for i := range 24 {
		h.publish("b1", fmt.Sprintf("s%02d", i), "a", "b")
	}
	for i := range 8 {
		h.publish("b2", fmt.Sprintf("t%02d", i), "a")
	}
	h.waitFollows("b1", 2, 48)
	h.waitFollows("b2", 2, 16)
	if now, _, _ := h.followCalls("b3"); now != 0 {
		t.Fatalf("b3 owns nothing and serves %v Follow calls", now)
	}
}

// A stream sealed on its owner ends its follows and only them: the other
// stream on the same calls goes on confirming under local_durable, and no
// call is opened again.
func TestSealEndsOneFollowOnTheSharedCall(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	h.assign(everyCopy("sealed", "b1"))
	h.assign(everyCopy("goes-on", "b1"))
	h.publish("b1", "sealed", "a")
	h.publish("b1", "goes-on", "a")
	h.waitFollows("b1", 2, 4)
	_, before, _ := h.followCalls("b1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.replication("b1").Seal(ctx, connect.NewRequest(&strandv1.SealRequest{Stream: "sealed", FenceEpoch: 2, TransitionId: "t1"})); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		h.publish("b1", "goes-on", fmt.Sprint(i))
	}
	_, err := h.streams("b1").Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "sealed", Records: []*strandv1.Record{{Payload: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("publish to the sealed stream: %v, want Unavailable", err)
	}
	if now, total, _ := h.followCalls("b1"); now != 2 || total != before {
		t.Fatalf("after the seal b1 serves %v calls, %v in all; want the same 2 calls (%v in all)", now, total, before)
	}
	for _, n := range []string{"b2", "b3"} {
		got, err := h.readAll(n, "goes-on")
		if err != nil || len(got) != 6 {
			t.Fatalf("%s holds %d records of goes-on (%v), want 6", n, len(got), err)
		}
	}
}

// A stream assigned while the calls run starts its follows on them, and
// one deleted stops its follows there; the stream that stays is not
// disturbed and no call is opened again.
func TestStreamAddedAndRemovedOnTheSharedCall(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	h.assign(everyCopy("stays", "b1"))
	h.publish("b1", "stays", "a")
	h.waitFollows("b1", 2, 2)
	_, before, _ := h.followCalls("b1")

	h.assign(everyCopy("added", "b1"))
	h.publish("b1", "added", "a", "b") // confirmed: both followers follow it
	h.waitFollows("b1", 2, 4)
	h.publish("b1", "stays", "b")

	if _, err := h.cli.Delete(context.Background(), h.schema.AssignmentKey("added")); err != nil {
		t.Fatal(err)
	}
	h.waitFollows("b1", 2, 2)
	h.publish("b1", "stays", "c")
	if _, total, _ := h.followCalls("b1"); total != before {
		t.Fatalf("b1 served %v Follow calls in all, want the %v it served before the stream came and went", total, before)
	}
	for _, n := range []string{"b1", "b2", "b3"} {
		got, err := h.readAll(n, "stays")
		if err != nil || len(got) != 3 {
			t.Fatalf("%s holds %d records of stays (%v), want 3", n, len(got), err)
		}
	}
}

// A follower that restarts resumes each stream at its own tails, on one
// call per owner: every stream ends up holding exactly the owner's
// records, at the owner's offsets.
func TestRestartedFollowerResumesEachStreamAtItsTails(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	const n = 6
	for i := range n {
		h.assign(threeCopies(fmt.Sprintf("r%d", i), cluster.Policy{Name: cluster.MajorityDurable}))
		for j := range i + 1 {
			h.publish("b1", fmt.Sprintf("r%d", i), fmt.Sprintf("before-%d", j))
		}
	}
	h.waitFollows("b1", 2, 2*n)
	h.stop("b3")
	// Each stream moves on by a different count while b3 is down.
	for i := range n {
		for j := range 2 * i {
			h.publish("b1", fmt.Sprintf("r%d", i), fmt.Sprintf("during-%d", j))
		}
	}
	h.start("b3")
	for i := range n {
		stream := fmt.Sprintf("r%d", i)
		owner, err := h.readAll("b1", stream)
		if err != nil {
			t.Fatal(err)
		}
		clustertest.Eventually(t, 15*time.Second, "b3 caught up on "+stream, func() error {
			got, err := h.readAll("b3", stream)
			if err != nil {
				return err
			}
			if len(got) != len(owner) {
				return fmt.Errorf("%d records, want %d", len(got), len(owner))
			}
			for k := range got {
				if got[k].GetOffset() != owner[k].GetOffset() || got[k].GetChain() != owner[k].GetChain() {
					return fmt.Errorf("offset %d differs from the owner's", k)
				}
			}
			return nil
		})
	}
	h.waitFollows("b1", 2, 2*n)
}

// The owner confirms a record on each stream only once W copies hold it
// durably, whatever the other streams on the same call do: with streams
// of W=3 and W=2 published at once, each confirmed offset is, right after
// its confirm, within the durable tails of at least W copies (a ledger
// of every confirm, checked against the copies' storage).
func TestConfirmedRecordsAreOnWCopiesPerStream(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	const streams, records = 8, 25
	w := map[string]int{}
	for i := range streams {
		name := fmt.Sprintf("w%d", i)
		a := threeCopies(name, cluster.Policy{Name: cluster.MajorityDurable})
		w[name] = 2
		if i%2 == 0 {
			a.Policy = cluster.Policy{Name: cluster.LocalDurable}
			w[name] = 3
		}
		h.assign(a)
		h.publish("b1", name, "first")
	}
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for name := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := h.streams("b1")
			for i := range records {
				resp, err := client.Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: name,
					Records: []*strandv1.Record{{Payload: fmt.Appendf(nil, "%s-%d", name, i)}}}))
				if err != nil {
					errs <- fmt.Errorf("%s: publish %d: %w", name, i, err)
					return
				}
				off := resp.Msg.GetOffsets()[0]
				holding := 0
				for _, node := range []string{"b1", "b2", "b3"} {
					if h.brokers[node].manager.Tails()[name].RecordTail > off {
						holding++
					}
				}
				if holding < w[name] {
					errs <- fmt.Errorf("%s: offset %d confirmed while %d copies held it durably, want %d", name, off, holding, w[name])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
