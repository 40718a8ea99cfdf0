package rpcserver

import (
	"context"
	"crypto/sha256"
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
// strand.v1.ReplicationService (Follow, Seal), which is for peers only
// (docs/operating.md, "Peer token"). A client that could call Seal could fence any copy and stop its
// stream until a recovery; one that could call Follow could read any stream
// around the confirm watermark.
const PeerTokenEnv = "STRAND_PEER_TOKEN"

// PeerTokenAcceptEnv names the environment variable that holds tokens a
// broker accepts besides its own peer token, comma separated, but never
// sends: what lets a cluster change its token with rolling restarts instead
// of restarting every node at once (docs/operating.md, "Peer token").
const PeerTokenAcceptEnv = "STRAND_PEER_TOKEN_ACCEPT"

// PeerToken reads the peer token from the environment (empty: unset),
// without surrounding white space: a token put there from a file often
// ends in a newline.
func PeerToken() string { return strings.TrimSpace(os.Getenv(PeerTokenEnv)) }

// PeerTokensAccepted reads the extra accepted tokens from the environment:
// PeerTokenAcceptEnv split at commas, each without surrounding white space,
// empty entries dropped (nil when unset).
func PeerTokensAccepted() []string {
	var out []string
	for t := range strings.SplitSeq(os.Getenv(PeerTokenAcceptEnv), ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// ValidatePeerTokens refuses tokens that cannot travel in an HTTP header
// as they are (anything but visible ASCII), and tokens accepted without one
// of the node's own, which would leave a broker open (no token admits every
// call) while it looks closed. Brokers and the recoverer (accepted nil)
// refuse to start with either, rather than fail every Follow and Seal
// later.
func ValidatePeerTokens(token string, accepted []string) error {
	if err := validateToken(token); err != nil {
		return fmt.Errorf("%s: %w", PeerTokenEnv, err)
	}
	if len(accepted) > 0 && token == "" {
		return fmt.Errorf("%s is set but %s is not: set the token this node sends (and accepts) too", PeerTokenAcceptEnv, PeerTokenEnv)
	}
	for i, t := range accepted {
		if err := validateToken(t); err != nil {
			return fmt.Errorf("%s: token %d: %w", PeerTokenAcceptEnv, i+1, err)
		}
	}
	return nil
}

func validateToken(token string) error {
	for i := 0; i < len(token); i++ {
		if c := token[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("byte %d is not visible ASCII (0x%02x); use letters, digits and punctuation, e.g. openssl rand -hex 16", i, c)
		}
	}
	return nil
}

// errPeerToken is what a call without the right token gets. It does not say
// which was wrong: a missing token, a wrong one, or the scheme.
var errPeerToken = errors.New("peer token: missing or wrong (strand.v1.ReplicationService is for brokers and the recoverer; set " + PeerTokenEnv + " to the cluster's token)")

// RequirePeerToken admits a handler's calls only when they carry token, or
// one of accepted (a rotation under way), as a bearer token (Authorization:
// Bearer TOKEN), and answers Unauthenticated otherwise, before the handler
// runs: no stream state is read or changed (a unary request's message has
// been decoded by then; a stream's first message is never received). An
// empty token admits every call: a cluster without a token is open, as
// before tokens existed.
func RequirePeerToken(token string, accepted ...string) connect.HandlerOption {
	a := peerAuth{token: token}
	if token != "" {
		for _, t := range append([]string{token}, accepted...) {
			a.admitted = append(a.admitted, sha256.Sum256([]byte("Bearer "+t)))
		}
	}
	return connect.WithInterceptors(a)
}

// WithPeerToken sends token as a bearer token on every call of a client
// (nothing when empty).
func WithPeerToken(token string) connect.ClientOption {
	return connect.WithInterceptors(peerAuth{token: token})
}

// peerAuth is both sides of the peer token: clients add token, handlers
// admit a header whose digest is one of admitted (the token's and the
// accepted ones'). Digests are compared, every one of them, in constant
// time: the time taken tells neither a token's length nor which one
// matched.
type peerAuth struct {
	token    string
	admitted [][sha256.Size]byte
}

func (a peerAuth) header() string { return "Bearer " + a.token }

func (a peerAuth) admits(h http.Header) bool {
	if a.token == "" {
		return true
	}
	got := sha256.Sum256([]byte(h.Get("Authorization")))
	ok := 0
	for _, want := range a.admitted {
		ok |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return ok == 1
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
