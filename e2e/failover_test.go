package e2e

import (
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestOwnerKillFailover is the cluster failover test: kill the owner of a
// replicated durable stream with 3 copies on majority_durable under load.
// Every confirmed record is delivered at one offset each, the stream serves
// again without an operator, and the old owner rejoins as a follower without
// another recovery.
func TestOwnerKillFailover(t *testing.T) {
	h := startCluster(t, 3)
	ctx := t.Context()
	const stream = "kill-owner"
	a0 := h.createStream(ctx, stream, 3, cluster.MajorityDurable)
	hist0 := h.history(ctx, stream)

	cl := h.client()
	l := ledger.New()
	pub := startPublishing(t, cl, stream, "k", 4, l)
	clustertest.Eventually(t, 30*time.Second, "200 confirmed records before the kill", func() (bool, string) {
		return l.Count() >= 200, pub.LastError()
	})

	owner := a0.Owner
	killed := time.Now()
	h.kill(owner)

	// No operator: the controller, the recoverer and the brokers move the
	// stream on their own.
	a1 := h.waitNewOwner(ctx, stream, a0.Epoch, owner, 30*time.Second)
	t.Logf("failover: epoch %d -> %d, owner %s -> %s, %s after the kill",
		a0.Epoch, a1.Epoch, owner, a1.Owner, time.Since(killed).Round(10*time.Millisecond))
	if a1.Epoch != a0.Epoch+1 {
		t.Errorf("epoch after one failover is %d, want %d", a1.Epoch, a0.Epoch+1)
	}
	clustertest.Eventually(t, 30*time.Second, "publishes confirm at the new epoch", func() (bool, string) {
		return l.AtEpoch(a1.Epoch) >= 100, pub.LastError()
	})
	if first := l.FirstAt(a1.Epoch); !first.IsZero() {
		t.Logf("unavailable: kill -> first confirm at epoch %d took %s", a1.Epoch, first.Sub(killed).Round(10*time.Millisecond))
	}
	pub.Stop()

	hist1 := h.history(ctx, stream)
	if len(hist1) != len(hist0)+1 {
		t.Fatalf("history after the failover has %d starts, want %d: %+v", len(hist1), len(hist0)+1, hist1)
	}
	if s, _ := hist1.Latest(); s.Epoch != a1.Epoch || s.Node != a1.Owner {
		t.Errorf("latest history start %+v, want epoch %d at %s", s, a1.Epoch, a1.Owner)
	}

	// The killed broker comes back with its data and follows, with no
	// further recovery: same epoch, same history.
	h.restart(owner)
	h.waitRejoined(ctx, stream, owner, a1.Epoch, 60*time.Second)
	a2, _ := h.assignment(ctx, stream)
	if a2.Epoch != a1.Epoch || a2.Owner != a1.Owner {
		t.Errorf("assignment after the rejoin is epoch %d owner %s, want epoch %d owner %s", a2.Epoch, a2.Owner, a1.Epoch, a1.Owner)
	}
	if hist2 := h.history(ctx, stream); len(hist2) != len(hist1) {
		t.Errorf("the rejoin changed the history: %+v, was %+v", hist2, hist1)
	}
	if r, pending := h.recovery(ctx, stream); pending {
		t.Errorf("a recovery is pending after the rejoin: %+v", r)
	}

	end := l.End()
	recs := readAll(ctx, t, "the stream at its owner", end, readThroughClient(cl, stream))
	n := verifyLedger(t, l, recs)
	rejoined := readAll(ctx, t, "the rejoined copy at "+owner, end, readFromCopy(h.broker(owner), stream))
	sameRecords(t, a1.Owner, recs, owner, rejoined)
	t.Logf("%d confirmed records verified at their offsets (%d publishes failed or were cut short)", n, l.Failures())

	// The image serves the new owner's metrics, which saw its confirms
	// and its fsyncs.
	for _, metric := range []string{"strand_broker_publish_confirm_seconds", "strand_broker_commit_sync_seconds"} {
		if c, err := h.sampleCount(ctx, a1.Owner, metric); err != nil || c == 0 {
			t.Errorf("new owner %s: %s has %d samples (%v), want its confirms counted", a1.Owner, metric, c, err)
		}
	}
}
