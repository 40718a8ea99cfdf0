package rpcserver

import (
	"context"
	"time"

	"connectrpc.com/connect"
)

// DefaultTimeout bounds unary calls that arrive without a deadline of their
// own (a Connect, gRPC or gRPC-Web client that sets one sends it, and the
// handler's context carries it): such a call waiting on etcd while etcd is
// unreachable answers DeadlineExceeded after d instead of holding its
// connection and handler for as long as etcd is away.
func DefaultTimeout(d time.Duration) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			return next(ctx, req)
		}
	})
}
