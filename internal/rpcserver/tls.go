package rpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/tlsconfig"
)

// ServeOption configures Serve.
type ServeOption func(*serveOptions)

type serveOptions struct {
	tls *tls.Config
}

// WithTLS serves TLS with cfg (tlsconfig.Reloader.ServerConfig) instead of
// HTTP/1.1 and h2c: HTTP/2 and HTTP/1.1 by ALPN, and a connection that
// does not start a TLS handshake is refused. Each request's context
// carries the identity of the caller's verified certificate
// (PeerFromContext).
func WithTLS(cfg *tls.Config) ServeOption {
	return func(o *serveOptions) { o.tls = cfg }
}

type peerKey struct{}

// peer is the identity of a caller's verified certificate.
type peer struct{ node, principal string }

// withPeer puts the identity of the request's verified client certificate,
// if any, in its context, where handlers and interceptors read it with
// PeerFromContext (the principal for access checks, the node for Follow).
func withPeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if node, principal, ok := tlsconfig.PeerIdentity(r.TLS); ok {
			r = r.WithContext(context.WithValue(r.Context(), peerKey{}, peer{node: node, principal: principal}))
		}
		next.ServeHTTP(w, r)
	})
}

// PeerFromContext is the identity of the caller of a request served with
// WithTLS, as its verified certificate names it (tlsconfig.PeerIdentity):
// node for a node's certificate, principal for a client's. ok is false for
// a caller without a certificate (or one naming no identity), and always on
// a server without TLS.
func PeerFromContext(ctx context.Context) (node, principal string, ok bool) {
	p, ok := ctx.Value(peerKey{}).(peer)
	return p.node, p.principal, ok
}

// errNotANode is what a call on a node-only service gets from a caller
// whose certificate is not a node's.
var (
	errNoCert  = errors.New("no client certificate: strand.v1.ReplicationService is for brokers and the recoverer, which present their node certificates")
	errNotNode = errors.New("the caller's certificate is not a node's: strand.v1.ReplicationService is for brokers and the recoverer")
)

// RequireNode admits a handler's calls only from callers whose verified
// certificate names a node (strand://node/NAME): Unauthenticated without a
// certificate, PermissionDenied with a client's. It replaces the peer
// token on a cluster with TLS (docs/operating.md, "Security"); a handler
// that takes a node's word for who it is (Follow's node) checks it against
// PeerFromContext too.
func RequireNode() connect.HandlerOption {
	return connect.WithInterceptors(requireNode{})
}

type requireNode struct{}

func checkNode(ctx context.Context) error {
	node, _, ok := PeerFromContext(ctx)
	if !ok {
		return connect.NewError(connect.CodeUnauthenticated, errNoCert)
	}
	if node == "" {
		return connect.NewError(connect.CodePermissionDenied, errNotNode)
	}
	return nil
}

func (requireNode) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		if err := checkNode(ctx); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (requireNode) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (requireNode) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := checkNode(ctx); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// Dialer is how a service reaches the others: h2c when TLS is nil, else
// TLS with TLS's certificate and CA pool as they are at each new
// connection (tlsconfig.Reloader.DialTLSContext).
type Dialer struct {
	TLS *tlsconfig.Reloader
}

// HTTPClient is HTTPClient for d: h2c, or HTTP/2 over TLS.
func (d Dialer) HTTPClient() *http.Client {
	if d.TLS == nil {
		return HTTPClient()
	}
	tr := newTransport()
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP2(true)
	tr.Protocols.SetHTTP1(true)
	tr.ForceAttemptHTTP2 = true
	tr.DialTLSContext = d.TLS.DialTLSContext(dialer())
	return &http.Client{Transport: tr}
}

// BaseURL is BaseURL for d: an https:// URL with TLS.
func (d Dialer) BaseURL(addr string) string {
	if d.TLS == nil {
		return BaseURL(addr)
	}
	return BaseURLTLS(addr)
}

// HTTPClientTLS is a client that speaks HTTP/2 over TLS with cfg (a
// static configuration; a Dialer's reads renewed files).
func HTTPClientTLS(cfg *tls.Config) *http.Client {
	tr := newTransport()
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP2(true)
	tr.Protocols.SetHTTP1(true)
	tr.ForceAttemptHTTP2 = true
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}
}

// BaseURLTLS turns a host:port into an https:// URL; a URL is kept as it
// is, but an http:// one becomes https:// (addresses learned from etcd and
// hints are host:port, and on a cluster with TLS every one is TLS).
func BaseURLTLS(addr string) string {
	if rest, ok := strings.CutPrefix(addr, "http://"); ok {
		return "https://" + rest
	}
	if strings.HasPrefix(addr, "https://") {
		return addr
	}
	return "https://" + addr
}

func dialer() *net.Dialer {
	return &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}
}
