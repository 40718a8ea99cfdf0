package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Defaults of the broker's per-principal limits (strand-broker
// --principal-publish-bytes-per-second, --principal-max-subscriptions).
const (
	DefaultPublishBytesPerSecond = 64 << 20
	DefaultMaxSubscriptions      = 256
)

// TransportPrincipal names the principal the transport proved, if any:
// the subject of a verified client certificate (ConnState gives the TLS
// state of the call's connection). It is asked only when a call carries no
// bearer token.
type TransportPrincipal func(ctx context.Context, spec connect.Spec, peer connect.Peer, header http.Header) (principal string, ok bool)

// Options turn authentication on for a service (each app's Config.Auth).
type Options struct {
	// Enabled checks every client call; off, nothing is checked (a cluster
	// run --insecure, or one that predates auth).
	Enabled bool
	// PublishBytesPerSecond bounds each principal's publish request bytes
	// per second, a token bucket holding one second's worth (0: default).
	PublishBytesPerSecond int
	// MaxSubscriptions bounds each principal's concurrent subscriptions on
	// one broker (0: default).
	MaxSubscriptions int
	// Transport names a principal from the transport (nil: the subject of
	// a verified client certificate, CertPrincipal).
	Transport TransportPrincipal
}

// Guard is the server interceptor of every client-facing service: it
// authenticates each call, checks it against Rules and the cache's grants,
// and counts it against the principal's limits, all before the handler
// runs, so a refused call changes nothing (a unary request has been
// decoded by then; nothing of a stream is read but its first message).
type Guard struct {
	cache     *Cache
	transport TransportPrincipal
	rules     map[string]Rule

	rate  rate.Limit
	burst int
	subs  int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
	active  map[string]int
}

// NewGuard returns the guard of opts, judging by cache.
func NewGuard(cache *Cache, opts Options) *Guard {
	if opts.PublishBytesPerSecond <= 0 {
		opts.PublishBytesPerSecond = DefaultPublishBytesPerSecond
	}
	if opts.MaxSubscriptions <= 0 {
		opts.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if opts.Transport == nil {
		opts.Transport = CertPrincipal
	}
	return &Guard{cache: cache, transport: opts.Transport, rules: Rules,
		rate: rate.Limit(opts.PublishBytesPerSecond), burst: opts.PublishBytesPerSecond, subs: opts.MaxSubscriptions,
		buckets: map[string]*rate.Limiter{}, active: map[string]int{}}
}

// Option is the guard as a handler option.
func (g *Guard) Option() connect.HandlerOption { return connect.WithInterceptors(g) }

var errCredentials = errors.New("missing or unknown credentials: send Authorization: Bearer TOKEN (strandctl token create) or a client certificate")

// loadWait bounds how long a call waits for the credential cache to be
// current (Cache.Wait) before it is answered Unavailable.
const loadWait = 5 * time.Second

// wait waits for the cache, or answers Unavailable.
func (g *Guard) wait(ctx context.Context) error {
	// The cache is current nearly always: spare the timer of a deadline.
	if g.cache.Current() {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, loadWait)
	defer cancel()
	if err := g.cache.Wait(wctx); err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("credentials not loaded from etcd yet (%w); retry", err))
	}
	return nil
}

// bearer returns the principal of the Authorization header value v, or
// Unauthenticated: a value that is not a bearer token of a secret etcd
// holds.
func (g *Guard) bearer(ctx context.Context, v string) (string, error) {
	scheme, secret, _ := strings.Cut(v, " ")
	if strings.EqualFold(scheme, "Bearer") {
		secret = strings.TrimSpace(secret)
		if p, ok := g.cache.Authenticate(secret); ok {
			return p, nil
		}
		// Unknown here may be only not here yet: a token made a moment
		// ago. A secret without the prefix can never match.
		if strings.HasPrefix(secret, TokenPrefix) {
			if err := g.sync(ctx); err != nil {
				return "", err
			}
			if p, ok := g.cache.Authenticate(secret); ok {
				return p, nil
			}
		}
	}
	return "", connect.NewError(connect.CodeUnauthenticated, errCredentials)
}

// sync brings the cache up to etcd before a refusal (Cache.Sync), or
// answers Unavailable: a refusal the node could not confirm is not made.
func (g *Guard) sync(ctx context.Context) error {
	if err := g.cache.Sync(ctx); err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("credentials could not be read from etcd to confirm a refusal (%w); retry", err))
	}
	return nil
}

// allowed reports whether principal holds one of perms on stream, asking
// etcd (Cache.Sync) before it says no: a grant made a moment ago may not
// have reached this node's watch yet. The error is Unavailable when etcd
// could not be read.
func (g *Guard) allowed(ctx context.Context, principal string, perms []Permission, stream string) (bool, error) {
	check := func() bool {
		for _, p := range perms {
			if g.cache.Allowed(principal, p, stream) {
				return true
			}
		}
		return false
	}
	if check() {
		return true, nil
	}
	if err := g.sync(ctx); err != nil {
		return false, err
	}
	return check(), nil
}

// identify returns the call's principal: its bearer token's, else the
// transport's. A token that is sent but unknown (revoked) is refused even
// when the transport names someone: the client meant the token.
func (g *Guard) identify(ctx context.Context, spec connect.Spec, peer connect.Peer, h http.Header) (string, error) {
	if err := g.wait(ctx); err != nil {
		return "", err
	}
	if v := h.Get("Authorization"); v != "" {
		return g.bearer(ctx, v)
	}
	if g.transport != nil {
		if p, ok := g.transport(ctx, spec, peer, h); ok && p != "" {
			return p, nil
		}
	}
	return "", connect.NewError(connect.CodeUnauthenticated, errCredentials)
}

// Precheck refuses, before h reads a request's body, what identify would
// refuse from the headers alone: a call with an unknown bearer token, and
// one with none when there is no transport to name a principal. A client
// without credentials so costs the service no read or decode of a publish
// (nor a place among the publish bytes in flight). It answers in the
// call's own protocol (connect.ErrorWriter); the interceptor still checks
// every call.
func (g *Guard) Precheck(h http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("Authorization")
		if (v != "" || g.transport == nil) && ew.IsSupported(r) {
			err := g.wait(r.Context())
			if err == nil {
				if v == "" {
					err = connect.NewError(connect.CodeUnauthenticated, errCredentials)
				} else {
					_, err = g.bearer(r.Context(), v)
				}
			}
			if err != nil {
				_ = ew.Write(w, r, err)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// Denied is the PermissionDenied of a call principal may not make: the
// message names the permission and the stream ("*" for the cluster-wide
// calls), and an ErrorInfo detail carries both.
func Denied(principal string, perms []Permission, stream string) *connect.Error {
	names := make([]string, len(perms))
	for i, p := range perms {
		names[i] = string(p)
	}
	perm := strings.Join(names, " or ")
	err := connect.NewError(connect.CodePermissionDenied,
		fmt.Errorf("principal %q has no %s permission on stream %q (strandctl acl grant)", principal, perm, stream))
	if d, derr := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "PERMISSION_DENIED", Domain: "strand.v1",
		Metadata: map[string]string{"principal": principal, "permission": perm, "stream": stream}}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// authorize checks rule for principal, msg being the request (nil for a
// rule that reads no field).
func (g *Guard) authorize(ctx context.Context, rule Rule, principal string, msg any) error {
	var stream string
	switch rule.Scope {
	case Authenticated:
		return nil
	case OnCluster:
		stream = All
	case OnStream:
		// A malformed name is the handler's to refuse, naming the field,
		// once a grant covers it (only "*" covers an empty one).
		stream = streamOf(msg, rule.Field)
	default:
		return connect.NewError(connect.CodeInternal, errors.New("auth: no rule scope"))
	}
	ok, err := g.allowed(ctx, principal, rule.Perms, stream)
	switch {
	case err != nil:
		return err
	case !ok:
		return Denied(principal, rule.Perms, stream)
	}
	return nil
}

// streamOf reads the string field of msg.
func streamOf(msg any, field string) string {
	m, ok := msg.(proto.Message)
	if !ok {
		return ""
	}
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(field))
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return ""
	}
	return r.Get(fd).String()
}

func (g *Guard) rule(procedure string) (Rule, error) {
	r, ok := g.rules[procedure]
	if !ok {
		return Rule{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("procedure %s has no permission rule; refused", procedure))
	}
	return r, nil
}

// publish takes size bytes from principal's bucket, or answers
// ResourceExhausted: with a RetryInfo saying when the bucket holds them,
// or without one for a request larger than the bucket, which never will.
func (g *Guard) publish(principal string, size int) error {
	g.mu.Lock()
	b := g.buckets[principal]
	if b == nil {
		b = rate.NewLimiter(g.rate, g.burst)
		g.buckets[principal] = b
	}
	g.mu.Unlock()
	now := time.Now()
	r := b.ReserveN(now, size)
	if !r.OK() {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("principal %q: a publish of %d bytes exceeds its limit of %d bytes per second; send smaller batches", principal, size, g.burst))
	}
	delay := r.DelayFrom(now)
	if delay == 0 {
		return nil
	}
	r.CancelAt(now)
	err := connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("principal %q: publish rate above its limit of %d bytes per second; retry in %v", principal, g.burst, delay.Round(time.Millisecond)))
	if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// subscribe takes one of principal's subscription slots; release gives it
// back. No RetryInfo: a retry helps only once one of the principal's own
// subscriptions ends.
func (g *Guard) subscribe(principal string) (release func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active[principal] >= g.subs {
		return nil, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("principal %q already has %d subscriptions on this broker, its limit", principal, g.subs))
	}
	g.active[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.active[principal]--; g.active[principal] <= 0 {
				delete(g.active, principal)
			}
		})
	}, nil
}

// WrapUnary checks a unary call before its handler runs.
func (g *Guard) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		rule, err := g.rule(req.Spec().Procedure)
		if err != nil {
			return nil, err
		}
		if rule.Scope == Peer {
			return next(ctx, req)
		}
		principal, err := g.identify(ctx, req.Spec(), req.Peer(), req.Header())
		if err != nil {
			return nil, err
		}
		if rule.Scope == OnEntries {
			// Set on every such call, before its handler runs: CheckEntry
			// refuses every entry of a call without it.
			return next(context.WithValue(ctx, entryKey{}, &entryGuard{g: g, rule: rule, principal: principal}), req)
		}
		if err := g.authorize(ctx, rule, principal, req.Any()); err != nil {
			return nil, err
		}
		if rule.Limit == PublishBytes {
			size := 0
			if m, ok := req.Any().(proto.Message); ok {
				size = proto.Size(m)
			}
			if err := g.publish(principal, size); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
}

type entryKey struct{}

// entryGuard checks the entries of an OnEntries call for its principal;
// open, it checks nothing (auth off, Open).
type entryGuard struct {
	open      bool
	g         *Guard
	rule      Rule
	principal string
}

// openEntries is the marker Open puts on the OnEntries calls of a service
// run with auth off.
var openEntries = &entryGuard{open: true}

// errNoEntryGuard refuses an entry whose call carries no marker.
var errNoEntryGuard = errors.New("auth: the call carries no entry guard (its service runs neither auth.Guard nor auth.Open); entry refused unchecked")

// CheckEntry checks one entry of an OnEntries call (PublishMany), entry
// being the request it stands for (a PublishRequest) and stream the stream
// it names: the permission a call of that request alone needs on stream,
// then its size against the principal's limit, as WrapUnary checks a
// Publish, so an entry is refused exactly when that Publish would be.
//
// It fails closed: auth off is a positive marker (Open), and a call with
// no marker at all, a service wired with neither the guard nor Open, has
// every entry refused rather than run unchecked (docs/operating.md,
// "Permissions"). The refusal is Internal, not PermissionDenied: the
// caller lacks no grant, the server lacks its wiring, and PermissionDenied
// would send an operator granting what is already granted.
func CheckEntry(ctx context.Context, stream string, entry proto.Message) error {
	eg, ok := ctx.Value(entryKey{}).(*entryGuard)
	if !ok || eg == nil {
		return connect.NewError(connect.CodeInternal, errNoEntryGuard)
	}
	if eg.open {
		return nil
	}
	ok, err := eg.g.allowed(ctx, eg.principal, eg.rule.Perms, stream)
	switch {
	case err != nil:
		return err
	case !ok:
		return Denied(eg.principal, eg.rule.Perms, stream)
	case eg.rule.Limit == PublishBytes:
		return eg.g.publish(eg.principal, proto.Size(entry))
	}
	return nil
}

// Open is the interceptor a client-facing service runs in place of a
// Guard when auth is off (--insecure, Options.Enabled false): it checks no
// call, and marks each OnEntries call open, so CheckEntry lets its entries
// through. Auth off is so said, never inferred from a missing guard.
func Open() connect.HandlerOption { return connect.WithInterceptors(openGuard{}) }

type openGuard struct{}

func (openGuard) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient && Rules[req.Spec().Procedure].Scope == OnEntries {
			ctx = context.WithValue(ctx, entryKey{}, openEntries)
		}
		return next(ctx, req)
	}
}

func (openGuard) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (openGuard) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// WrapStreamingClient leaves client streams alone.
func (g *Guard) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler authenticates a stream at once and authorises it
// on its first message, which names the stream: the handler's first
// Receive fails with the refusal, before the handler has the request.
func (g *Guard) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		rule, err := g.rule(conn.Spec().Procedure)
		if err != nil {
			return err
		}
		if rule.Scope == Peer {
			return next(ctx, conn)
		}
		principal, err := g.identify(ctx, conn.Spec(), conn.Peer(), conn.RequestHeader())
		if err != nil {
			return err
		}
		gc := &guardedConn{StreamingHandlerConn: conn, ctx: ctx, g: g, rule: rule, principal: principal}
		defer gc.release()
		return next(ctx, gc)
	}
}

// guardedConn authorises a stream at its first message.
type guardedConn struct {
	connect.StreamingHandlerConn
	// ctx is the call's: it bounds the wait of a refusal's read of etcd
	// (Guard.allowed).
	ctx       context.Context
	g         *Guard
	rule      Rule
	principal string
	checked   bool
	err       error
	done      func()
}

func (c *guardedConn) Receive(msg any) error {
	if c.err != nil {
		return c.err
	}
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if c.checked {
		return nil
	}
	c.checked = true
	if c.err = c.g.authorize(c.ctx, c.rule, c.principal, msg); c.err != nil {
		return c.err
	}
	if c.rule.Limit == Subscriptions {
		c.done, c.err = c.g.subscribe(c.principal)
	}
	return c.err
}

func (c *guardedConn) release() {
	if c.done != nil {
		c.done()
	}
}

type connStateKey struct{}

// WithConnState puts each request's TLS state (nil without TLS) into its
// context, where ConnState finds it: connect-go hands interceptors the
// request's context but not the request, so a TransportPrincipal reads the
// client certificate from there.
func WithConnState(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil {
			r = r.WithContext(context.WithValue(r.Context(), connStateKey{}, r.TLS))
		}
		h.ServeHTTP(w, r)
	})
}

// ConnState is the TLS state WithConnState recorded, or nil.
func ConnState(ctx context.Context) *tls.ConnectionState {
	s, _ := ctx.Value(connStateKey{}).(*tls.ConnectionState)
	return s
}

// WithBearer is rpcserver.WithBearer, the client side of the guard's
// bearer tokens.
func WithBearer(secret string) connect.ClientOption { return rpcserver.WithBearer(secret) }

// CertPrincipal is the TransportPrincipal of a TLS listener: the principal
// a verified client certificate names (tlsconfig.PeerIdentity; a
// strand://client/PRINCIPAL URI SAN). A node certificate names no client
// principal, and a connection without TLS or without a verified chain
// names none (docs/operating.md, "Security").
func CertPrincipal(ctx context.Context, _ connect.Spec, _ connect.Peer, _ http.Header) (string, bool) {
	_, principal, ok := tlsconfig.PeerIdentity(ConnState(ctx))
	if !ok || principal == "" {
		return "", false
	}
	return principal, true
}
