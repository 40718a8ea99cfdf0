package replica

import (
	"context"
	"errors"
	"testing"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// One response of the owner mixes follows. The receiver stores and applies
// a batch itself for a follow that lent it its direct path (it applied its
// first batch) and has nothing queued or being applied; it hands the batch
// to the follow's goroutine when the follow has batches queued (never ahead
// of them), is applying one, has not applied its first batch, or the
// batch is of another epoch (its goroutine ends the follow) or carries a
// head or cursor snapshot; the other follows' batches in the response go
// on, and a follow stopped here since gets nothing. A batch the store
// refuses ends that follow alone.
func TestReceiverAppliesBatchesDirectlyPerFollow(t *testing.T) {
	s := &followSession{subs: map[uint64]*followSub{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := map[uint64][]uint64{}
	stored := map[uint64][]uint64{}
	refuse := errors.New("refused by storage")
	sub := func(id uint64, direct bool) *followSub {
		x := &followSub{id: id, notify: make(chan struct{}, 1)}
		if direct {
			x.setDirect(&followDirect{
				ctx:   ctx,
				epoch: 2,
				store: func(b *strandv1.FollowBatch, _ time.Time) error {
					if b.GetRecordSegment()[0] == 0xff {
						return refuse
					}
					stored[id] = append(stored[id], b.GetConfirmWatermark())
					return nil
				},
				watermark: func(wm uint64) { applied[id] = append(applied[id], wm) },
			})
		}
		s.subs[id] = x
		return x
	}
	idle, queued, fresh, refused, stopped, taking, special, broken := sub(1, true), sub(2, true), sub(3, false), sub(4, true), sub(5, true), sub(6, true), sub(7, true), sub(8, true)
	queued.push(&strandv1.FollowBatch{Id: 2, Epoch: 2, RecordSegment: []byte{1}})
	delete(s.subs, stopped.id)
	taking.mu.Lock()
	taking.taking = true
	taking.mu.Unlock()

	wm := func(id, epoch, wm uint64) *strandv1.FollowBatch {
		return &strandv1.FollowBatch{Id: id, Epoch: epoch, ConfirmWatermark: wm}
	}
	recs := func(id, wm uint64) *strandv1.FollowBatch {
		return &strandv1.FollowBatch{Id: id, Epoch: 2, RecordSegment: []byte{1}, ConfirmWatermark: wm}
	}
	s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{
		wm(1, 2, 10), wm(2, 2, 11), wm(3, 2, 12), wm(4, 3, 13), wm(5, 2, 14),
		recs(1, 15), wm(1, 2, 16), recs(6, 17),
		{Id: 7, Epoch: 2, Head: 5, ConfirmWatermark: 18}, recs(7, 19),
		{Id: 8, Epoch: 2, RecordSegment: []byte{0xff}, ConfirmWatermark: 20}, recs(8, 21),
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
	eq := func(a []uint64, b ...uint64) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	}
	if got := applied[1]; !eq(got, 10, 15, 16) || !eq(stored[1], 15) || len(inbox(idle)) != 0 {
		t.Fatalf("idle follow: receiver applied %v and stored %v, inbox %v; want [10 15 16], [15], none", got, stored[1], inbox(idle))
	}
	if got := inbox(queued); !eq(got, 0, 11) || len(applied[2]) != 0 {
		t.Fatalf("follow with a queued batch: inbox %v, applied %v; want the watermark queued behind it", got, applied[2])
	}
	if got := inbox(fresh); !eq(got, 12) {
		t.Fatalf("follow before its first batch: inbox %v, want [12]", got)
	}
	if got := inbox(refused); !eq(got, 13) || len(applied[4]) != 0 {
		t.Fatalf("follow of another epoch: inbox %v, applied %v; want it queued for the follow to refuse", got, applied[4])
	}
	if got := inbox(stopped); len(got) != 0 || len(applied[5]) != 0 {
		t.Fatalf("stopped follow got %v, applied %v", got, applied[5])
	}
	if got := inbox(taking); !eq(got, 17) || len(stored[6]) != 0 {
		t.Fatalf("follow applying a batch: inbox %v, stored %v; want it queued behind the one applied", got, stored[6])
	}
	if got := inbox(special); !eq(got, 18, 19) || len(stored[7]) != 0 {
		t.Fatalf("batch with a head: inbox %v, stored %v; want it and what follows it queued", got, stored[7])
	}
	broken.mu.Lock()
	berr, bin := broken.err, len(broken.inbox)
	broken.mu.Unlock()
	if !errors.Is(berr, refuse) || bin != 0 || len(stored[8]) != 0 || len(applied[8]) != 0 {
		t.Fatalf("refused batch: follow ended with %v, inbox %d, stored %v, applied %v; want it ended with the store's error and nothing after it kept", berr, bin, stored[8], applied[8])
	}
	// Once the follow's context ended (its role ended, it is returning),
	// nothing is stored or applied here, even before it clears its path.
	cancel()
	s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{wm(1, 2, 19)}})
	if got := applied[1]; len(got) != 3 || !eq(inbox(idle), 19) {
		t.Fatalf("applied %v after the follow's context ended, inbox %v", got, inbox(idle))
	}
	idle.mu.Lock()
	idle.inbox = nil
	idle.mu.Unlock()
	// Once the follow cleared it (it returned), nothing is applied here.
	idle.setDirect(nil)
	s.deliver(&strandv1.FollowResponse{Batches: []*strandv1.FollowBatch{wm(1, 2, 20), recs(1, 21)}})
	if got := applied[1]; len(got) != 3 || len(stored[1]) != 1 || !eq(inbox(idle), 20, 21) {
		t.Fatalf("applied %v and stored %v after the follow ended, inbox %v", got, stored[1], inbox(idle))
	}
}
