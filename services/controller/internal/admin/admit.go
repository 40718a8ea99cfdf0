package admin

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrBusy refuses an admin call the controller has no room for: more calls
// than it serves at once are running and more than it queues are waiting,
// or the call waited its turn for as long as a call may (docs/errors.md,
// "AdminService"). Nothing of the call was read from or written to etcd.
var ErrBusy = errors.New("admin: too many concurrent admin calls; retry")

// Defaults of the admission bounds (Config.MaxCalls, MaxQueued, QueueWait).
//
// Every admin call reads the view brought up to etcd's current revision and
// most commit a transaction; on a small machine a few dozen at once keep
// etcd's batching busy, and more only lengthen every call. The queue holds
// a burst's worth of calls without refusing them; beyond it a caller is
// told at once instead of being held until its deadline, so a flood of
// creations is answered (created, or refused) rather than left hanging.
const (
	DefaultMaxCalls  = 64
	DefaultMaxQueued = 2048
	DefaultQueueWait = 5 * time.Second
	// busyRetryDelay is the retry delay a refused call is told (RetryInfo).
	busyRetryDelay = 250 * time.Millisecond
)

// admission bounds the admin calls served at once, and those waiting for
// their turn.
type admission struct {
	// slots holds one token per call being served; a call waits for a
	// token in arrival order (a channel's blocked senders are woken first
	// come, first served).
	slots chan struct{}
	// queue holds one token per call waiting for a slot.
	queue chan struct{}
	wait  time.Duration
}

func newAdmission(calls, queued int, wait time.Duration) *admission {
	return &admission{slots: make(chan struct{}, calls), queue: make(chan struct{}, queued), wait: wait}
}

// admit waits for a slot and returns the function that gives it back. A
// call finding every slot and queue place taken, or still waiting after
// the queue wait, is refused with ErrBusy; one whose context ends while it
// waits gets its context's error.
//
// release gives the slot back once however often it is called, so a call
// may give it back early (before a wait that needs no etcd, as handover's
// for its commit) and still defer it: a second receive would take another
// call's slot.
func (s *Service) admit(ctx context.Context) (release func(), err error) {
	a := s.admission
	release = sync.OnceFunc(func() { <-a.slots })
	select {
	case a.slots <- struct{}{}:
		return release, nil
	default:
	}
	select {
	case a.queue <- struct{}{}:
	default:
		return nil, busy()
	}
	defer func() { <-a.queue }()
	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, busy()
	case <-ctx.Done():
		return nil, s.toConnect(ctx.Err())
	}
}

// busy is ErrBusy as a Connect error: Unavailable, the code every client
// retries with backoff, with a RetryInfo detail saying when.
func busy() *connect.Error {
	err := connect.NewError(connect.CodeUnavailable, ErrBusy)
	if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(busyRetryDelay)}); derr == nil {
		err.AddDetail(d)
	}
	return err
}
