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
	// Batches an earlier follow queued may still be syncing (its acker
	// stops waiting when the follow ends, the writes go on). Starting from
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
	// This goroutine takes each batch and goes back for the next while the
	// acker waits for queued batches to become durable, in order, and
	// acknowledges the durable tails: batches that arrive during one fsync
	// share the next one (storage.EnqueueReplicated), and the owner's next
	// batch travels while this one syncs. The owner's flow control bounds
	// what is queued here (followInflightBatches).
	type receivedBatch struct {
		storage.Pending
		at   time.Time // when the batch arrived (follow_apply_seconds)
		recs bool      // whether it held records
		// bytes is the batch's record segment as the owner sent it
		// (follow_stored_bytes_total).
		bytes int
	}
	pending := make(chan receivedBatch, followInflightBatches)
	ackErr := make(chan error, 1)
	ackerDone := make(chan struct{})
	// The acker ends before the follow is stopped and the call released:
	// nothing is acknowledged on a follow the owner no longer serves.
	defer func() {
		cancel()
		<-ackerDone
	}()
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
	go func() {
		defer close(ackerDone)
		ackedRec, ackedEv := s.RecordTail, s.CursorEventTail
		for {
			var p receivedBatch
			select {
			case p = <-pending:
			case <-ctx.Done():
				return
			}
			if err := p.Wait(ctx); err != nil {
				ackErr <- localErr(err)
				cancel()
				return
			}
			if p.recs {
				c.m.cfg.Metrics.FollowApplied(p.at, p.bytes)
			}
			t := c.st.Tails()
			applyWatermark(0)
			// A batch that became durable with an earlier one was
			// acknowledged with it.
			if t.Record == ackedRec && t.CursorEvent == ackedEv {
				continue
			}
			ackedRec, ackedEv = t.Record, t.CursorEvent
			sess.ack(sub, t.Record, t.CursorEvent)
		}
	}()
	// Once the first batch is applied (it alone may carry the head a
	// copy below the owner's starts at, and ResetTo runs for it), a batch
	// carrying only the owner's confirm watermark is applied by the
	// session's receiver (followSub.applyWatermark), waking nothing here:
	// applyWatermark caps it at this copy's durable tail, whose records
	// all passed the chain check. It is cleared before this follow
	// returns, so none is applied after the role ends (endRole waits for
	// this goroutine).
	defer sub.setWatermark(nil)
	direct := false
	queued := false
	for {
		resp, err := sess.next(ctx, sub)
		arrived := time.Now()
		if err != nil {
			select {
			case aerr := <-ackErr:
				return aerr
			default:
			}
			return err
		}
		c.setSuspect("")
		if resp.GetEpoch() != epoch {
			return fmt.Errorf("%w: owner at epoch %d, follower at %d", ErrEpochMismatch, resp.GetEpoch(), epoch)
		}
		if head := resp.GetHead(); head > 0 && head > c.st.State().RecordTail {
			// The owner names its head only before its first batch, so
			// nothing is queued here yet.
			if queued {
				return fmt.Errorf("owner sent head %d after records; following again", head)
			}
			if err := c.st.ResetTo(ctx, head, resp.GetChainAtHead()); err != nil {
				return localErr(err)
			}
		}
		recs, err := storage.DecodeSegment(resp.GetRecordSegment())
		if err != nil {
			return fmt.Errorf("owner sent an unreadable record segment: %w", err)
		}
		if cs := resp.GetCursorSnapshot(); cs != nil {
			// Below the owner's retained cursor events: its snapshot
			// stands for them. Durable before any later event is
			// applied over it (storage waits for it).
			err := c.st.InstallCursorSnapshot(ctx, storage.CursorSnapshot{Boundary: cs.GetBoundary(), Epoch: cs.GetEpoch(), Cursors: cs.GetCursors()})
			if err != nil {
				return localErr(err)
			}
			select {
			case pending <- receivedBatch{at: arrived}: // acknowledged like a batch
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		evs := make([]storage.CursorEvent, 0, len(resp.GetCursorEvents()))
		for _, e := range resp.GetCursorEvents() {
			evs = append(evs, eventFromProto(e))
		}
		if len(recs) > 0 || len(evs) > 0 {
			// Set before: a batch refused part way may have queued writes.
			c.followQueued.Store(true)
			p, err := c.st.EnqueueReplicated(ctx, recs, evs)
			if err != nil {
				if errors.Is(err, storage.ErrChainMismatch) {
					return fmt.Errorf("%w: %v", ErrChainMismatch, err)
				}
				return localErr(err)
			}
			queued = true
			select {
			case pending <- receivedBatch{Pending: p, at: arrived, recs: len(recs) > 0, bytes: len(resp.GetRecordSegment())}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		applyWatermark(resp.GetConfirmWatermark())
		if !direct {
			direct = true
			sub.setWatermark(func(e, wm uint64) bool {
				if e != epoch || ctx.Err() != nil {
					return false
				}
				applyWatermark(wm)
				return true
			})
		}
	}
}
