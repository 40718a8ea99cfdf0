package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/rpcerr"
)

// SubscribeOptions says where a subscription starts.
type SubscribeOptions struct {
	// Start defaults to START_POSITION_EARLIEST.
	Start strandv1.StartPosition
	// Offset is used with START_POSITION_OFFSET.
	Offset uint64
	// Cursor is used with START_POSITION_CURSOR.
	Cursor string
	// MaxBatch bounds records per message; 0 means the broker's default.
	MaxBatch uint32
}

// ownerWatchInterval is how often an open subscription asks another broker
// who owns its stream: an owner that stopped (SIGSTOP, partition) sends
// neither records nor an error, so only a moved owner tells.
const ownerWatchInterval = 2 * time.Second

// Subscription delivers a stream's confirmed records from a start position
// and then the live tail. After an error it locates the owner again and
// resumes at the next offset not yet delivered; records below it that a
// resumed stream repeats are dropped, so Recv returns each offset once, in
// order. It is not safe for concurrent use.
type Subscription struct {
	c      *Client
	stream string
	opts   SubscribeOptions
	ctx    context.Context
	cancel context.CancelFunc

	// next is the next offset not yet delivered, once known.
	next  uint64
	known bool

	cur        *connect.ServerStreamForClient[strandv1.SubscribeResponse]
	curCancel  context.CancelFunc
	addr       string
	backoff    *backoff
	failing    time.Time
	lastErr    error
	watermark  uint64
	reconnects int
	// started is when the subscription was made (notFoundGrace).
	started time.Time
}

// Subscribe opens a subscription; the first Recv connects. Close it when done.
func (c *Client) Subscribe(ctx context.Context, stream string, opts SubscribeOptions) *Subscription {
	if opts.Start == strandv1.StartPosition_START_POSITION_UNSPECIFIED {
		opts.Start = strandv1.StartPosition_START_POSITION_EARLIEST
	}
	ctx, cancel := context.WithCancel(ctx)
	// Closing the client ends its subscriptions too (Recv answers
	// ErrClosed), as it answers its queued publishes.
	stop := context.AfterFunc(c.ctx, cancel)
	s := &Subscription{c: c, stream: stream, opts: opts, ctx: ctx, cancel: func() { stop(); cancel() }, backoff: c.newBackoff(), started: time.Now()}
	if opts.Start == strandv1.StartPosition_START_POSITION_OFFSET {
		s.next, s.known = opts.Offset, true
	}
	return s
}

// Next is the next offset the subscription has not delivered, and whether it
// is known yet (it is not before the first record from a cursor, earliest or
// latest start).
func (s *Subscription) Next() (uint64, bool) { return s.next, s.known }

// ConfirmWatermark is the latest confirm watermark the broker reported.
func (s *Subscription) ConfirmWatermark() uint64 { return s.watermark }

// Reconnects counts how many times the subscription was re-established.
func (s *Subscription) Reconnects() int { return s.reconnects }

// Close ends the subscription.
func (s *Subscription) Close() error {
	s.cancel()
	s.closeStream()
	return nil
}

func (s *Subscription) closeStream() {
	if s.cur != nil {
		_ = s.cur.Close()
		s.cur = nil
	}
	if s.curCancel != nil {
		s.curCancel()
		s.curCancel = nil
	}
}

// Recv blocks until new records arrive and returns them (never empty). It
// fails when the context ends, on an error a retry cannot fix, or when the
// subscription could not be re-established within the retry budget.
func (s *Subscription) Recv() ([]*strandv1.StoredRecord, error) {
	for {
		if s.cur == nil {
			if err := s.open(); err != nil {
				if werr := s.wait(err); werr != nil {
					return nil, werr
				}
				continue
			}
		}
		if s.cur.Receive() {
			msg := s.cur.Msg()
			// An owner serves: the retry budget counts time without one,
			// so it starts again at the next failure. The broker's first
			// message carries no records (the confirm watermark only); on
			// a quiet stream it is all a reconnect receives, and a budget
			// kept running from an earlier failover would end the
			// subscription at the next one.
			s.failing, s.lastErr = time.Time{}, nil
			s.watermark = max(s.watermark, msg.GetConfirmWatermark())
			recs := msg.GetRecords()
			if !s.known && len(recs) == 0 && s.opts.Start == strandv1.StartPosition_START_POSITION_LATEST {
				// The live tail starts at the watermark; resuming there
				// after an error skips nothing this subscription owes.
				s.next, s.known = msg.GetConfirmWatermark(), true
			}
			if s.known {
				i := 0
				for i < len(recs) && recs[i].GetOffset() < s.next {
					i++
				}
				recs = recs[i:]
			}
			if len(recs) == 0 {
				continue
			}
			s.next, s.known = recs[len(recs)-1].GetOffset()+1, true
			s.backoff.reset()
			return recs, nil
		}
		err := s.cur.Err()
		s.closeStream()
		if err == nil {
			// The broker ended the stream: it is shutting down or no
			// longer owns the stream.
			err = connect.NewError(connect.CodeUnavailable, errors.New("client: subscription ended by the broker"))
		}
		if werr := s.wait(err); werr != nil {
			return nil, werr
		}
	}
}

// open connects to the owner and starts the stream where the subscription
// stands.
func (s *Subscription) open() error {
	addr, err := s.c.owner(s.ctx, s.stream, "")
	if err != nil {
		return err
	}
	req := &strandv1.SubscribeRequest{Stream: s.stream, Start: s.opts.Start, Offset: s.opts.Offset, Cursor: s.opts.Cursor, MaxBatch: s.opts.MaxBatch}
	if s.known {
		req.Start, req.Offset, req.Cursor = strandv1.StartPosition_START_POSITION_OFFSET, s.next, ""
	}
	ctx, cancel := context.WithCancel(s.ctx)
	stream, err := s.c.stream(addr).Subscribe(ctx, connect.NewRequest(req))
	if err != nil {
		cancel()
		s.addr = addr
		return err
	}
	s.cur, s.curCancel, s.addr = stream, cancel, addr
	go s.c.watchOwner(ctx, cancel, s.stream, addr)
	return nil
}

// wait handles a failed or ended stream: follows a hint, forgets a dead
// owner, and backs off. It returns an error when the subscription must end.
func (s *Subscription) wait(err error) error {
	if s.c.ctx.Err() != nil {
		return ErrClosed
	}
	if s.ctx.Err() != nil {
		return s.ctx.Err()
	}
	if s.failing.IsZero() {
		s.failing = time.Now()
	}
	s.lastErr = err
	s.reconnects++
	if hint, ok := rpcerr.OwnerHint(err); ok && hint.GetAddress() != "" && hint.GetAddress() != s.addr {
		s.c.setOwner(s.stream, hint.GetAddress())
	} else if _, ok := rpcerr.OwnerHint(err); ok || retryable(s.ctx, err) {
		s.c.forgetOwner(s.stream, s.addr)
	} else if connect.CodeOf(err) == connect.CodeNotFound && time.Since(s.started) < notFoundGrace {
		// As for unary calls: right after CreateStream a broker may not
		// have seen the stream yet.
		s.c.forgetOwner(s.stream, s.addr)
	} else {
		return fmt.Errorf("client: subscribe %q: %w", s.stream, err)
	}
	if time.Since(s.failing) > s.c.cfg.RetryBudget {
		return fmt.Errorf("client: subscribe %q: no owner served within %v: %w", s.stream, s.c.cfg.RetryBudget, err)
	}
	if !s.c.sleep(s.ctx, s.backoff.next()) {
		if s.ctx.Err() != nil {
			return s.ctx.Err()
		}
		return ErrClosed
	}
	return nil
}

// watchOwner cancels a subscription stream when another broker says the
// owner is no longer addr.
func (c *Client) watchOwner(ctx context.Context, cancel context.CancelFunc, stream, addr string) {
	t := time.NewTicker(ownerWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := c.locateOnce(ctx, stream, addr)
		if err != nil {
			continue
		}
		if owner := res.GetOwner().GetAddress(); owner != "" && owner != addr {
			c.setOwner(stream, owner)
			cancel()
			return
		}
	}
}
