package replica

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// sentResponses is the owner's side of a Follow call that records what is
// sent and receives nothing.
type sentResponses chan *strandv1.FollowResponse

func (s sentResponses) Receive() (*strandv1.FollowRequest, error) { select {} }

func (s sentResponses) Send(r *strandv1.FollowResponse) error {
	s <- r
	return nil
}

// A follow that always has a batch ready does not starve another on the
// same call: each follow has one batch waiting at most, and a follow whose
// batch was taken queues its next behind the others. Here every busy batch
// fills a response, so a quiet follow's batch goes out within two
// responses of being queued, however long the busy one keeps sending.
func TestBusyFollowDoesNotStarveTheOthers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := &followServer{ctx: ctx, follows: map[uint64]*servedFollow{}, wake: make(chan struct{}, 1)}
	busy := &servedFollow{id: 1, taken: make(chan struct{}, 1)}
	quiet := &servedFollow{id: 2, taken: make(chan struct{}, 1)}
	full := make([]byte, followResponseBytes)
	go func() {
		for ctx.Err() == nil {
			_ = srv.put(ctx, busy, &strandv1.FollowBatch{Id: busy.id, RecordSegment: full})
		}
	}()
	sent := make(sentResponses)
	go func() { _ = srv.sendLoop(sent) }()
	next := func() *strandv1.FollowResponse {
		t.Helper()
		select {
		case r := <-sent:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no response sent")
			return nil
		}
	}
	for range 5 {
		if r := next(); len(r.GetBatches()) != 1 || r.GetBatches()[0].GetId() != busy.id {
			t.Fatalf("a response of the busy follow alone holds %v", r.GetBatches())
		}
	}
	quietSent := make(chan error, 1)
	var taken atomic.Bool
	go func() {
		err := srv.put(ctx, quiet, &strandv1.FollowBatch{Id: quiet.id})
		taken.Store(true)
		quietSent <- err
	}()
	clustertest.Eventually(t, 10*time.Second, "the quiet batch queued", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if taken.Load() {
			return true // taken already: it is in the response in hand
		}
		for _, fr := range srv.ready {
			if fr.f == quiet {
				return true
			}
		}
		return false
	})
	// The sender may hold a response of the busy follow, and the busy
	// follow's next batch may be queued before the quiet one: two at most.
	for i := 0; ; i++ {
		r := next()
		got := false
		for _, b := range r.GetBatches() {
			got = got || b.GetId() == quiet.id
		}
		if got {
			break
		}
		if i >= 2 {
			t.Fatalf("the quiet follow's batch waited %d responses of the busy one", i+1)
		}
	}
	if err := <-quietSent; err != nil {
		t.Fatal(err)
	}
}

// A moving confirm watermark reaches a follow through the call's sender
// (noteWatermark), never ahead of the follow's first batch, which alone
// carries the head a follower below the owner's starts at; after it, each
// new watermark goes once, and a follow that ended gets none.
func TestWatermarkFollowsTheFirstBatchOnTheCall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := &followServer{ctx: ctx, follows: map[uint64]*servedFollow{}, wake: make(chan struct{}, 1)}
	a := &servedFollow{id: 1, srv: srv, epoch: 4, taken: make(chan struct{}, 1)}
	b := &servedFollow{id: 2, srv: srv, epoch: 4, taken: make(chan struct{}, 1)}
	srv.follows[a.id], srv.follows[b.id] = a, b
	type sent struct{ id, wm, head uint64 }
	take := func() []sent {
		t.Helper()
		r := srv.take()
		if r == nil {
			return nil
		}
		var out []sent
		for _, x := range r.GetBatches() {
			if x.GetEpoch() != 4 {
				t.Fatalf("batch of follow %d at epoch %d, the follow's is 4", x.GetId(), x.GetEpoch())
			}
			out = append(out, sent{x.GetId(), x.GetConfirmWatermark(), x.GetHead()})
		}
		return out
	}
	a.noteWatermark(5)
	if got := take(); got != nil {
		t.Fatalf("a watermark went before the follow's first batch: %v", got)
	}
	// The first batch, built at watermark 3 with the head, then the 5 told
	// before it was taken, in the same response.
	srv.queue(readyFrame{batch: &strandv1.FollowBatch{Id: a.id, Epoch: 4, ConfirmWatermark: 3, Head: 10}, f: a})
	if got := take(); len(got) != 2 || got[0] != (sent{1, 3, 10}) || got[1] != (sent{1, 5, 0}) {
		t.Fatalf("first batch and watermark: %v", got)
	}
	a.noteWatermark(5)
	if got := take(); got != nil {
		t.Fatalf("a watermark sent already went again: %v", got)
	}
	// A batch of records carrying the newest watermark leaves nothing to
	// send after it.
	a.noteWatermark(7)
	srv.queue(readyFrame{batch: &strandv1.FollowBatch{Id: a.id, Epoch: 4, ConfirmWatermark: 7}, f: a})
	if got := take(); len(got) != 1 || got[0] != (sent{1, 7, 0}) {
		t.Fatalf("batch at the newest watermark: %v", got)
	}
	srv.queue(readyFrame{batch: &strandv1.FollowBatch{Id: b.id, Epoch: 4, ConfirmWatermark: 7}, f: b})
	if got := take(); len(got) != 1 || got[0] != (sent{2, 7, 0}) {
		t.Fatalf("b's first batch: %v", got)
	}
	// Both move; a ends before the sender looks: only b's goes.
	a.noteWatermark(9)
	b.noteWatermark(9)
	srv.mu.Lock()
	delete(srv.follows, a.id)
	srv.mu.Unlock()
	if got := take(); len(got) != 1 || got[0] != (sent{2, 9, 0}) {
		t.Fatalf("watermarks after a ended: %v", got)
	}
}

// A follow at an epoch the owner's copy has not applied yet waits for the
// copy to apply it (followApplyWait), rather than being refused: a
// recovery's commit reaches the new owner and its followers in no order.
// It waits only so long, and the caller then judges the copy as it finds
// it.
func TestFollowAtAnEpochNotAppliedYetWaitsForIt(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const stream = "next"
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1"})
	waitOwnerRole(t, m, stream, "the owner at epoch 1")
	c := m.copy(stream)
	ctx := context.Background()

	// Bounded: epoch 2 never comes within the wait.
	if err := c.awaitApplied(ctx, 2, 0); err != nil {
		t.Fatalf("a wait that ran out: %v, want nil (the caller judges the role)", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.awaitApplied(cctx, 2, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait whose call ended: %v, want context.Canceled", err)
	}

	appliedAtReturn := make(chan uint64, 1)
	go func() {
		if err := c.awaitApplied(ctx, 2, time.Minute); err != nil {
			t.Error(err)
		}
		c.mu.Lock()
		appliedAtReturn <- c.applied.Epoch
		c.mu.Unlock()
	}()
	// Epoch 2 is applied only once the waiter is parked in its wait, so
	// the wait itself is what the assignment must end (not a check that
	// found epoch 2 already there).
	clustertest.WaitParked(t, "select", "replica.(*Copy).awaitApplied")
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b1"})
	select {
	case got := <-appliedAtReturn:
		if got < 2 {
			t.Fatalf("the wait returned with epoch %d applied, want 2", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end once epoch 2 was applied")
	}
}
