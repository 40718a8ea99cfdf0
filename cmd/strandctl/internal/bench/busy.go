package bench

import (
	"context"
	"fmt"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcerr"
)

// The controller refuses an admin call it has no room for with
// Unavailable and a RetryInfo naming when to ask again (docs/errors.md,
// "AdminService"); the client waits at least that long before it asks
// again. The bench counts those refusals (create_busy_retries) and gives
// up on a create after maxBusyAttempts of them (each create is bounded by
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

// waitRetryInfo is the client interceptor that counts a CreateStream
// refused with Unavailable and a RetryInfo (the client's retry loop then
// waits the delay named, rpcerr.RetryDelay). Each such refusal adds to
// busy. A create whose context carries
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
			if _, ok := rpcerr.RetryDelay(err); !ok {
				return res, err
			}
			busy.Add(1)
			if n, counted := ctx.Value(busyKey{}).(*atomic.Int64); counted && n.Add(1) >= maxBusyAttempts {
				return nil, connect.NewError(connect.CodeResourceExhausted,
					fmt.Errorf("bench: the controller refused %d attempts as busy: %w", maxBusyAttempts, err))
			}
			return res, err
		}
	}
}
