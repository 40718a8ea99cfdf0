package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
)

// The controller refuses an admin call it has no room for with
// Unavailable and a RetryInfo naming when to ask again (docs/errors.md,
// "AdminService"). The client retries any Unavailable on its own backoff,
// which starts at 20 ms: many creates at once would then ask again long
// before the controller said it has room. So the bench's client waits,
// before the client's retry, the delay the controller named, and gives up
// on a create after maxBusyAttempts refusals (each create is bounded by
// --timeout as well).

// maxBusyAttempts bounds how often one create may be refused busy: at the
// controller's 250 ms delay (plus the client's backoff) about 15 s of
// refusals, within the default --timeout of 30 s.
const maxBusyAttempts = 60

// busyKey carries, in a create's context, how often it was refused busy.
type busyKey struct{}

// withBusyCount gives ctx a count of the busy refusals of the call it is
// for, so waitRetryInfo can bound them.
func withBusyCount(ctx context.Context) context.Context {
	return context.WithValue(ctx, busyKey{}, new(atomic.Int64))
}

// RetryDelay is the delay a Connect error's RetryInfo detail names; ok is
// false when err carries none (or a negative one).
func RetryDelay(err error) (time.Duration, bool) {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return 0, false
	}
	for _, d := range cerr.Details() {
		v, verr := d.Value()
		if verr != nil {
			continue
		}
		if ri, ok := v.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			delay := ri.GetRetryDelay().AsDuration()
			return delay, delay >= 0
		}
	}
	return 0, false
}

// waitRetryInfo is the client interceptor that makes a CreateStream
// refused with Unavailable and a RetryInfo wait the delay named before the
// client's retry loop sees the refusal (and asks again after its own
// backoff). Each such refusal adds to busy. A create whose context carries
// a count (withBusyCount) refused maxBusyAttempts times is answered
// ResourceExhausted instead, which the client does not retry: the bench
// fails with that, naming the controller's refusals.
func waitRetryInfo(busy *atomic.Int64) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			res, err := next(ctx, req)
			if err == nil || connect.CodeOf(err) != connect.CodeUnavailable ||
				req.Spec().Procedure != strandv1connect.AdminServiceCreateStreamProcedure {
				return res, err
			}
			delay, ok := RetryDelay(err)
			if !ok {
				return res, err
			}
			busy.Add(1)
			if n, counted := ctx.Value(busyKey{}).(*atomic.Int64); counted && n.Add(1) >= maxBusyAttempts {
				return nil, connect.NewError(connect.CodeResourceExhausted,
					fmt.Errorf("bench: the controller refused %d attempts as busy: %w", maxBusyAttempts, err))
			}
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return res, err
		}
	}
}
