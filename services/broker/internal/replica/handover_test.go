package replica

import (
	"context"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A handover waits out the writes under way before it reads the owner's
// tails (docs/protocol.md, "Handover"), but only within its catch-up
// bound: a write stuck before storage (a stalled committer) must not hold
// the owner paused, and the handover call open, for as long as it is
// stuck. Here a writer holds the gate shared and never leaves while the
// handover runs; the handover gives up, the pause ends, and once the
// writer leaves a new handover can begin.
func TestHandoverDoesNotWaitOnAStuckWriterPastItsBound(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const stream = "stuck"
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Followers: []string{"b2"},
		Policy: cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}}) // W = 1: b1 confirms alone
	clustertest.Eventually(t, 10*time.Second, "b1 owns the stream and confirms a publish", func() bool {
		_, err := m.Publish(context.Background(), stream, []storage.Record{{Payload: []byte("r0")}})
		return err == nil
	})
	c := m.copy(stream)
	c.gate.RLock() // a write that passed its pause check and is stuck before storage

	type answer struct {
		res HandoverResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := m.Handover(context.Background(), stream, 1, "b2", 50*time.Millisecond, time.Second)
		done <- answer{res, err}
	}()
	var got answer
	select {
	case got = <-done:
	case <-time.After(10 * time.Second):
		c.gate.RUnlock()
		t.Fatal("the handover still waits on the stuck writer 10 s after its 50 ms catch-up bound")
	}
	if got.err != nil || got.res.CaughtUp || got.res.RecordTail != 1 {
		t.Fatalf("handover = %+v, %v; want not caught up at record tail 1 and no error (the owner resumes)", got.res, got.err)
	}
	c.mu.Lock()
	paused := c.pause != nil
	c.mu.Unlock()
	if paused {
		t.Fatal("the owner is still paused after the handover gave up")
	}

	c.gate.RUnlock() // the stuck write reaches storage
	res, err := m.Handover(context.Background(), stream, 1, "b2", 50*time.Millisecond, time.Second)
	if err != nil || res.CaughtUp {
		t.Fatalf("second handover = %+v, %v; want begun and not caught up (b2 follows nothing here)", res, err)
	}
}
