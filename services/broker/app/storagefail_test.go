package app

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

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
		c.StorageFault = injectedFault(&fault)
	}
	b := h.start("b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "before")

	fault.Store(true)
	h.publishUnconfirmed("b1", "s", "lost", "a publish whose write failed was confirmed")
	awaitStorageFailure(t, "b1", b, "storage failed", "injected")
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

// injectedFault fails every storage write with an input/output error once
// fault is set.
// publishUnconfirmed publishes payload to stream on node and fails the
// test with msg if it is confirmed.
func (h *harness) publishUnconfirmed(node, stream, payload, msg string) {
	h.t.Helper()
	_, err := h.streams(node).Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{
		Stream: stream, Records: []*strandv1.Record{{Payload: []byte(payload)}},
	}))
	if err == nil {
		h.t.Fatal(msg)
	}
}

// awaitStorageFailure waits for b (node) to stop on its failed store, with
// an error naming every one of want.
func awaitStorageFailure(t *testing.T, node string, b *App, want ...string) {
	t.Helper()
	select {
	case err := <-b.Err():
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s stopped with %v, want the storage failure", node, err)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not report its failed store within 10s", node)
	}
}

func injectedFault(fault *atomic.Bool) func() error {
	return func() error {
		if fault.Load() {
			return errors.New("injected: input/output error")
		}
		return nil
	}
}

// logSignal is a log writer that closes seen once a line holds every one
// of want.
type logSignal struct {
	want []string
	once sync.Once
	seen chan struct{}
}

func (l *logSignal) Write(p []byte) (int, error) {
	for _, w := range l.want {
		if !bytes.Contains(p, []byte(w)) {
			return len(p), nil
		}
	}
	l.once.Do(func() { close(l.seen) })
	return len(p), nil
}

// A follower whose store fails under a batch its follow call's receiver
// stored (the path every batch after a follow's first takes) ends that
// follow on its own storage's error: it does not name the owner suspect,
// which would have the controller probe a healthy owner and fail over
// streams that have nothing wrong with them. The broker stops, as for any
// storage failure.
func TestFollowerStorageFailureDoesNotBlameTheOwner(t *testing.T) {
	var fault atomic.Bool
	// The retry's log line names the error the follow ended with.
	retried := &logSignal{want: []string{"following the owner failed; retrying", "injected"}, seen: make(chan struct{})}
	h := newHarness(t)
	h.confirm = 500 * time.Millisecond
	h.configure = func(c *Config) {
		if c.Node != "b2" {
			return
		}
		c.StorageFault = injectedFault(&fault)
		l := zerolog.New(retried)
		c.Logger = &l
	}
	h.start("b1")
	b2 := h.start("b2")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1", Followers: []string{"b2"},
		Policy: cluster.Policy{Name: cluster.LocalDurable}})
	// Confirmed under local_durable: b2 stored and acknowledged them, the
	// later ones on its receiver's direct path.
	h.publish("b1", "s", "a")
	h.publish("b1", "s", "b", "c")

	fault.Store(true)
	h.publishUnconfirmed("b1", "s", "unconfirmed", "a publish the follower could not store was confirmed under local_durable")
	awaitStorageFailure(t, "b2", b2, "injected")
	// The follow ended on the failed store, and runFollower decided whom
	// to blame before it logged the retry (at most one such line per 5 s:
	// the retries go on until the broker is closed).
	select {
	case <-retried.seen:
	case <-time.After(20 * time.Second):
		t.Fatal("b2's follow did not end on its failed store within 20s")
	}
	if s := b2.manager.Tails()["s"].Suspect; s != "" {
		t.Fatalf("b2 names %q suspect after its own store failed", s)
	}
}
