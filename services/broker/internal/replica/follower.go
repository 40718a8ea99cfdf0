package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// runFollower keeps the copy following owner at epoch until ctx ends. A
// broken connection marks the owner suspect in the heartbeat so the
// controller can fail over eagerly; a chain mismatch stops the worker and
// shows under attention: a copy never silently diverges.
func (c *Copy) runFollower(ctx context.Context, owner string, epoch uint64) {
	backoff := 20 * time.Millisecond
	var lastLog time.Time
	for ctx.Err() == nil {
		err := c.followOnce(ctx, owner, epoch)
		if ctx.Err() != nil {
			return
		}
		// A copy past the owner's tail (OutOfRange) holds records the owner
		// never had, e.g. after an accepted owner loss that recorded no
		// start: its log is not a prefix of the owner's, the same as a chain
		// mismatch, and retrying cannot mend it.
		if errors.Is(err, ErrChainMismatch) || connect.CodeOf(err) == connect.CodeDataLoss || connect.CodeOf(err) == connect.CodeOutOfRange {
			c.setChainMismatch()
			c.m.log.Error().Err(err).Str(logging.Stream, c.name).Str(logging.Owner, owner).Uint64(logging.Epoch, epoch).
				Msg("copy's prefix disagrees with the owner's; stopped following (shown under attention)")
			<-ctx.Done()
			return
		}
		if ownerSuspected(err) {
			c.setSuspect(owner)
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			c.m.log.Warn().Err(err).Str(logging.Stream, c.name).Str(logging.Owner, owner).Uint64(logging.Epoch, epoch).
				Msg("following the owner failed; retrying")
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// errLocal marks a follow call that failed on this copy's own storage (a
// write failure, a closed store): the owner is not to blame for it.
var errLocal = errors.New("this copy's storage")

func localErr(err error) error { return fmt.Errorf("%w: %w", errLocal, err) }

// ownerSuspected reports whether a failed follow call points at the owner:
// its connection broke, timed out or answered with an error the owner did
// not mean. Such a follower names the owner suspect in its heartbeat, so
// the controller can probe it and fail over without waiting for the
// owner's lease (liveness); a failure of the follower's own storage does
// not, or a follower with a broken disk would keep a healthy owner probed.
func ownerSuspected(err error) bool {
	if errors.Is(err, errLocal) {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return true
	}
	return false
}

func (c *Copy) followOnce(ctx context.Context, owner string, epoch uint64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Batches an earlier follow queued may still be syncing (a follow
	// ends without waiting for them, the writes go on). Starting from
	// the durable tails before they land would send the owner a tail below
	// what storage has taken, and its first batch would not line up.
	// Only a copy that queued a batch since its last sync waits: after a
	// mass failover thousands of followers retry an owner that is gone,
	// and a sync per attempt would load the committer that the seals and
	// the new roles wait on.
	if c.followQueued.Swap(false) {
		if err := c.st.Sync(ctx); err != nil {
			c.followQueued.Store(true)
			return localErr(err)
		}
	}
	sess, err := c.m.followSession(owner)
	if err != nil {
		return err
	}
	defer c.m.releaseFollowSession(sess)
	s := c.st.State()
	sub := sess.start(&strandv1.FollowStart{
		Stream: c.name, Epoch: epoch,
		RecordTail: s.RecordTail, CursorEventTail: s.CursorEventTail, Chain: s.Chain,
	})
	// Only this stream's follow ends here; the call and the other streams'
	// follows on it go on.
	defer sess.stop(sub)
	// Storage queues each batch (EnqueueReplicated) and the committer
	// tells its outcome once it is durable; the session's acker then
	// acknowledges the copy's durable tails (onDurable below). Batches that
	// arrive during one fsync share the next one, and the owner's next
	// batch travels while this one syncs. The owner's flow control bounds
	// what is queued here (followInflightBatches).
	var wmMu sync.Mutex
	var ownerWM uint64
	// applyWatermark makes the owner's confirm watermark visible here, never
	// above this copy's durable tail: readers on any copy only see records
	// below the confirm watermark.
	applyWatermark := func(fromOwner uint64) {
		wmMu.Lock()
		defer wmMu.Unlock()
		ownerWM = max(ownerWM, fromOwner)
		// Storage caps it at the durable tail and ignores a lower one.
		c.st.SetConfirmWatermark(ownerWM)
		c.setFollowerWatermark(min(ownerWM, c.st.Tails().Record))
	}
	// onDurable runs on the session's acker, under the sub's durableMu, which
	// the follow clears before it returns: nothing is acknowledged on a
	// follow the owner no longer serves, or after the role ended. A failed
	// write ends the follow (this copy's storage, not the owner, failed).
	sub.setOnDurable(func(err error, b storedBatch) {
		if err != nil {
			sub.finish(localErr(err))
			return
		}
		if b.records {
			c.m.cfg.Metrics.FollowApplied(b.arrived, b.bytes)
		}
		t := c.st.Tails()
		applyWatermark(0)
		sess.ack(sub, t.Record, t.CursorEvent)
	})
	defer sub.setOnDurable(nil)
	// store queues a batch's records and cursor events. It runs on this
	// goroutine until the first batch is applied, then on the session's
	// receiver (followDirect).
	store := func(ctx context.Context, resp *strandv1.FollowBatch, arrived time.Time) error {
		recs, err := storage.DecodeSegment(resp.GetRecordSegment())
		if err != nil {
			return fmt.Errorf("owner sent an unreadable record segment: %w", err)
		}
		evs := make([]storage.CursorEvent, 0, len(resp.GetCursorEvents()))
		for _, e := range resp.GetCursorEvents() {
			evs = append(evs, eventFromProto(e))
		}
		if len(recs) == 0 && len(evs) == 0 {
			return nil
		}
		// Set before: a batch refused part way may have queued writes.
		c.followQueued.Store(true)
		stored := storedBatch{arrived: arrived, records: len(recs) > 0, bytes: len(resp.GetRecordSegment())}
		err = c.st.EnqueueReplicated(ctx, recs, evs, func(err error) { sess.noteDurable(sub, err, stored) })
		if errors.Is(err, storage.ErrChainMismatch) {
			return fmt.Errorf("%w: %v", ErrChainMismatch, err)
		}
		if err != nil {
			return localErr(err)
		}
		return nil
	}
	// Once the first batch is applied (it alone may carry the head a
	// copy below the owner's starts at, and ResetTo runs for it), the
	// session's receiver stores and applies each later batch of this
	// epoch itself (followSub.applyDirect), waking nothing here, unless
	// one waits in the inbox before it. It is cleared before this follow
	// returns, so none is stored or applied after the role ends (endRole
	// waits for this goroutine).
	defer sub.setDirect(nil)
	direct := false
	for {
		sub.settle()
		resp, err := sess.next(ctx, sub)
		arrived := time.Now()
		if err != nil {
			return err
		}
		c.setSuspect("")
		if resp.GetEpoch() != epoch {
			return fmt.Errorf("%w: owner at epoch %d, follower at %d", ErrEpochMismatch, resp.GetEpoch(), epoch)
		}
		if head := resp.GetHead(); head > 0 && head > c.st.State().RecordTail {
			// The owner names its head only in its first batch, before
			// anything of the follow is queued here.
			if direct {
				return fmt.Errorf("owner sent head %d after its first batch; following again", head)
			}
			if err := c.st.ResetTo(ctx, head, resp.GetChainAtHead()); err != nil {
				return localErr(err)
			}
		}
		if cs := resp.GetCursorSnapshot(); cs != nil {
			// Below the owner's retained cursor events: its snapshot
			// stands for them. Durable before any later event is
			// applied over it (storage waits for it), so it is
			// acknowledged at once.
			err := c.st.InstallCursorSnapshot(ctx, storage.CursorSnapshot{Boundary: cs.GetBoundary(), Epoch: cs.GetEpoch(), Cursors: cs.GetCursors()})
			if err != nil {
				return localErr(err)
			}
			sub.durable(nil, storedBatch{arrived: arrived})
		}
		if err := store(ctx, resp, arrived); err != nil {
			return err
		}
		applyWatermark(resp.GetConfirmWatermark())
		if !direct {
			direct = true
			sub.setDirect(&followDirect{
				ctx:   ctx,
				epoch: epoch,
				store: func(b *strandv1.FollowBatch, arrived time.Time) error {
					return store(ctx, b, arrived)
				},
				watermark: applyWatermark,
			})
		}
	}
}
