package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcserver"
)

// Defaults for Config fields left zero.
const (
	DefaultRetryBudget    = 30 * time.Second
	DefaultAttemptTimeout = 10 * time.Second
	DefaultLocateTimeout  = time.Second
	DefaultProbeAfter     = time.Second
	DefaultBackoffMin     = 20 * time.Millisecond
	DefaultBackoffMax     = 500 * time.Millisecond
	// DefaultMaxBatchRecords bounds a merged batch well inside the
	// brokers' default dedupe window (strand-broker --dedupe-window, 65536
	// records per producer, in --dedupe-batches 256 batches): a retried
	// batch is answered as duplicates only while its first record is still
	// in the window.
	DefaultMaxBatchRecords = 1024
	DefaultMaxBatchBytes   = 4 << 20
	DefaultLinger          = 2 * time.Millisecond
	// DefaultStreamIdle is Kafka's producer default for the same purpose
	// (metadata.max.idle.ms).
	DefaultStreamIdle = 5 * time.Minute
)

// Config configures a Client. Zero fields take the defaults above.
type Config struct {
	// Controller is the controller's address (host:port or URL), used by
	// Admin and to discover brokers when Brokers is empty.
	Controller string
	// Brokers are broker addresses to locate owners with; owners and hints
	// learned later are added to them.
	Brokers []string
	// HTTPClient defaults to a client that speaks HTTP/2 without TLS
	// (h2c), as Strand's services serve with --insecure, or over TLS with
	// TLS when it is set.
	HTTPClient *http.Client
	// TLS, when set, makes every connection TLS: addresses are dialled as
	// https:// (host:port addresses, and those learned from brokers, too)
	// and the default HTTPClient speaks HTTP/2 over TLS with this
	// configuration (its RootCAs the cluster's CA, its Certificates the
	// client certificate, if any). A secure dev cluster's is in
	// DevClusterConfig's answer.
	TLS *tls.Config
	// Options are passed to every Connect client.
	Options []connect.ClientOption
	// Token is a bearer token (strandctl token create) sent on every call
	// as Authorization: Bearer TOKEN; empty sends none (docs/operating.md,
	// "Security").
	Token string

	// Idempotent stamps a producer id and per-stream sequences on published
	// records so retries are stored once. nil means true.
	Idempotent *bool
	// ProducerID names this client's producers; empty picks a random id.
	// It is the prefix of the ids stamped: each Client adds a session of
	// its own (ProducerID-<random>), because a new client's sequences
	// start at 1 again and a broker would take them for retries of what an
	// earlier client stored under the same id, answering duplicate and
	// storing nothing. At most MaxProducerIDPrefix bytes.
	ProducerID string

	// RetryBudget bounds retries of a call whose context has no deadline.
	RetryBudget time.Duration
	// AttemptTimeout bounds one attempt of a unary call, so a broker that
	// stopped answering (SIGSTOP, partition) is given up on.
	AttemptTimeout time.Duration
	// LocateTimeout bounds one Locate call against one broker.
	LocateTimeout time.Duration
	// ProbeAfter is how long an attempt runs before the client also asks
	// another broker who owns the stream; if the owner moved, the attempt is
	// abandoned and retried at the new owner.
	ProbeAfter time.Duration
	// BackoffMin and BackoffMax bound the jittered exponential backoff.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// MaxBatchRecords and MaxBatchBytes bound the requests a lane merges
	// publishes into (concurrent Publish calls of an idempotent client,
	// and every PublishAsync). A single call larger than them is still
	// sent whole. Keep MaxBatchRecords at most the brokers' dedupe window
	// (--dedupe-window, 65536 records by default): a batch's retry after
	// a lost answer is answered as duplicates only while its first record
	// is in the window.
	MaxBatchRecords int
	// Lanes is how many batches one stream may have in flight at once
	// (default 1). Each lane is its own producer id with its own
	// sequences, so the broker sees every producer's sequences in order.
	// Publishes from one lane keep their order; concurrent Publish calls
	// have no order among themselves anyway. One lane sends everything
	// queued while its batch is in flight as the next batch, and fewer,
	// larger batches cost the cluster less per record than more lanes of
	// smaller ones: with 256 publishes in flight on 3 copies, 1 lane did
	// about 1.5x the records/s of 2 on a 2-core machine, 1.1x with Linger
	// off, which only a single lane uses (strandctl bench --lanes).
	Lanes         int
	MaxBatchBytes int
	// Linger bounds how long a lane waits, once a batch is confirmed, for
	// the Publish calls that batch released to publish again before it
	// sends the next batch (Kafka's linger.ms, but ended early): the wait
	// ends as soon as the lane holds as many calls as it had queued plus
	// those it just confirmed, or a full batch. A lane whose wait runs out
	// (its callers publish once and leave) skips the waits of its next
	// confirms, twice as many after each such wait, up to 64. Only a
	// single lane lingers: with several, a released caller may come back
	// on any lane. Zero means DefaultLinger;
	// negative never waits. See producer.linger for why. It also bounds
	// how long a batch ready for a broker whose two requests in flight are
	// unanswered waits to be gathered with other streams' batches into one
	// PublishMany (docs/api.md, "PublishMany").
	Linger time.Duration
	// StreamIdle is how long the client keeps what it holds for a stream
	// (its cached owner, its lanes with their producer ids and sequences)
	// after the stream's last use, so a long-lived client that publishes
	// to many short-lived streams does not grow without bound. A lane
	// with a publish queued or in flight is never freed: its records may
	// still be retried under its producer id and sequences. A stream
	// published to again after it was freed gets new lanes, each with a
	// producer session of its own (ProducerID). Zero means
	// DefaultStreamIdle; negative keeps every stream's state until the
	// client is dropped.
	StreamIdle time.Duration
}

// Bool returns a pointer to v, for Config.Idempotent.
func Bool(v bool) *bool { return &v }

// ErrNoBrokers is returned when the client knows no broker to ask.
var ErrNoBrokers = errors.New("client: no broker addresses (set Config.Brokers or Config.Controller)")

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("client: closed")

// Client talks to a Strand cluster. It is safe for concurrent use.
type Client struct {
	cfg        Config
	httpClient *http.Client
	// baseURL makes the URL of an address: http:// or, with Config.TLS,
	// https://.
	baseURL    func(addr string) string
	idempotent bool
	admin      *adminClient

	// ctx is cancelled by Close; background publish batches run under it.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// brokers are the known broker addresses, in the order to try them;
	// next rotates the first one Locate asks.
	brokers []string
	next    int
	// streams holds a StreamService client, and its publish sender, per
	// broker address.
	streams map[string]*brokerConn
	// perStream holds what the client keeps per stream; sweep frees the
	// entries idle for Config.StreamIdle. sweeping is set while a
	// sweepIdle goroutine runs: one per client, and none while there is
	// nothing to free, so a client dropped without Close keeps no
	// goroutine, and is not kept alive by one, much beyond its streams'
	// idle time.
	perStream map[string]*streamState
	sweeping  bool
	// freedLanes is set once sweep has freed any stream's lanes: from then
	// on lanes are made with a session of their own (producer).
	freedLanes bool
	nextLane   atomic.Uint64
	// idPrefix is Config.ProducerID as configured (newProducerID).
	idPrefix string
}

// streamState is what a Client keeps for one stream.
type streamState struct {
	owner string      // cached owner address, "" when not known
	lanes []*producer // made by the stream's first publish through lanes
	used  time.Time   // the last call that touched the stream
}

// New returns a client for the cluster cfg describes. It does not dial.
func New(cfg Config) (*Client, error) {
	if cfg.Controller == "" && len(cfg.Brokers) == 0 {
		return nil, ErrNoBrokers
	}
	baseURL := rpcserver.BaseURL
	if cfg.TLS != nil {
		baseURL = rpcserver.BaseURLTLS
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = rpcserver.HTTPClient()
		if cfg.TLS != nil {
			cfg.HTTPClient = rpcserver.HTTPClientTLS(cfg.TLS)
		}
	}
	setDefault(&cfg.RetryBudget, DefaultRetryBudget)
	setDefault(&cfg.AttemptTimeout, DefaultAttemptTimeout)
	setDefault(&cfg.LocateTimeout, DefaultLocateTimeout)
	setDefault(&cfg.ProbeAfter, DefaultProbeAfter)
	setDefault(&cfg.BackoffMin, DefaultBackoffMin)
	setDefault(&cfg.BackoffMax, DefaultBackoffMax)
	setDefault(&cfg.MaxBatchRecords, DefaultMaxBatchRecords)
	setDefault(&cfg.Lanes, 1)
	setDefault(&cfg.MaxBatchBytes, DefaultMaxBatchBytes)
	setDefault(&cfg.Linger, DefaultLinger)
	setDefault(&cfg.StreamIdle, DefaultStreamIdle)
	if len(cfg.ProducerID) > MaxProducerIDPrefix {
		return nil, fmt.Errorf("client: ProducerID of %d bytes above the %d-byte limit", len(cfg.ProducerID), MaxProducerIDPrefix)
	}
	idPrefix := cfg.ProducerID
	cfg.ProducerID = newProducerID(idPrefix)
	if cfg.Token != "" {
		cfg.Options = append(slices.Clone(cfg.Options), rpcserver.WithBearer(cfg.Token))
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		cfg:        cfg,
		idPrefix:   idPrefix,
		httpClient: cfg.HTTPClient,
		baseURL:    baseURL,
		idempotent: cfg.Idempotent == nil || *cfg.Idempotent,
		ctx:        ctx,
		cancel:     cancel,
		streams:    make(map[string]*brokerConn),
		perStream:  make(map[string]*streamState),
	}
	for _, b := range cfg.Brokers {
		c.learnBroker(b)
	}
	c.admin = newAdminClient(c)
	return c, nil
}

// Close stops background publish batches; calls waiting on them fail with
// ErrClosed. It does not close the HTTP client's idle connections.
func (c *Client) Close() error {
	c.cancel()
	return nil
}

// MaxProducerIDPrefix bounds Config.ProducerID: what is left of a broker's
// 256-byte producer id after the client's session (25 bytes) and a lane's
// suffix (up to 4).
const MaxProducerIDPrefix = 256 - 25 - 4

// ProducerID is the producer id the client stamps on records of streams that
// have not had a failed publish (after one, that stream gets a fresh id):
// Config.ProducerID with this client's session added. Once the client has
// freed an idle stream's state (Config.StreamIdle), lanes it makes from then
// on get a fresh id too: a stream published to again must not restart its
// sequences at 1 under an id the broker already holds sequences of.
func (c *Client) ProducerID() string { return c.cfg.ProducerID }

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// newProducerID returns a producer id no client used before: prefix (the
// configured Config.ProducerID) with a random session, or a random id.
func newProducerID(prefix string) string {
	if prefix == "" {
		return randomID()
	}
	return prefix + "-" + randomID()
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// brokerConn is the client's StreamService client of one broker, with the
// sender that gathers the publishes ready for it at once (publishSender).
type brokerConn struct {
	strandv1connect.StreamServiceClient
	pub *publishSender
}

// stream returns the StreamService client for a broker address.
func (c *Client) stream(addr string) *brokerConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.streams[addr]
	if !ok {
		b = &brokerConn{StreamServiceClient: strandv1connect.NewStreamServiceClient(c.httpClient, c.baseURL(addr), c.cfg.Options...)}
		b.pub = &publishSender{c: c, sc: b.StreamServiceClient}
		c.streams[addr] = b
	}
	return b
}

func (c *Client) learnBroker(addr string) {
	if addr == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.brokers, addr) {
		c.brokers = append(c.brokers, addr)
	}
}

// cachedOwner returns the cached owner address of stream, if any.
func (c *Client) cachedOwner(stream string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.perStream[stream]
	if !ok {
		return ""
	}
	st.used = time.Now()
	return st.owner
}

func (c *Client) setOwner(stream, addr string) {
	c.learnBroker(addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.streamLocked(stream).owner = addr
}

// forgetOwner drops the cached owner if it is still addr.
func (c *Client) forgetOwner(stream, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.perStream[stream]; ok && st.owner == addr {
		st.owner = ""
	}
}

// streamLocked returns stream's state, made if need be, and marks it used.
// c.mu must be held.
func (c *Client) streamLocked(stream string) *streamState {
	st, ok := c.perStream[stream]
	if !ok {
		st = &streamState{}
		c.perStream[stream] = st
		if c.cfg.StreamIdle > 0 && !c.sweeping {
			c.sweeping = true
			go c.sweepIdle()
		}
	}
	st.used = time.Now()
	return st
}

// sweepIdle frees idle streams' state every half Config.StreamIdle, so a
// stream is freed between one and one and a half idle times after its last
// use. It returns when the client closes or nothing is left to free; the
// next stream the client touches starts it again.
func (c *Client) sweepIdle() {
	t := time.NewTicker(max(c.cfg.StreamIdle/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case now := <-t.C:
			if c.sweep(now) == 0 {
				return
			}
		}
	}
}

// sweep frees the state of every stream unused since Config.StreamIdle
// before now whose lanes are all idle, and returns how many streams are
// left. When none are, it clears sweeping under the same lock, so a stream
// added after it starts a new sweepIdle.
func (c *Client) sweep(now time.Time) (left int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, st := range c.perStream {
		if now.Sub(st.used) < c.cfg.StreamIdle || !freeLanes(st.lanes) {
			continue
		}
		if len(st.lanes) > 0 {
			c.freedLanes = true
		}
		delete(c.perStream, name)
	}
	if len(c.perStream) == 0 {
		c.sweeping = false
	}
	return len(c.perStream)
}

// brokerOrder returns the known brokers, rotated so successive locates spread
// over them, with avoid (a broker just suspected) moved last.
func (c *Client) brokerOrder(avoid string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.brokers)
	out := make([]string, 0, n)
	var last []string
	for i := range n {
		b := c.brokers[(c.next+i)%n]
		if b == avoid {
			last = append(last, b)
			continue
		}
		out = append(out, b)
	}
	if n > 0 {
		c.next = (c.next + 1) % n
	}
	return append(out, last...)
}

// errNoOwner is a retryable condition: the brokers know no owner right now
// (the stream is being placed or recovered).
var errNoOwner = errors.New("client: no owner known for the stream")

// Locate asks the known brokers, in turn, who owns stream. It does not retry
// beyond one pass over the brokers and does not touch the owner cache.
func (c *Client) Locate(ctx context.Context, stream string) (*strandv1.LocateResponse, error) {
	return c.locateOnce(ctx, stream, "")
}

func (c *Client) locateOnce(ctx context.Context, stream, avoid string) (*strandv1.LocateResponse, error) {
	brokers := c.brokerOrder(avoid)
	if len(brokers) == 0 {
		if err := c.discoverBrokers(ctx); err != nil {
			return nil, err
		}
		brokers = c.brokerOrder(avoid)
	}
	var errs []error
	for _, b := range brokers {
		actx, cancel := context.WithTimeout(ctx, c.cfg.LocateTimeout)
		res, err := c.stream(b).Locate(actx, connect.NewRequest(&strandv1.LocateRequest{Stream: stream}))
		cancel()
		if err == nil {
			return res.Msg, nil
		}
		if ctx.Err() != nil {
			return nil, errors.Join(ctx.Err(), err)
		}
		if !retryable(ctx, err) {
			// NotFound, InvalidArgument: every broker would say the same.
			return nil, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
	}
	return nil, errors.Join(errs...)
}

// discoverBrokers fills the broker list from the controller.
func (c *Client) discoverBrokers(ctx context.Context) error {
	if c.cfg.Controller == "" {
		return ErrNoBrokers
	}
	res, err := c.admin.ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		return fmt.Errorf("client: discover brokers from the controller: %w", err)
	}
	for _, b := range res.Msg.GetBrokers() {
		if b.GetLive() || b.GetAddress() != "" {
			c.learnBroker(b.GetAddress())
		}
	}
	c.mu.Lock()
	n := len(c.brokers)
	c.mu.Unlock()
	if n == 0 {
		return ErrNoBrokers
	}
	return nil
}

// owner returns the owner address for stream, from the cache or by locating.
func (c *Client) owner(ctx context.Context, stream, avoid string) (string, error) {
	if addr := c.cachedOwner(stream); addr != "" {
		return addr, nil
	}
	res, err := c.locateOnce(ctx, stream, avoid)
	if err != nil {
		return "", err
	}
	addr := res.GetOwner().GetAddress()
	if addr == "" {
		return "", errNoOwner
	}
	c.setOwner(stream, addr)
	return addr, nil
}
