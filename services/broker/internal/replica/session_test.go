package replica

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// setWatermark lends the session a sink that only applies watermark-only
// batches (the follow of a test that stores nothing).
func (sub *followSub) setWatermark(fn func(epoch, wm uint64) bool) {
	if fn == nil {
		sub.setSink(nil)
		return
	}
	sub.setSink(&followSink{watermark: fn})
}

// One response of the owner mixes follows: the receiver applies a
// watermark-only batch itself for a follow that took its first batch and
// has nothing queued, hands it to the follow's goroutine when the follow
// has batches queued (never ahead of them) or has not applied its first
// batch, and when the follow refuses it (another epoch: its goroutine
// ends the follow), while the other follows' batches in the response go
// on; a follow stopped here since gets nothing.
func TestReceiverAppliesWatermarkOnlyBatchesPerFollow(t *testing.T) {
	s := &followSession{subs: map[uint64]*followSub{}, done: make(chan struct{})}
	applied := map[uint64][]uint64{}
	sub := func(id uint64, direct bool) *followSub {
		x := &followSub{id: id, notify: make(chan struct{}, 1)}
		if direct {
			x.setWatermark(func(epoch, wm uint64) bool {
				if epoch != 2 {
					return false
				}
				applied[id] = append(applied[id], wm)
				return true
			})
		}
		s.subs[id] = x
		return x
	}
	idle, queued, fresh, refused, stopped := sub(1, true), sub(2, true), sub(3, false), sub(4, true), sub(5, true)
	queued.push(&strandv1.FollowBatch{Id: 2, Epoch: 2, RecordSegment: []byte{1}})
	delete(s.subs, stopped.id)

	wm := func(id, epoch, wm uint64) *strandv1.FollowBatch {
		return &strandv1.FollowBatch{Id: id, Epoch: epoch, ConfirmWatermark: wm}
	}
	s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{
		wm(1, 2, 10), wm(2, 2, 11), wm(3, 2, 12), wm(4, 3, 13), wm(5, 2, 14),
		{Id: 1, Epoch: 2, RecordSegment: []byte{1}, ConfirmWatermark: 15}, wm(1, 2, 16),
	}})

	inbox := func(x *followSub) []uint64 {
		x.mu.Lock()
		defer x.mu.Unlock()
		var out []uint64
		for _, b := range x.inbox {
			out = append(out, b.GetConfirmWatermark())
		}
		return out
	}
	if got := applied[1]; len(got) != 1 || got[0] != 10 {
		t.Fatalf("idle follow: receiver applied %v, want [10]", got)
	}
	// 16 came after a batch of records still queued: it waits behind it.
	if got := inbox(idle); len(got) != 2 || got[0] != 15 || got[1] != 16 {
		t.Fatalf("idle follow's inbox %v, want [15 16]", got)
	}
	if got := inbox(queued); len(got) != 2 || got[1] != 11 || len(applied[2]) != 0 {
		t.Fatalf("follow with a queued batch: inbox %v, applied %v; want the watermark queued behind it", got, applied[2])
	}
	if got := inbox(fresh); len(got) != 1 || got[0] != 12 {
		t.Fatalf("follow before its first batch: inbox %v, want [12]", got)
	}
	if got := inbox(refused); len(got) != 1 || got[0] != 13 || len(applied[4]) != 0 {
		t.Fatalf("follow of another epoch: inbox %v, applied %v; want it queued for the follow to refuse", got, applied[4])
	}
	if got := inbox(stopped); len(got) != 0 || len(applied[5]) != 0 {
		t.Fatalf("stopped follow got %v, applied %v", got, applied[5])
	}
	// Once the follow cleared it (it returned), nothing is applied here.
	idle.setWatermark(nil)
	idle.mu.Lock()
	idle.inbox = nil
	idle.mu.Unlock()
	s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{wm(1, 2, 20)}})
	if got := applied[1]; len(got) != 1 {
		t.Fatalf("a watermark was applied after the follow ended: %v", got)
	}
}

// directHarness is a follower's session with no call behind it: real
// Badger in a temp dir, copies at epoch 1 whose follows lent the session
// their sinks (followOnce does once its first batch is applied), and the
// session's acker running. Responses are handed to deliver as the
// receiver would.
type directHarness struct {
	t   *testing.T
	m   *Manager
	db  *storage.DB
	s   *followSession
	ctx context.Context
}

func newDirectHarness(t *testing.T, fault func() error) *directHarness {
	t.Helper()
	db, err := storage.Open(storage.Options{Dir: t.TempDir(), Logger: zerolog.Nop(), WriteFault: fault})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(Config{Node: "b2", Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: time.Second,
		History: func(context.Context, string) (cluster.HistoryStarts, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &followSession{m: m, ctx: ctx, cancel: cancel, done: make(chan struct{}), subs: map[uint64]*followSub{},
		acks: map[uint64]*strandv1.FollowAck{}, wake: make(chan struct{}, 1), storedWake: make(chan struct{}, 1)}
	acker := make(chan struct{})
	go func() {
		defer close(acker)
		s.ackStored()
	}()
	t.Cleanup(func() {
		cancel()
		<-acker
		m.Close()
		_ = db.Close()
	})
	return &directHarness{t: t, m: m, db: db, s: s, ctx: ctx}
}

// follow opens a copy of stream at epoch 1 and starts its follow on the
// session with id, its sink lent.
func (h *directHarness) follow(id uint64, stream string) (*Copy, *followSub) {
	h.t.Helper()
	st, err := h.db.Open(stream)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := st.AdvanceEpoch(h.ctx, 1); err != nil {
		h.t.Fatal(err)
	}
	c := newCopy(h.m, stream, st)
	sub := &followSub{id: id, notify: make(chan struct{}, 1)}
	var queued atomic.Bool
	sub.setSink(c.followSink(h.ctx, 1, func(uint64) {}, &queued))
	h.s.mu.Lock()
	h.s.subs[id] = sub
	h.s.mu.Unlock()
	return c, sub
}

// batch is the owner's batch of n records of epoch 1 from offset from of
// a log whose chain there is chain; bad breaks the last record's chain.
func batch(id, from, chain uint64, n int, bad bool) *strandv1.FollowBatch {
	recs := make([]storage.Record, n)
	for i := range recs {
		recs[i] = storage.Record{Offset: from + uint64(i), Epoch: 1, Payload: fmt.Appendf(nil, "r%d", from+uint64(i))}
		recs[i].Chain = storage.Chain(chain, &recs[i])
		chain = recs[i].Chain
	}
	if bad {
		recs[n-1].Chain ^= 1
	}
	return &strandv1.FollowBatch{Id: id, Epoch: 1, RecordSegment: storage.EncodeSegment(recs)}
}

func (h *directHarness) acked(id uint64) (uint64, bool) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	a, ok := h.s.acks[id]
	return a.GetRecordTail(), ok
}

func subErr(sub *followSub) error {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.err
}

// One response carries batches of several streams: the receiver stores
// every one of them itself, and the session's acker acknowledges each
// follow's durable tail once they are synced. A batch storage refuses (a
// chain that does not follow) ends its follow alone, with a chain
// mismatch, and nothing of it is stored or acknowledged, nor a later
// batch of it in the same response; a follow whose goroutine holds a
// batch gets its next one queued behind, never stored ahead of it.
func TestReceiverStoresTheStreamsOfAResponseAndAcksThemAtOnce(t *testing.T) {
	h := newDirectHarness(t, nil)
	a, subA := h.follow(1, "a")
	b, subB := h.follow(2, "b")
	bad, subBad := h.follow(3, "bad")
	_, subBusy := h.follow(4, "busy")
	subBusy.mu.Lock()
	subBusy.working = true
	subBusy.mu.Unlock()

	h.s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{
		batch(1, 0, 0, 3, false),
		batch(3, 0, 0, 2, true),
		batch(2, 0, 0, 1, false),
		batch(4, 0, 0, 1, false),
		batch(3, 2, 0, 1, false),
	}})
	clustertest.Eventually(t, 10*time.Second, "a and b acknowledged at their tails", func() bool {
		ta, okA := h.acked(1)
		tb, okB := h.acked(2)
		return okA && okB && ta == 3 && tb == 1
	})
	for _, c := range []*Copy{a, b} {
		if ts := c.st.Tails(); ts.Record != uint64(map[string]int{"a": 3, "b": 1}[c.name]) {
			t.Fatalf("%s durable at %d", c.name, ts.Record)
		}
	}
	if err := subErr(subBad); !errors.Is(err, ErrChainMismatch) {
		t.Fatalf("the refused follow ended with %v, want a chain mismatch", err)
	}
	if _, ok := h.acked(3); ok || bad.st.Tails().Record != 0 || bad.st.Tails().Written != 0 {
		t.Fatalf("the refused stream was stored (%+v) or acknowledged", bad.st.Tails())
	}
	subBad.mu.Lock()
	inbox := len(subBad.inbox)
	subBad.mu.Unlock()
	if inbox != 0 {
		t.Fatalf("the refused follow queued %d later batches", inbox)
	}
	for _, sub := range []*followSub{subA, subB} {
		if err := subErr(sub); err != nil {
			t.Fatalf("follow %d ended: %v", sub.id, err)
		}
	}
	subBusy.mu.Lock()
	inbox = len(subBusy.inbox)
	subBusy.mu.Unlock()
	if _, ok := h.acked(4); ok || inbox != 1 {
		t.Fatalf("the busy follow's batch: %d queued, acknowledged %v; want it queued for its goroutine", inbox, ok)
	}
}

// A write that fails acknowledges nothing: the follows whose batches were
// in the failed group end with this copy's storage error (the owner is not
// to blame), and neither is acknowledged.
func TestReceiverAcksNothingOfAFailedGroup(t *testing.T) {
	var fail atomic.Bool
	h := newDirectHarness(t, func() error {
		if fail.Load() {
			return errors.New("disk on fire")
		}
		return nil
	})
	_, subA := h.follow(1, "a")
	_, subB := h.follow(2, "b")
	fail.Store(true)
	h.s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{batch(1, 0, 0, 2, false), batch(2, 0, 0, 1, false)}})
	clustertest.Eventually(t, 10*time.Second, "both follows ended", func() bool {
		return subErr(subA) != nil && subErr(subB) != nil
	})
	for _, sub := range []*followSub{subA, subB} {
		if err := subErr(sub); !errors.Is(err, errLocal) {
			t.Fatalf("follow %d ended with %v, want this copy's storage error", sub.id, err)
		}
		if _, ok := h.acked(sub.id); ok {
			t.Fatalf("follow %d acknowledged after its write failed", sub.id)
		}
	}
}

// A follow that ends while its stored batch syncs gets no acknowledgement
// (its sink cleared: the owner may no longer serve it, and the copy's role
// may have changed); another follow in the same group does.
func TestReceiverAcksNoFollowThatEndedDuringTheSync(t *testing.T) {
	hold := make(chan struct{})
	entered := make(chan struct{}, 16)
	var holding atomic.Bool
	h := newDirectHarness(t, func() error {
		if holding.Load() {
			entered <- struct{}{}
			<-hold
		}
		return nil
	})
	_, subA := h.follow(1, "a")
	b, _ := h.follow(2, "b")
	holding.Store(true)
	h.s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{batch(1, 0, 0, 2, false), batch(2, 0, 0, 1, false)}})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the group was never written")
	}
	subA.setSink(nil) // followOnce returning
	holding.Store(false)
	close(hold)
	clustertest.Eventually(t, 10*time.Second, "b acknowledged", func() bool {
		tb, ok := h.acked(2)
		return ok && tb == 1
	})
	if b.st.Tails().Record != 1 {
		t.Fatal("b not durable")
	}
	if _, ok := h.acked(1); ok {
		t.Fatal("a follow that ended was acknowledged")
	}
}
