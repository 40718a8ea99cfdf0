package app

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// orphanHarness runs b1 and b2 with a short orphan grace, b2 following
// stream s, which holds three records on both.
func orphanHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	h.configure = func(c *Config) { c.OrphanGrace = 300 * time.Millisecond }
	h.start("b1")
	h.start("b2")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1", Followers: []string{"b2"}, Incarnation: "i1"})
	h.publish("b1", "s", "r0", "r1", "r2")
	clustertest.Eventually(t, 20*time.Second, "b2 holds the three records", func() error {
		tails, err := h.heartbeat("b2", "s")
		if err != nil {
			return err
		}
		if tails.RecordTail != 3 {
			return fmt.Errorf("b2 at record tail %d", tails.RecordTail)
		}
		return nil
	})
	return h
}

// onDisk reports whether node's store holds a copy of stream.
func (h *harness) onDisk(node, stream string) bool {
	h.t.Helper()
	names, err := h.brokers[node].db.Streams()
	if err != nil {
		h.t.Fatalf("%s: streams: %v", node, err)
	}
	return slices.Contains(names, stream)
}

// leaveOut writes s's next assignment without b2, as a committed recovery
// that replaced it would.
func (h *harness) leaveOutB2() {
	h.assign(cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Incarnation: "i1"})
}

func TestOrphanCopyDeleted(t *testing.T) {
	h := orphanHarness(t)
	if !h.onDisk("b2", "s") {
		t.Fatal("b2 holds no copy of s before the change")
	}
	h.leaveOutB2()
	// The store lists a copy no more once its drop has begun; the counts
	// follow when it is done.
	clustertest.Eventually(t, 20*time.Second, "b2's orphan copy of s deleted", func() bool {
		return !h.onDisk("b2", "s") && h.brokers["b2"].manager.OrphanStats().Deleted > 0
	})
	stats := h.brokers["b2"].manager.OrphanStats()
	if stats.Deleted != 1 || stats.Bytes <= 0 {
		t.Fatalf("orphan stats %+v, want one copy deleted with its bytes", stats)
	}
	fams := h.scrape("b2")
	if got := counterValue(fams, "strand_broker_orphan_copies_deleted_total"); got != 1 {
		t.Fatalf("orphan_copies_deleted_total = %v, want 1", got)
	}
	if got := counterValue(fams, "strand_broker_orphan_bytes_reclaimed_total"); got != float64(stats.Bytes) {
		t.Fatalf("orphan_bytes_reclaimed_total = %v, want %d", got, stats.Bytes)
	}
	// The heartbeat no longer reports the copy, and the stream goes on
	// at b1, which the assignment includes.
	clustertest.Eventually(t, 20*time.Second, "s gone from b2's heartbeat", func() bool {
		_, err := h.heartbeat("b2", "s")
		return err != nil
	})
	recs, err := h.readAll("b1", "s")
	if err != nil || len(recs) != 3 {
		t.Fatalf("b1 read %d records, %v; want 3", len(recs), err)
	}
	if !h.onDisk("b1", "s") {
		t.Fatal("b1's copy of s is gone")
	}

	// Included again, b2 takes an empty copy and catches up, as any new
	// follower does.
	h.assign(cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Followers: []string{"b2"}, Incarnation: "i1"})
	clustertest.Eventually(t, 20*time.Second, "b2 follows s again", func() error {
		tails, err := h.heartbeat("b2", "s")
		if err != nil {
			return err
		}
		if tails.RecordTail != 3 || tails.Epoch != 2 {
			return fmt.Errorf("b2 at %+v", tails)
		}
		return nil
	})
}

func TestOrphanCopyKeptWhileRecoveryNamesIt(t *testing.T) {
	h := orphanHarness(t)
	ctx := context.Background()
	// A pending recovery whose old members include b2: it may still seal
	// b2's copy, whose records may be needed.
	rec := cluster.Recovery{Stream: "s", FromEpoch: 2, FenceEpoch: 3, TransitionID: "t1", OldOwner: "b1", OldFollowers: []string{"b2"},
		ProposedOwner: "b2", Created: time.Now().UTC()}
	if _, err := h.cli.Put(ctx, h.schema.RecoveryKey("s"), cluster.Encode(rec)); err != nil {
		t.Fatal(err)
	}
	h.leaveOutB2()
	clustertest.Eventually(t, 20*time.Second, "an orphan check past the grace held b2's copy", func() bool {
		return h.brokers["b2"].manager.OrphanStats().Held >= 2
	})
	if !h.onDisk("b2", "s") || h.brokers["b2"].manager.OrphanStats().Deleted != 0 {
		t.Fatal("b2's copy of s deleted while a pending recovery names b2")
	}
	if _, err := h.heartbeat("b2", "s"); err != nil {
		t.Fatalf("b2 stopped reporting its copy: %v", err)
	}
	// With the recovery gone (withdrawn), the copy is an orphan.
	if _, err := h.cli.Delete(ctx, h.schema.RecoveryKey("s")); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 20*time.Second, "b2's orphan copy of s deleted", func() bool { return !h.onDisk("b2", "s") })
}
