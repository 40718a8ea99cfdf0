package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/internal/gen/strand/v1"
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
		switch connect.CodeOf(err) {
		case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeDeadlineExceeded, connect.CodeCanceled:
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

func (c *Copy) followOnce(ctx context.Context, owner string, epoch uint64) error {
	addr := c.m.BrokerAddr(owner)
	if addr == "" {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("owner %q is not registered", owner))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.m.cfg.Dial(addr).Follow(ctx)
	// A cancelled context does not wake a Receive blocked on the owner once
	// response headers arrived: net/http only watches the context again after
	// the request body ends. Closing the request side on cancellation does
	// that, so a seal or role change never waits on a stopped owner.
	var sendMu sync.Mutex
	closed := false
	closeRequest := func() {
		sendMu.Lock()
		defer sendMu.Unlock()
		if !closed {
			closed = true
			_ = stream.CloseRequest()
		}
	}
	send := func(req *strandv1.FollowRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		if closed {
			return ctx.Err()
		}
		return stream.Send(req)
	}
	stop := context.AfterFunc(ctx, closeRequest)
	defer stop()
	defer closeRequest()
	s := c.st.State()
	if err := send(&strandv1.FollowRequest{
		Stream: c.name, Node: c.m.cfg.Node, Epoch: epoch,
		RecordTail: s.RecordTail, CursorEventTail: s.CursorEventTail, Chain: s.Chain,
	}); err != nil {
		return err
	}
	for {
		resp, err := stream.Receive()
		if err != nil {
			return err
		}
		c.setSuspect("")
		if resp.GetEpoch() != epoch {
			return fmt.Errorf("%w: owner at epoch %d, follower at %d", ErrEpochMismatch, resp.GetEpoch(), epoch)
		}
		if head := resp.GetHead(); head > 0 && head > c.st.State().RecordTail {
			if err := c.st.ResetTo(head, resp.GetChainAtHead()); err != nil {
				return err
			}
		}
		recs := make([]storage.Record, 0, len(resp.GetRecords()))
		for _, r := range resp.GetRecords() {
			recs = append(recs, FromProto(r))
		}
		evs := make([]storage.CursorEvent, 0, len(resp.GetCursorEvents()))
		for _, e := range resp.GetCursorEvents() {
			evs = append(evs, eventFromProto(e))
		}
		if len(recs) > 0 || len(evs) > 0 {
			if err := c.st.AppendReplicated(ctx, recs, evs); err != nil {
				if errors.Is(err, storage.ErrChainMismatch) {
					return fmt.Errorf("%w: %v", ErrChainMismatch, err)
				}
				return err
			}
		}
		s = c.st.State()
		wm := min(resp.GetConfirmWatermark(), s.RecordTail)
		if wm > s.ConfirmWatermark {
			c.st.SetConfirmWatermark(wm)
		}
		c.setFollowerWatermark(wm)
		if len(recs) > 0 || len(evs) > 0 {
			if err := send(&strandv1.FollowRequest{
				Stream: c.name, Node: c.m.cfg.Node, Epoch: epoch,
				RecordTail: s.RecordTail, CursorEventTail: s.CursorEventTail, Chain: s.Chain,
			}); err != nil {
				return err
			}
		}
	}
}
