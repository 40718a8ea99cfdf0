package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/strandhq/strand/internal/logging"
)

// ErrHandover refuses a handover the owner cannot begin: this broker does
// not own the stream at the epoch asked, the target is not one of its
// followers, or another handover of the stream is under way.
var ErrHandover = errors.New("replica: handover refused")

// Defaults of a handover's bounds (HandoverRequest).
const (
	DefaultHandoverCatchUp = 2 * time.Second
	DefaultHandoverHold    = 5 * time.Second
)

// handoverPause is one handover's pause of an owner: while it is set the
// owner takes no publish and no cursor commit. done is closed when it ends.
type handoverPause struct {
	target string
	done   chan struct{}
	once   sync.Once
}

func (p *handoverPause) end() { p.once.Do(func() { close(p.done) }) }

// HandoverResult is the owner's answer to a handover.
type HandoverResult struct {
	CaughtUp                    bool
	RecordTail, CursorEventTail uint64
	// TargetRecordTail and TargetCursorEventTail are the target's
	// acknowledged tails.
	TargetRecordTail, TargetCursorEventTail uint64
}

// Handover pauses this broker's owner copy of stream for a move to target
// (docs/protocol.md, "Handover"): no new publish or cursor commit is taken,
// the ones under way end, and it waits until target has acknowledged the
// owner's durable tails, at most catchUp. Caught up, the pause is held
// until the copy is sealed (its role ends) or hold passes, so the seal the
// controller's handover recovery asks for finds the owner and the target
// tied at the furthest tails and the pick prefers the target
// (cluster.FurthestPreferring). Not caught up, the owner resumes at once.
// Safety does not rest on the pause: a pause that ends early only lets the
// owner pull ahead, and the seal path promotes whichever copy is furthest.
func (m *Manager) Handover(ctx context.Context, stream string, epoch uint64, target string, catchUp, hold time.Duration) (HandoverResult, error) {
	if catchUp <= 0 {
		catchUp = DefaultHandoverCatchUp
	}
	if hold <= 0 {
		hold = DefaultHandoverHold
	}
	c := m.copy(stream)
	if c == nil {
		return HandoverResult{}, m.notHere(ctx, stream)
	}
	a, tracker, roleCtx, ok := c.ownerRole()
	if !ok {
		return HandoverResult{}, m.notHere(ctx, stream)
	}
	if a.Epoch != epoch {
		return HandoverResult{}, fmt.Errorf("%w: stream %q is at epoch %d here, not %d", ErrHandover, stream, a.Epoch, epoch)
	}
	if !isFollowerOf(a, target) {
		return HandoverResult{}, fmt.Errorf("%w: %q is not a follower of %q at epoch %d", ErrHandover, target, stream, epoch)
	}
	p := &handoverPause{target: target, done: make(chan struct{})}
	c.mu.Lock()
	if c.pause != nil {
		c.mu.Unlock()
		return HandoverResult{}, fmt.Errorf("%w: stream %q is already paused for a handover to %q", ErrHandover, stream, c.pause.target)
	}
	c.pause = p
	c.mu.Unlock()
	held := false
	defer func() {
		if !held {
			c.endPause(p)
		}
	}()
	// Every append and cursor commit that passed its pause check holds
	// the gate shared until its write is handed to storage: once the gate
	// is ours, the owner's tails only move by the lazy cursor events the
	// Sync below makes durable (followers are sent events once durable).
	wctx, cancel := context.WithTimeout(ctx, catchUp)
	defer cancel()
	if err := c.waitOutWriters(wctx); err != nil {
		if ctx.Err() != nil {
			return HandoverResult{}, ctx.Err()
		}
		m.log.Info().Str(logging.Stream, stream).Str(logging.Node, target).Dur("catch_up", catchUp).
			Msg("handover abandoned: writes under way did not reach storage within the catch-up bound; the owner resumes")
		s := c.st.State()
		return HandoverResult{RecordTail: s.RecordTail, CursorEventTail: s.CursorEventTail}, nil
	}
	if err := c.st.Sync(wctx); err != nil && wctx.Err() == nil {
		return HandoverResult{}, err
	}
	s := c.st.State()
	res := HandoverResult{RecordTail: s.RecordTail, CursorEventTail: s.CursorEventTail}
	for {
		rt, et, next := tracker.follower(target)
		res.TargetRecordTail, res.TargetCursorEventTail = rt, et
		if rt >= s.RecordTail && et >= s.CursorEventTail {
			res.CaughtUp = true
			break
		}
		select {
		case <-next:
			continue
		case <-roleCtx.Done():
			return res, fmt.Errorf("%w: stream %q: the owner role ended during the handover", ErrUnavailable, stream)
		case <-wctx.Done():
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		m.log.Info().Str(logging.Stream, stream).Str(logging.Node, target).Uint64(logging.RecordTail, s.RecordTail).
			Uint64("target_record_tail", rt).Dur("catch_up", catchUp).Msg("handover abandoned: the target did not catch up; the owner resumes")
		return res, nil
	}
	held = true
	go func() {
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-t.C:
			m.log.Info().Str(logging.Stream, stream).Str(logging.Node, target).Dur("hold", hold).
				Msg("handover pause held without a seal; the owner resumes")
		case <-roleCtx.Done():
		case <-p.done:
		}
		c.endPause(p)
	}()
	m.log.Info().Str(logging.Stream, stream).Str(logging.Node, target).Uint64(logging.RecordTail, s.RecordTail).
		Uint64(logging.CursorEventTail, s.CursorEventTail).Msg("handover: owner paused and the target caught up; waiting for the seal")
	return res, nil
}

// waitOutWriters returns once every append and cursor commit that passed
// its pause check has handed its write to storage (each holds the gate
// shared until then), or when ctx ends first: a write stuck behind a
// stalled committer must not hold a handover past its bounds. The
// exclusive gate is only taken to be released: new writers are held off
// by the pause, not by the gate.
func (c *Copy) waitOutWriters(ctx context.Context) error {
	locked := make(chan struct{})
	go func() {
		c.gate.Lock()
		close(locked)
	}()
	select {
	case <-locked:
		c.gate.Unlock()
		return nil
	case <-ctx.Done():
		// The Lock still completes once the writers leave; release it then.
		go func() {
			<-locked
			c.gate.Unlock()
		}()
		return ctx.Err()
	}
}

// ResumeHandover ends the pause of stream's owner copy here, if any.
func (m *Manager) ResumeHandover(stream string) {
	c := m.copy(stream)
	if c == nil {
		return
	}
	c.mu.Lock()
	p := c.pause
	c.mu.Unlock()
	if p != nil {
		c.endPause(p)
	}
}

func (c *Copy) endPause(p *handoverPause) {
	c.mu.Lock()
	if c.pause == p {
		c.pause = nil
	}
	c.mu.Unlock()
	p.end()
}

// enterOwnerWrite waits out a handover pause, then holds the gate shared
// for one append or cursor commit; the caller calls leave once storage
// took the write. A publish that waits when the owner role ends (the
// handover's seal) is answered Unavailable, and the client finds the new
// owner.
func (c *Copy) enterOwnerWrite(ctx context.Context, roleCtx context.Context) (leave func(), err error) {
	for {
		c.mu.Lock()
		p := c.pause
		c.mu.Unlock()
		if p != nil {
			select {
			case <-p.done:
				continue
			case <-roleCtx.Done():
				return nil, fmt.Errorf("%w: stream %q: the owner handed the stream over", ErrUnavailable, c.name)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c.gate.RLock()
		c.mu.Lock()
		p = c.pause
		c.mu.Unlock()
		if p == nil {
			return c.gate.RUnlock, nil
		}
		c.gate.RUnlock()
	}
}
