package rpcserver

import (
	"context"

	"connectrpc.com/connect"
)

// WithBearer sends secret as a bearer token (Authorization: Bearer SECRET)
// on every call of a Connect client; empty sends nothing. It lives here,
// beside WithPeerToken, so the public client sends tokens without
// importing the server side of authentication (internal/auth, which reads
// tokens and grants from etcd).
func WithBearer(secret string) connect.ClientOption {
	return connect.WithInterceptors(bearer(secret))
}

type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if b != "" && req.Spec().IsClient {
			req.Header().Set("Authorization", "Bearer "+string(b))
		}
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		}
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
