package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestRecovererAndControllerKilledMidRecovery kills the owner while a
// follower is down, so fewer than R = 2 copies can answer the seal and the
// recovery stays pending; then SIGKILLs the recoverer and the controller in
// the middle of it. Once the follower and both services are back, the
// recovery completes exactly once: one new epoch, one new history start,
// and nothing confirmed is lost.
func TestRecovererAndControllerKilledMidRecovery(t *testing.T) {
	h := startCluster(t, 3)
	ctx := t.Context()
	const stream = "mid-recovery"
	a0 := h.createStream(ctx, stream, 3, cluster.MajorityDurable)
	hist0 := h.history(ctx, stream)

	cl := h.client()
	l := ledger.New()
	pub := startPublishing(t, cl, stream, "m", 4, l)
	clustertest.Eventually(t, 30*time.Second, "200 confirmed records", func() (bool, string) {
		return l.Count() >= 200, pub.LastError()
	})
	pub.Stop()

	// Every write to the assignment from here on, to count the epochs
	// committed.
	rev := h.revision(ctx)
	puts := h.watchPuts(ctx, h.schema.AssignmentKey(stream), rev+1)

	owner, down := a0.Owner, a0.Followers[0]
	h.kill(down)
	clustertest.Eventually(t, 20*time.Second, down+"'s lease to end", func() (bool, string) {
		ok, err := h.registered(ctx, down)
		return err == nil && !ok, fmt.Sprint(err)
	})
	h.kill(owner)
	var rec cluster.Recovery
	clustertest.Eventually(t, 20*time.Second, "a pending recovery of "+stream, func() (bool, string) {
		var ok bool
		rec, ok = h.recovery(ctx, stream)
		return ok, "none yet"
	})
	t.Logf("pending recovery: from epoch %d, fence %d, proposed owner %s, transition %s", rec.FromEpoch, rec.FenceEpoch, rec.ProposedOwner, rec.TransitionID)
	// The recoverer has tried: only one copy answers, fewer than R, so it
	// waits, and the controller lists the wait under attention.
	clustertest.Eventually(t, 20*time.Second, "the recovery waiting for copies under attention", func() (bool, string) {
		res, err := h.admin.ListAttention(ctx, connect.NewRequest(&strandv1.ListAttentionRequest{}))
		if err != nil {
			return false, err.Error()
		}
		var kinds []string
		for _, e := range res.Msg.GetEntries() {
			if e.GetStream() == stream && e.GetKind() == "recovery_waiting_copies" {
				return true, ""
			}
			kinds = append(kinds, e.GetStream()+":"+e.GetKind())
		}
		return false, fmt.Sprint(kinds)
	})

	h.kill("recoverer")
	h.kill("controller")
	if a, _ := h.assignment(ctx, stream); a.Epoch != a0.Epoch {
		t.Fatalf("the assignment moved to epoch %d while fewer than R copies could answer", a.Epoch)
	}
	if r, ok := h.recovery(ctx, stream); !ok || r.TransitionID != rec.TransitionID {
		t.Fatalf("the pending recovery changed while the services were down: %+v (present %t)", r, ok)
	}

	// The follower comes back first, then both services, in parallel.
	h.restart(down)
	var wg sync.WaitGroup
	for _, name := range []string{"controller", "recoverer"} {
		wg.Go(func() { h.restart(name) })
	}
	wg.Wait()
	recovered := time.Now()

	a1 := h.waitNewOwner(ctx, stream, a0.Epoch, owner, 60*time.Second)
	t.Logf("recovered: epoch %d -> %d, owner %s -> %s, %s after the restarts", a0.Epoch, a1.Epoch, owner, a1.Owner,
		time.Since(recovered).Round(10*time.Millisecond))
	if a1.Epoch != a0.Epoch+1 {
		t.Errorf("epoch after the recovery is %d, want %d", a1.Epoch, a0.Epoch+1)
	}
	hist1 := h.history(ctx, stream)
	if len(hist1) != len(hist0)+1 {
		t.Errorf("history after one recovery has %d starts, want %d: %+v", len(hist1), len(hist0)+1, hist1)
	}
	if s, _ := hist1.Latest(); s.Epoch != a1.Epoch || s.Node != a1.Owner {
		t.Errorf("latest history start %+v, want epoch %d at %s", s, a1.Epoch, a1.Owner)
	}

	// The stream serves again; then the old owner rejoins without another
	// recovery.
	pub = startPublishing(t, cl, stream, "n", 4, l)
	clustertest.Eventually(t, 30*time.Second, "publishes confirm at the new epoch", func() (bool, string) {
		return l.AtEpoch(a1.Epoch) >= 100, pub.LastError()
	})
	pub.Stop()
	h.restart(owner)
	h.waitRejoined(ctx, stream, owner, a1.Epoch, 60*time.Second)

	if hist2 := h.history(ctx, stream); len(hist2) != len(hist1) {
		t.Errorf("history changed after the recovery: %+v, was %+v", hist2, hist1)
	}
	if r, pending := h.recovery(ctx, stream); pending {
		t.Errorf("a recovery is pending at the end: %+v", r)
	}
	epochs := map[uint64]int{}
	for _, a := range puts.stop(t, h.modRevision(ctx, h.schema.AssignmentKey(stream))) {
		epochs[a.Epoch]++
	}
	delete(epochs, a0.Epoch)
	if len(epochs) != 1 || epochs[a1.Epoch] == 0 {
		t.Errorf("assignment writes after the owner kill reached epochs %v, want only %d", epochs, a1.Epoch)
	}

	end := l.End()
	recs := readAll(ctx, t, "the stream at its owner", end, readThroughClient(cl, stream))
	n := verifyLedger(t, l, recs)
	t.Logf("%d confirmed records verified at their offsets", n)
}

// revision is etcd's current revision.
func (h *harness) revision(ctx context.Context) int64 {
	h.t.Helper()
	res, err := h.etcd.Get(ctx, h.schema.Prefix()+"/")
	if err != nil {
		h.t.Fatalf("etcd: %v", err)
	}
	return res.Header.Revision
}

// registered reports whether a broker's lease-bound registration exists.
func (h *harness) registered(ctx context.Context, node string) (bool, error) {
	res, err := h.etcd.Get(ctx, h.schema.BrokerKey(node))
	if err != nil {
		return false, err
	}
	return len(res.Kvs) > 0, nil
}

// modRevision is the revision of the last write to key.
func (h *harness) modRevision(ctx context.Context, key string) int64 {
	h.t.Helper()
	res, err := h.etcd.Get(ctx, key)
	if err != nil {
		h.t.Fatalf("etcd: %v", err)
	}
	if len(res.Kvs) == 0 {
		return 0
	}
	return res.Kvs[0].ModRevision
}

// putWatch collects every value written to one key.
type putWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	seen   []cluster.Assignment
	rev    int64 // revision of the last event seen
}

func (h *harness) watchPuts(ctx context.Context, key string, fromRev int64) *putWatch {
	wctx, cancel := context.WithCancel(ctx)
	w := &putWatch{cancel: cancel, done: make(chan struct{})}
	ch := h.etcd.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(fromRev))
	go func() {
		defer close(w.done)
		for res := range ch {
			for _, ev := range res.Events {
				w.mu.Lock()
				w.rev = ev.Kv.ModRevision
				if ev.Type == clientv3.EventTypePut {
					if a, err := cluster.Decode[cluster.Assignment](ev.Kv.Value); err == nil {
						w.seen = append(w.seen, a)
					}
				}
				w.mu.Unlock()
			}
		}
	}()
	h.t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// stop waits until the watch has delivered the write at rev, ends it and
// returns every value it saw.
func (w *putWatch) stop(t *testing.T, rev int64) []cluster.Assignment {
	t.Helper()
	clustertest.Eventually(t, 10*time.Second, "the assignment watch to catch up", func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.rev >= rev, fmt.Sprintf("at revision %d of %d", w.rev, rev)
	})
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}
