// Package lease keeps an etcd lease alive for as long as etcd holds it,
// across the etcd client's sessions. The broker's registration and the
// controller's and recoverer's election keys live under such a lease.
//
// The etcd client ends a session (concurrency.Session) on its own side
// when no keep-alive answer came within the lease TTL. On a saturated
// machine that happens while the keep-alives still reach etcd and the
// lease lives: the answers were late, not the requests. Giving the lease
// up then costs what losing it would: a broker's registration goes and
// every stream it owns fails over; a controller's or recoverer's term
// ends and a new one starts from nothing. A Held lease instead asks etcd
// whether the lease lives and, if it does, keeps it alive again under a
// new session: the keys under it stay exactly as they were
// (docs/architecture.md, "Coordination only through etcd").
//
// Resuming is safe because nothing a lease holder does is guarded by its
// own belief that it holds the lease: a broker's copies are fenced by
// seals and epochs, and a leader's writes compare its election key's
// create revision, which no longer matches once the lease has expired and
// the key was deleted.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Counters count what happened to the leases of one holder, over all of
// them: sessions that lapsed while the lease was held, and sessions that
// went on under the lease of the one before because etcd still held it.
type Counters struct {
	Lapsed, Resumed atomic.Int64
}

// ErrLost is why a Held lease ended on its own: etcd no longer holds it, or
// did not say that it does within a TTL of its session lapsing.
var ErrLost = errors.New("lease: lost")

// retryEvery paces the reads of a lapsed lease's time to live.
const retryEvery = 100 * time.Millisecond

// Held is a lease kept alive until it is revoked, its context ends, or
// etcd lets it go.
type Held struct {
	cli      *clientv3.Client
	ttl      time.Duration
	id       clientv3.LeaseID
	first    *concurrency.Session
	counters *Counters

	cancel context.CancelFunc
	// done is closed when the lease is no longer kept alive; err says why.
	done chan struct{}
	err  error

	revokeOnce sync.Once
	revokeErr  error
}

// Grant grants a lease of ttl (rounded up to whole seconds, etcd's unit)
// and keeps it alive until ctx ends, Revoke, or the lease is lost.
// counters may be nil.
func Grant(ctx context.Context, cli *clientv3.Client, ttl time.Duration, counters *Counters) (*Held, error) {
	secs := max(int64((ttl+time.Second-1)/time.Second), 1)
	// The grant is made under ctx, so stopping while etcd is unreachable
	// does not block here.
	resp, err := cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("lease: grant: %w", err)
	}
	if counters == nil {
		counters = new(Counters)
	}
	kctx, cancel := context.WithCancel(ctx)
	h := &Held{cli: cli, ttl: time.Duration(secs) * time.Second, id: resp.ID, counters: counters, cancel: cancel, done: make(chan struct{})}
	sess, err := concurrency.NewSession(cli, concurrency.WithLease(resp.ID), concurrency.WithContext(kctx))
	if err != nil {
		cancel()
		close(h.done)
		_ = h.Revoke()
		return nil, fmt.Errorf("lease: keep alive %x: %w", int64(resp.ID), err)
	}
	h.first = sess
	go h.keep(kctx, sess)
	return h, nil
}

// ID is the lease's id: the same for as long as it is held.
func (h *Held) ID() clientv3.LeaseID { return h.id }

// Session is the first session of the lease, for what takes one, such as
// concurrency.NewElection, which reads only its lease and client. Its Done
// says nothing about the lease: watch the Held's.
func (h *Held) Session() *concurrency.Session { return h.first }

// Done is closed once the lease is no longer kept alive: lost (Err is
// ErrLost), revoked, or its context ended.
func (h *Held) Done() <-chan struct{} { return h.done }

// Err says why Done closed; nil before.
func (h *Held) Err() error {
	select {
	case <-h.done:
		return h.err
	default:
		return nil
	}
}

// Context returns a context derived from parent that is also cancelled
// once the lease is no longer kept alive: what a leader does under its
// election lease runs under it, and stops when the lease is lost.
func (h *Held) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-h.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// keep runs the lease's sessions: when one lapses while ctx lives, the
// lease is resumed under a new one if etcd still holds it.
func (h *Held) keep(ctx context.Context, sess *concurrency.Session) {
	defer close(h.done)
	for {
		select {
		case <-ctx.Done():
			h.err = ctx.Err()
			return
		case <-sess.Done():
		}
		if ctx.Err() != nil {
			h.err = ctx.Err()
			return
		}
		h.counters.Lapsed.Add(1)
		// The lapsed session's keep-alive has stopped; orphaning it (at
		// once, then) releases its context, which would otherwise stay
		// among ctx's children until the lease ends: one per lapse, for
		// months.
		sess.Orphan()
		next, err := h.resume(ctx, time.Now())
		if err != nil {
			h.err = err
			return
		}
		h.counters.Resumed.Add(1)
		sess = next
	}
}

// resume keeps the lease alive under a new session if etcd still holds it.
// Nothing has kept it alive since the session lapsed (at lapsed), so a
// lease etcd has not confirmed within a TTL of that has expired by then:
// it is given up rather than waited on, so a read that keeps failing
// cannot keep its holder from taking a new one.
func (h *Held) resume(ctx context.Context, lapsed time.Time) (*concurrency.Session, error) {
	for {
		left := h.ttl - time.Since(lapsed)
		if left <= 0 {
			return nil, fmt.Errorf("%w: etcd did not confirm lease %x within %s of its session lapsing", ErrLost, int64(h.id), h.ttl)
		}
		tctx, cancel := context.WithTimeout(ctx, left)
		resp, err := h.cli.TimeToLive(tctx, h.id)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil && resp.TTL <= 0 {
			return nil, fmt.Errorf("%w: lease %x expired", ErrLost, int64(h.id))
		}
		if err == nil {
			sess, err := concurrency.NewSession(h.cli, concurrency.WithLease(h.id), concurrency.WithContext(ctx))
			if err != nil {
				return nil, fmt.Errorf("lease: resume %x: %w", int64(h.id), err)
			}
			return sess, nil
		}
		t := time.NewTimer(min(retryEvery, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// revokeTimeout bounds a revoke: it runs with a context of its own, as the
// holder's is usually what ended.
const revokeTimeout = 2 * time.Second

// Revoke stops keeping the lease alive and revokes it, which deletes every
// key under it at once (eager failover: nobody waits out the TTL). A lease
// etcd no longer holds is not an error. It is idempotent.
func (h *Held) Revoke() error {
	h.revokeOnce.Do(func() {
		h.cancel()
		<-h.done
		ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
		defer cancel()
		_, err := h.cli.Revoke(ctx, h.id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			err = nil
		}
		h.revokeErr = err
	})
	return h.revokeErr
}
