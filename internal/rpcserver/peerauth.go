package rpcserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"
)

// PeerTokenEnv names the environment variable that holds the peer token:
// the shared secret brokers and the recoverer present to each other on
// strand.v1.ReplicationService (Follow, Seal), which DESIGN.md reserves for
// peers. A client that could call Seal could fence any copy and stop its
// stream until a recovery; one that could call Follow could read any stream
// around the confirm watermark.
const PeerTokenEnv = "STRAND_PEER_TOKEN"

// PeerToken reads the peer token from the environment (empty: unset),
// without surrounding white space: a token put there from a file often
// ends in a newline.
func PeerToken() string { return strings.TrimSpace(os.Getenv(PeerTokenEnv)) }

// ValidatePeerToken refuses a token that cannot travel in an HTTP header
// as it is: anything but visible ASCII. Brokers and the recoverer refuse
// to start with one, rather than fail every Follow and Seal later.
func ValidatePeerToken(token string) error {
	for i := 0; i < len(token); i++ {
		if c := token[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%s: byte %d is not visible ASCII (0x%02x); use letters, digits and punctuation, e.g. openssl rand -hex 16", PeerTokenEnv, i, c)
		}
	}
	return nil
}

// errPeerToken is what a call without the right token gets. It does not say
// which was wrong: a missing token, a wrong one, or the scheme.
var errPeerToken = errors.New("peer token: missing or wrong (strand.v1.ReplicationService is for brokers and the recoverer; set " + PeerTokenEnv + " to the cluster's token)")

// RequirePeerToken admits a handler's calls only when they carry token as a
// bearer token (Authorization: Bearer TOKEN), and answers Unauthenticated
// otherwise, before the handler runs: no stream state is read or changed
// (a unary request's message has been decoded by then; a stream's first
// message is never received). An empty token admits every call: a cluster
// without a token is open, as before tokens existed.
func RequirePeerToken(token string) connect.HandlerOption {
	return connect.WithInterceptors(peerAuth{token: token})
}

// WithPeerToken sends token as a bearer token on every call of a client
// (nothing when empty).
func WithPeerToken(token string) connect.ClientOption {
	return connect.WithInterceptors(peerAuth{token: token})
}

// peerAuth is both sides of the peer token: clients add it, handlers check
// it. The comparison takes the same time wherever the tokens differ.
type peerAuth struct{ token string }

func (a peerAuth) header() string { return "Bearer " + a.token }

func (a peerAuth) admits(h http.Header) bool {
	if a.token == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(h.Get("Authorization")), []byte(a.header())) == 1
}

func (a peerAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			if a.token != "" {
				req.Header().Set("Authorization", a.header())
			}
			return next(ctx, req)
		}
		if !a.admits(req.Header()) {
			return nil, connect.NewError(connect.CodeUnauthenticated, errPeerToken)
		}
		return next(ctx, req)
	}
}

func (a peerAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if a.token != "" {
			conn.RequestHeader().Set("Authorization", a.header())
		}
		return conn
	}
}

func (a peerAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !a.admits(conn.RequestHeader()) {
			return connect.NewError(connect.CodeUnauthenticated, errPeerToken)
		}
		return next(ctx, conn)
	}
}
