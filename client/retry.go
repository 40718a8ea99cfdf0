package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/rpcerr"
)

var (
	// errOwnerMoved abandons an attempt whose target is no longer the owner
	// according to another broker; the call retries at the new owner.
	errOwnerMoved = errors.New("client: owner moved during the attempt")
	// errAttemptTimeout is the cause of an attempt cut by AttemptTimeout.
	errAttemptTimeout = errors.New("client: attempt timed out")
)

// notFoundGrace is how long after a call starts a NotFound is still retried:
// brokers learn of a stream by watching etcd, so a publish right after
// CreateStream can reach a broker that has not seen it yet.
const notFoundGrace = 2 * time.Second

// maxImmediateRedirects bounds how many owner hints are followed without
// backing off, so two brokers that disagree cannot make the client spin.
const maxImmediateRedirects = 3

// withBudget bounds ctx by the retry budget when it has no deadline.
func (c *Client) withBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.RetryBudget)
}

// call runs fn against the owner of stream until it succeeds, fails with an
// error a retry cannot fix, or ctx (bounded by the retry budget) ends. fn
// must build its request afresh on every call: a Connect request is not
// reusable across attempts.
func (c *Client) call(ctx context.Context, op, stream string, fn func(context.Context, *brokerConn) error) error {
	ctx, cancel := c.withBudget(ctx)
	defer cancel()
	start := time.Now()
	b := c.newBackoff()
	var (
		last      error
		avoid     string
		attempts  int
		redirects int
	)
	for {
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		addr, err := c.owner(ctx, stream, avoid)
		if err == nil {
			attempts++
			err = c.attempt(ctx, stream, addr, fn)
			if err == nil {
				return nil
			}
		}
		if ctx.Err() != nil {
			return giveUp(op, stream, attempts, ctx, lastOf(err, last))
		}
		last = err
		hint, hinted := rpcerr.OwnerHint(err)
		switch {
		case errors.Is(err, errOwnerMoved):
			// The probe already cached the new owner.
			redirects++
			if redirects <= maxImmediateRedirects {
				continue
			}
		case hinted && hint.GetAddress() != "" && hint.GetAddress() != addr:
			c.setOwner(stream, hint.GetAddress())
			redirects++
			if redirects <= maxImmediateRedirects {
				continue
			}
		case hinted:
			// A hint without an address, or pointing back at the broker
			// that refused: the owner is changing; locate again.
			c.forgetOwner(stream, addr)
			avoid = addr
		case connect.CodeOf(err) == connect.CodeNotFound && time.Since(start) < notFoundGrace:
			c.forgetOwner(stream, addr)
		case retryable(ctx, err):
			if addr != "" {
				c.forgetOwner(stream, addr)
				avoid = addr
			}
		default:
			return err
		}
		redirects = 0
		if !c.sleep(ctx, b.after(err)) {
			if c.ctx.Err() != nil {
				return ErrClosed
			}
			return giveUp(op, stream, attempts, ctx, last)
		}
	}
}

func lastOf(err, last error) error {
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return err
	}
	if last != nil {
		return last
	}
	return err
}

// giveUp reports the end of the retry budget. It wraps both the context's
// error (errors.Is(err, context.DeadlineExceeded)) and the last error seen
// (connect.CodeOf(err) is that error's code), so callers can tell why.
func giveUp(op, stream string, attempts int, ctx context.Context, last error) error {
	if last == nil {
		return fmt.Errorf("client: %s %q: %w after %d attempts", op, stream, ctx.Err(), attempts)
	}
	return fmt.Errorf("client: %s %q: %w after %d attempts; last error: %w", op, stream, ctx.Err(), attempts, last)
}

// attempt runs fn once against addr, bounded by AttemptTimeout. While it
// runs longer than ProbeAfter, other brokers are asked who owns the stream;
// if the owner moved (a stopped owner answers nothing, not even an error) the
// attempt is abandoned.
func (c *Client) attempt(ctx context.Context, stream, addr string, fn func(context.Context, *brokerConn) error) error {
	actx, cancel := context.WithTimeoutCause(ctx, c.cfg.AttemptTimeout, errAttemptTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(actx, c.stream(addr)) }()
	probe := time.NewTimer(c.cfg.ProbeAfter)
	defer probe.Stop()
	moved := make(chan string, 1)
	probing := false
	for {
		select {
		case err := <-done:
			if err != nil && errors.Is(context.Cause(actx), errAttemptTimeout) && ctx.Err() == nil {
				return fmt.Errorf("%w after %v at %s: %w", errAttemptTimeout, c.cfg.AttemptTimeout, addr, err)
			}
			return err
		case <-probe.C:
			if !probing {
				probing = true
				go func() {
					res, err := c.locateOnce(actx, stream, addr)
					owner := ""
					if err == nil {
						owner = res.GetOwner().GetAddress()
					}
					moved <- owner
				}()
			}
		case owner := <-moved:
			probing = false
			if owner != "" && owner != addr {
				c.setOwner(stream, owner)
				cancel()
				<-done
				return errOwnerMoved
			}
			probe.Reset(c.cfg.ProbeAfter / 2)
		}
	}
}

// retryable reports whether err may go away by retrying, possibly elsewhere.
func retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, errNoOwner) || errors.Is(err, errOwnerMoved) || errors.Is(err, errAttemptTimeout) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeAborted, connect.CodeDeadlineExceeded:
		return true
	case connect.CodeFailedPrecondition:
		// Not the owner: passes once the owner serves. Brokers always
		// attach the owner hint there (a copy sealed for a recovery
		// answers Unavailable). Without a hint it is a producer sequence
		// error (gap or order), which retrying the same batch cannot mend.
		_, hinted := rpcerr.OwnerHint(err)
		return hinted
	case connect.CodeCanceled:
		// ctx is alive, so the cancel came from the other side.
		return true
	case connect.CodeUnknown, connect.CodeInternal:
		return connectionError(err)
	}
	return false
}

// connectionError reports errors of the connection rather than the call: a
// broker that died mid-response.
func connectionError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE)
}

// backoff is jittered exponential backoff between min and max.
type backoff struct {
	min, max, cur time.Duration
}

// after is the wait before the retry of a call that failed with err: the
// next backoff step, or longer when err's RetryInfo names a later time
// (a controller refusing a call for load says when it has room; asking
// sooner only queues the call behind the others again).
func (b *backoff) after(err error) time.Duration {
	d := b.next()
	if named, ok := rpcerr.RetryDelay(err); ok {
		d = max(d, named)
	}
	return d
}

func (c *Client) newBackoff() *backoff {
	return &backoff{min: c.cfg.BackoffMin, max: c.cfg.BackoffMax}
}

// next returns a wait in [cur/2, cur], cur doubling from min up to max.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(b.cur-half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d unless ctx ends or the client closes first.
func (c *Client) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-c.ctx.Done():
		return false
	}
}
