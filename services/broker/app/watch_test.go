package app

import (
	"context"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

// A broken etcd watch is not a lost lease. The broker's watches break when
// its connection to etcd does and, once it is back, resume from a revision
// that was compacted meanwhile (or etcd is briefly without a leader). The
// broker lists and watches again in the same session: closing the session
// revoked its lease, and every stream it owned failed over although the
// broker never stopped.
func TestBrokenWatchKeepsTheLease(t *testing.T) {
	h := newHarness(t)
	fwd := h.etcd.Forward(t)
	h.configure = func(c *Config) {
		c.Etcd = []string{"http://" + fwd.Addr()}
		// Room for the etcd client's reconnect backoff: the lease must
		// outlive the cut, so only the watch can break.
		c.LeaseTTL = 15 * time.Second
	}
	h.start("b1")
	ctx := context.Background()
	lease := func() int64 {
		t.Helper()
		resp, err := h.cli.Get(ctx, h.schema.BrokerKey("b1"))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("broker key: %v, %d keys", err, len(resp.Kvs))
		}
		return resp.Kvs[0].Lease
	}
	before := lease()

	fwd.Cut()
	// Written while the broker is cut off, then compacted away: its
	// watches cannot resume where they stopped.
	h.assign(cluster.Assignment{Stream: "during", Epoch: 1, Owner: "b1"})
	resp, err := h.cli.Put(ctx, "/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	fwd.Resume()

	// The broker learns what it missed by listing again...
	h.publish("b1", "during", "after the cut")
	// ...and kept its lease throughout.
	if after := lease(); after != before {
		t.Fatalf("the broker registered again with lease %x (was %x): a broken watch gave up its lease, failing over its streams", after, before)
	}
}
