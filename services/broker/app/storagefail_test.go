package app

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
)

// A broker whose store fails stops, as etcd does on a failed fsync: the
// store refuses every later write until it is opened again, so the broker
// reports it on Err, and Run closes it, which revokes its lease and lets
// the streams it owns fail over at once instead of answering Unavailable
// until an operator restarts it.
func TestStorageFailureStopsTheBroker(t *testing.T) {
	var fault atomic.Bool
	h := newHarness(t)
	h.configure = func(c *Config) {
		c.StorageFault = func() error {
			if fault.Load() {
				return errors.New("injected: input/output error")
			}
			return nil
		}
	}
	b := h.start("b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "before")

	fault.Store(true)
	_, err := h.streams("b1").Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{
		Stream: "s", Records: []*strandv1.Record{{Payload: []byte("lost")}},
	}))
	if err == nil {
		t.Fatal("a publish whose write failed was confirmed")
	}
	select {
	case err := <-b.Err():
		if !strings.Contains(err.Error(), "storage failed") || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("the broker stopped with %v, want the storage failure", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the broker did not report its failed store within 10s")
	}
	// What Run does next: close, which revokes the lease.
	h.stop("b1")
	resp, err := h.cli.Get(context.Background(), h.schema.BrokerKey("b1"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatal("the stopped broker is still registered: its streams would not fail over until its lease expired")
	}
}
