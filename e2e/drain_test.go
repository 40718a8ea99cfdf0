package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestDrainOwnerBroker drains the broker that owns a stream while clients
// publish to several 3-copy streams on a 4-broker cluster, then stops its
// container. The drain hands each stream it owns over to an in-sync follower
// and replaces each copy it holds with one on the 4th broker
// (docs/operating.md, "Draining a broker"; docs/protocol.md, "Handover"), so
// stopping the drained broker costs nothing: publishing goes on, every
// confirmed record is read back once at its offset (docs/protocol.md,
// "Invariants"), and no stream is under-replicated.
func TestDrainOwnerBroker(t *testing.T) {
	h := startCluster(t, 4)
	ctx := t.Context()
	streams := []string{"drain-a", "drain-b", "drain-c"}
	first := make(map[string]cluster.Assignment, len(streams))
	for _, s := range streams {
		first[s] = h.createStream(ctx, s, 3, cluster.MajorityDurable)
	}
	drained := first[streams[0]].Owner

	cl := h.client()
	ledgers := make(map[string]*ledger.Ledger, len(streams))
	pubs := make(map[string]*ledger.Publisher, len(streams))
	for i, s := range streams {
		ledgers[s] = ledger.New()
		pubs[s] = startPublishing(t, cl, s, fmt.Sprintf("d%d", i), 2, ledgers[s])
	}
	waitConfirmed := func(what string, want map[string]int) {
		t.Helper()
		clustertest.Eventually(t, 30*time.Second, what, func() (bool, string) {
			var short []string
			for _, s := range streams {
				if n := ledgers[s].Count(); n < want[s] {
					short = append(short, fmt.Sprintf("%s %d of %d (%s)", s, n, want[s], pubs[s].LastError()))
				}
			}
			return len(short) == 0, strings.Join(short, "; ")
		})
	}
	plus := func(n int) map[string]int {
		m := make(map[string]int, len(streams))
		for _, s := range streams {
			m[s] = ledgers[s].Count() + n
		}
		return m
	}
	waitConfirmed("100 confirmed records on every stream before the drain", plus(100))

	// The call `strandctl broker drain NODE` makes, then the condition its
	// --wait waits on: the broker holds no copy and nothing is
	// under-replicated.
	started := time.Now()
	res, err := h.admin.DrainBroker(ctx, connect.NewRequest(&strandv1.DrainBrokerRequest{Node: drained, Who: "e2e", Why: "TestDrainOwnerBroker"}))
	if err != nil {
		t.Fatalf("drain %s: %v", drained, err)
	}
	if b := res.Msg.GetBroker(); !b.GetDraining() {
		t.Fatalf("DrainBroker answered %s not draining: %+v", drained, b)
	}
	clustertest.Eventually(t, 60*time.Second, drained+" drained with nothing under-replicated", func() (bool, string) {
		b, err := h.brokerStatus(ctx, drained)
		if err != nil {
			return false, err.Error()
		}
		if !b.GetDrained() || b.GetCopies() != 0 {
			return false, fmt.Sprintf("%s: draining %t drained %t, %d copies, owns %d", drained, b.GetDraining(), b.GetDrained(), b.GetCopies(), b.GetOwned())
		}
		under, err := h.underReplicated(ctx)
		return err == nil && len(under) == 0, fmt.Sprintf("under-replicated %v (%v)", under, err)
	})
	t.Logf("%s drained in %s", drained, time.Since(started).Round(10*time.Millisecond))

	// etcd agrees: no assignment names the drained broker, and each stream
	// it owned moved to a new epoch with a new owner.
	for _, s := range streams {
		a, ok := h.assignment(ctx, s)
		if !ok {
			t.Fatalf("no assignment of %s", s)
		}
		if a.Owner == drained || slices.Contains(a.Followers, drained) {
			t.Errorf("%s still names %s after the drain: epoch %d owner %s followers %v", s, drained, a.Epoch, a.Owner, a.Followers)
		}
		if n := 1 + len(a.Followers); n != 3 {
			t.Errorf("%s has %d copies after the drain, want 3: owner %s followers %v", s, n, a.Owner, a.Followers)
		}
		if first[s].Owner == drained && a.Epoch <= first[s].Epoch {
			t.Errorf("%s was owned by %s and is still at epoch %d", s, drained, a.Epoch)
		}
		t.Logf("%s: epoch %d -> %d, owner %s -> %s, followers %v", s, first[s].Epoch, a.Epoch, first[s].Owner, a.Owner, a.Followers)
	}

	// Taking the drained broker away is now no fault at all.
	h.stop(drained)
	waitConfirmed("100 more confirmed records on every stream after the stop", plus(100))
	for _, p := range pubs {
		p.Stop()
	}

	for _, s := range streams {
		end := ledgers[s].End()
		recs := readAll(ctx, t, s+" at its owner", end, readThroughClient(cl, s))
		n := verifyLedger(t, ledgers[s], recs)
		t.Logf("%s: %d confirmed records verified at their offsets (%d publishes failed or were cut short)", s, n, ledgers[s].Failures())
	}
	// With the drained broker gone, every stream still has its 3 copies
	// live and in sync: once the replacements caught up, attention lists no
	// under_replicated entry.
	clustertest.Eventually(t, 20*time.Second, "no stream under-replicated with "+drained+" stopped", func() (bool, string) {
		under, err := h.underReplicated(ctx)
		return err == nil && len(under) == 0, fmt.Sprintf("under-replicated %v (%v)", under, err)
	})
}

// brokerStatus is one broker's entry in ListBrokers.
func (h *harness) brokerStatus(ctx context.Context, name string) (*strandv1.Broker, error) {
	res, err := h.admin.ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		return nil, err
	}
	for _, b := range res.Msg.GetBrokers() {
		if b.GetNode() == name {
			return b, nil
		}
	}
	return nil, fmt.Errorf("ListBrokers has no %s", name)
}

// underReplicated lists the streams attention calls under-replicated.
func (h *harness) underReplicated(ctx context.Context) ([]string, error) {
	res, err := h.admin.ListAttention(ctx, connect.NewRequest(&strandv1.ListAttentionRequest{}))
	if err != nil {
		return nil, err
	}
	var under []string
	for _, e := range res.Msg.GetEntries() {
		if e.GetKind() == "under_replicated" {
			under = append(under, e.GetStream())
		}
	}
	return under, nil
}

// stop stops a container the way an operator takes a host away (SIGTERM,
// then SIGKILL after 10s) and waits until Docker reports it stopped.
func (h *harness) stop(name string) {
	h.t.Helper()
	n := h.node(name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	timeout := 10 * time.Second
	if err := n.ctr.Stop(ctx, &timeout); err != nil {
		h.t.Fatalf("stop %s: %v", name, err)
	}
	if err := h.refresh(ctx, n); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("stopped %s", name)
}
