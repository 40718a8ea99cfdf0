package replica

import (
	"testing"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

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
