// Package onebox runs a whole Strand cluster inside one test process: a real
// embedded etcd (internal/etcdtest), controllers, recoverers and brokers
// started through their services' app packages (never by copying their
// wiring), all on loopback with short timings, so a failover takes about a
// second. It is the integration tier of the tests: real etcd, real Badger in
// temp dirs, real Connect over loopback HTTP/2, no mocks.
//
// A broker can be stopped (its app's ordered Close, which revokes its lease:
// a clean shutdown, so eager failover), killed (its app's Kill: connections
// drop at once and the lease is left to expire, as after a SIGKILL) and
// started again with the same data dir and address. Faults a process cannot
// play in-process (a real SIGKILL, SIGSTOP) are tested with real processes
// in cmd/strandctl.
//
// Every service logs into its own Log; when a test fails, the tails of all
// of them are written to the test log.
package onebox

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	brokerapp "github.com/strandhq/strand/services/broker/app"
	controllerapp "github.com/strandhq/strand/services/controller/app"
	recovererapp "github.com/strandhq/strand/services/recoverer/app"
)

// Timings of the cluster: short, so a failover takes about a second, and
// the same as the e2e suite's where they overlap.
const (
	Heartbeat      = 200 * time.Millisecond
	LeaseTTL       = 2 * time.Second
	ConfirmTimeout = time.Second
	SealTimeout    = time.Second
	ProbeGrace     = 300 * time.Millisecond
	// ElectionTTL is the controllers' and recoverers' election lease.
	ElectionTTL = 2 * time.Second
	// ReadyTimeout bounds the start of one service.
	ReadyTimeout = 20 * time.Second
)

// PeerToken is the cluster's peer token: its brokers refuse Follow and
// Seal without it, and its recoverers and Replication clients send it.
const PeerToken = "onebox-peer-token"

// Options says what to run. Zero counts mean none of that service.
type Options struct {
	// Brokers are the brokers' node ids, started in this order.
	Brokers     []string
	Controllers int
	Recoverers  int
	// DefaultPolicy is the controllers' cluster assignment policy
	// (majority_durable when zero).
	DefaultPolicy cluster.Policy
	// Zones gives brokers their --zone, by node id (none when missing).
	Zones map[string]string
	// Auth is the brokers' and controllers' auth.Options. Enabled, Start
	// bootstraps an admin (AdminToken, admin on "*") that Client, Admin
	// and Streams use. Secure turns it on by itself, with the admin
	// client certificate's principal (tlsconfig.DefaultUser) as the admin
	// and no AdminToken.
	Auth auth.Options
	// ReplaceAfter is the controllers' --replace-after (their default,
	// 10m, when zero).
	ReplaceAfter time.Duration
	// RebalanceDelay is the controllers' wait before balancing owners; zero
	// means a day, so no test sees owners moved it did not ask for.
	RebalanceDelay time.Duration
	// Secure runs the cluster with TLS: a CA, a node certificate per
	// service (named as the service: the broker's node id, controller-N,
	// recoverer-N) and an admin client certificate, made in the test's
	// temp dir (CertsDir), and every client of the cluster dials TLS.
	// It enables Auth too, as --certs-dir does for the binaries. Without
	// it every service is started insecure, explicitly.
	Secure bool
}

// Cluster is a running in-process cluster.
type Cluster struct {
	t      testing.TB
	Etcd   *etcdtest.Server
	Cli    *clientv3.Client
	Schema cluster.Schema
	dir    string
	opts   Options
	ctx    context.Context

	mu          sync.Mutex
	brokers     map[string]*brokerapp.App
	addrs       map[string]string
	logs        map[string]*Log
	logOrder    []string
	controllers []*controllerapp.App
	recoverers  map[string]*recovererapp.App
	// recovererSeq numbers recoverers in start order, never reused.
	recovererSeq int
	clients      []*client.Client
	admins       map[string]*client.Client
	// AdminToken is the bootstrap admin's token with Options.Auth on.
	AdminToken string
	// ca issues the node certificates of a Secure cluster; clientTLS is
	// the admin client's, which Client, Streams and Replication dial with.
	ca        *tlsconfig.CA
	clientTLS *tlsconfig.Reloader
}

// Start runs etcd and the services opts asks for and stops them all at the
// end of the test. Brokers start first, so a controller's first look at the
// cluster sees them live.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.DefaultPolicy == (cluster.Policy{}) {
		opts.DefaultPolicy = cluster.DefaultPolicy
	}
	e := etcdtest.Start(t)
	c := &Cluster{
		t: t, Etcd: e, Cli: e.Client(t), Schema: cluster.NewSchema(""), dir: t.TempDir(), opts: opts,
		brokers: map[string]*brokerapp.App{}, addrs: map[string]string{}, logs: map[string]*Log{},
		recoverers: map[string]*recovererapp.App{}, admins: map[string]*client.Client{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx = ctx
	// Cleanups run last-registered first: this one runs after every
	// service below is closed, so the dump holds their last words.
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
	})
	t.Cleanup(c.closeAll)
	t.Cleanup(cancel)
	c.SetBootID("onebox-boot-1")
	if opts.Secure {
		c.makeCerts()
	}
	st := &auth.Store{KV: c.Cli, Schema: c.Schema, Txn: auth.PlainTxn(c.Cli)}
	switch {
	case opts.Secure:
		// TLS brings authentication, as the service binaries do
		// (docs/operating.md, "Security"): the admin client certificate's
		// principal holds admin on "*", and the cluster's clients call as
		// it through their certificate, with no token.
		c.opts.Auth.Enabled = true
		if _, err := st.BootstrapPrincipal(ctx, tlsconfig.DefaultUser); err != nil {
			t.Fatalf("onebox: bootstrap admin %s: %v", tlsconfig.DefaultUser, err)
		}
	case opts.Auth.Enabled:
		_, secret, err := st.Bootstrap(ctx, "onebox-admin")
		if err != nil {
			t.Fatalf("onebox: bootstrap admin: %v", err)
		}
		c.AdminToken = secret
	}
	for _, n := range opts.Brokers {
		c.StartBroker(n)
	}
	for range opts.Controllers {
		c.StartController()
	}
	for range opts.Recoverers {
		c.StartRecoverer()
	}
	return c
}

func (c *Cluster) closeAll() {
	c.mu.Lock()
	clients := c.clients
	recs := slices.Collect(maps.Values(c.recoverers))
	ctls := c.controllers
	brokers := slices.Collect(maps.Values(c.brokers))
	c.recoverers, c.controllers, c.brokers, c.clients = map[string]*recovererapp.App{}, nil, map[string]*brokerapp.App{}, nil
	c.mu.Unlock()
	for _, cl := range clients {
		_ = cl.Close()
	}
	// Leaders first, so brokers going down start no failovers.
	for _, r := range recs {
		_ = r.Close()
	}
	for _, a := range ctls {
		if a != nil {
			_ = a.Close()
		}
	}
	var wg sync.WaitGroup
	for _, b := range brokers {
		wg.Go(func() { _ = b.Close() })
	}
	wg.Wait()
}

func (c *Cluster) dumpLogs() {
	c.mu.Lock()
	names := slices.Clone(c.logOrder)
	c.mu.Unlock()
	for _, n := range names {
		c.t.Logf("---- log of %s (tail)\n%s", n, c.Log(n).Tail(80))
	}
}

// Log returns the log of a service: a broker's node id, "controller-N" or
// "recoverer-N". It exists from the service's first start.
func (c *Cluster) Log(name string) *Log {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.logs[name]
	if !ok {
		l = newLog(name)
		c.logs[name] = l
		c.logOrder = append(c.logOrder, name)
	}
	return l
}

func (c *Cluster) logger(name string) *zerolog.Logger {
	l := zerolog.New(c.Log(name)).Level(zerolog.InfoLevel).With().Timestamp().Str("service", name).Logger()
	return &l
}

// StartBroker starts node, with the data dir and address of its last start
// if it ran before, and waits until it is registered and serving.
func (c *Cluster) StartBroker(node string) *brokerapp.App {
	c.t.Helper()
	c.mu.Lock()
	if _, running := c.brokers[node]; running {
		c.mu.Unlock()
		c.t.Fatalf("onebox: broker %s is already running", node)
	}
	listen := "127.0.0.1:0"
	if addr, ok := c.addrs[node]; ok {
		listen = addr
	}
	c.mu.Unlock()
	a, err := brokerapp.Start(context.Background(), brokerapp.Config{
		Node: node, Zone: c.opts.Zones[node], Listen: listen, DataDir: filepath.Join(c.dir, node), Etcd: c.Etcd.Endpoints,
		Heartbeat: Heartbeat, LeaseTTL: LeaseTTL, ConfirmTimeout: ConfirmTimeout, Logger: c.logger(node),
		BootIDPath: c.BootIDPath(), PeerToken: PeerToken, Auth: c.opts.Auth, TLS: c.tlsSettings(node),
	})
	if err != nil {
		c.t.Fatalf("onebox: start broker %s: %v", node, err)
	}
	c.waitReady("broker "+node, a)
	c.mu.Lock()
	c.brokers[node] = a
	c.addrs[node] = a.Addr()
	c.mu.Unlock()
	return a
}

// CertsDir is the dir of a Secure cluster's CA (ca.crt, ca.key) and admin
// client certificate (client.admin.crt, .key); NodeCertsDir(name) holds
// each service's node certificate.
func (c *Cluster) CertsDir() string { return filepath.Join(c.dir, "certs") }

// NodeCertsDir is the certs dir of the service name (a broker's node id,
// controller-N, recoverer-N): ca.crt, node.crt, node.key.
func (c *Cluster) NodeCertsDir(name string) string { return filepath.Join(c.dir, "certs", name) }

// Secure reports whether the cluster runs with TLS.
func (c *Cluster) Secure() bool { return c.opts.Secure }

func (c *Cluster) makeCerts() {
	c.t.Helper()
	ca, err := tlsconfig.CreateCA(c.CertsDir(), time.Hour, false)
	if err != nil {
		c.t.Fatalf("onebox: CA: %v", err)
	}
	c.ca = ca
	if _, err := tlsconfig.CreateClient(c.CertsDir(), "", tlsconfig.DefaultUser, time.Hour, false); err != nil {
		c.t.Fatalf("onebox: admin certificate: %v", err)
	}
	r, err := tlsconfig.New(tlsconfig.ClientFiles(c.CertsDir(), tlsconfig.DefaultUser))
	if err != nil {
		c.t.Fatalf("onebox: admin certificate: %v", err)
	}
	c.clientTLS = r
}

// IssueNodeCert writes a node certificate for name into NodeCertsDir(name)
// (over one there already: a renewal) and returns its pair.
func (c *Cluster) IssueNodeCert(name string) tlsconfig.PEMPair {
	c.t.Helper()
	p, err := tlsconfig.CreateNode(c.CertsDir(), c.NodeCertsDir(name), name, []string{"127.0.0.1", "localhost"}, time.Hour, true)
	if err != nil {
		c.t.Fatalf("onebox: node certificate for %s: %v", name, err)
	}
	return p
}

// tlsSettings are the TLS settings of the service name: its node
// certificate on a Secure cluster (issued at its first start), insecure
// otherwise.
func (c *Cluster) tlsSettings(name string) tlsconfig.Settings {
	c.t.Helper()
	if !c.opts.Secure {
		return tlsconfig.Settings{Insecure: true}
	}
	if _, err := os.Stat(filepath.Join(c.NodeCertsDir(name), tlsconfig.NodeCert)); err != nil {
		c.IssueNodeCert(name)
	}
	return tlsconfig.Settings{CertsDir: c.NodeCertsDir(name)}
}

// Dialer is how the cluster's clients dial: TLS with the admin client
// certificate on a Secure cluster, h2c otherwise.
func (c *Cluster) Dialer() rpcserver.Dialer { return rpcserver.Dialer{TLS: c.clientTLS} }

// BootIDPath is the file the cluster's brokers read as the id of the
// running boot; SetBootID writes it, so a test can play a machine reboot.
func (c *Cluster) BootIDPath() string { return filepath.Join(c.dir, "boot_id") }

// SetBootID writes the boot id the cluster's brokers read when they start.
func (c *Cluster) SetBootID(id string) {
	c.t.Helper()
	if err := os.WriteFile(c.BootIDPath(), []byte(id+"\n"), 0o644); err != nil {
		c.t.Fatalf("onebox: write boot id: %v", err)
	}
}

// service is what every service's app offers its embedder.
type service interface {
	Ready() <-chan struct{}
	Err() <-chan error
	Close() error
}

// waitReady waits until a just started service is ready; one that fails or
// is not ready within ReadyTimeout is closed and fails the test.
func (c *Cluster) waitReady(name string, a service) {
	c.t.Helper()
	select {
	case <-a.Ready():
	case err := <-a.Err():
		_ = a.Close()
		c.t.Fatalf("onebox: %s failed while starting: %v", name, err)
	case <-time.After(ReadyTimeout):
		_ = a.Close()
		c.t.Fatalf("onebox: %s not ready within %s", name, ReadyTimeout)
	}
}

// StopBroker shuts node down in order (its app's Close: stop publishes,
// revoke the lease, drain, close storage) and returns how long that took.
func (c *Cluster) StopBroker(node string) time.Duration {
	c.t.Helper()
	c.mu.Lock()
	a, ok := c.brokers[node]
	delete(c.brokers, node)
	c.mu.Unlock()
	if !ok {
		c.t.Fatalf("onebox: broker %s is not running", node)
	}
	start := time.Now()
	if err := a.Close(); err != nil {
		c.t.Fatalf("onebox: close broker %s: %v", node, err)
	}
	return time.Since(start)
}

// KillBroker stops node as a crash does (its app's Kill): its connections
// drop at once and its lease is not revoked, so the controller learns of
// the loss from its followers' suspicion or the lease's expiry, as after a
// SIGKILL. It returns once the broker is cut off, and the channel delivers
// Kill's result once the broker's parts have stopped; the data dir and
// address are kept for a later StartBroker.
func (c *Cluster) KillBroker(node string) <-chan error {
	c.t.Helper()
	c.mu.Lock()
	a, ok := c.brokers[node]
	delete(c.brokers, node)
	c.mu.Unlock()
	if !ok {
		c.t.Fatalf("onebox: broker %s is not running", node)
	}
	return a.Kill()
}

// StopBrokerAsync starts the ordered shutdown of node and returns at once;
// the channel delivers Close's result. A test measures what the cluster does
// while the broker drains with it.
func (c *Cluster) StopBrokerAsync(node string) <-chan error {
	c.t.Helper()
	c.mu.Lock()
	a, ok := c.brokers[node]
	delete(c.brokers, node)
	c.mu.Unlock()
	if !ok {
		c.t.Fatalf("onebox: broker %s is not running", node)
	}
	done := make(chan error, 1)
	go func() { done <- a.Close() }()
	return done
}

// Broker returns node's running app, or nil.
func (c *Cluster) Broker(node string) *brokerapp.App {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.brokers[node]
}

// Addr is node's address (kept across restarts).
func (c *Cluster) Addr(node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addrs[node]
}

// Addrs are every broker address ever started.
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range slices.Sorted(maps.Keys(c.addrs)) {
		out = append(out, c.addrs[n])
	}
	return out
}

// StartController starts one more controller (named controller-N) and waits
// until it has joined the election.
func (c *Cluster) StartController() *controllerapp.App {
	c.t.Helper()
	c.mu.Lock()
	name := fmt.Sprintf("controller-%d", len(c.controllers)+1)
	c.mu.Unlock()
	a, err := controllerapp.Start(context.Background(), controllerapp.Config{
		Name: name, Listen: "127.0.0.1:0", Etcd: c.Etcd.Endpoints, DefaultPolicy: c.opts.DefaultPolicy,
		OwnerProbeGrace: ProbeGrace, ReplaceAfter: c.opts.ReplaceAfter, SessionTTL: int(ElectionTTL / time.Second), LogLevel: "info", LogWriter: c.Log(name),
		Auth: c.opts.Auth, PeerToken: PeerToken, RebalanceDelay: cmp.Or(c.opts.RebalanceDelay, 24*time.Hour), TLS: c.tlsSettings(name),
	})
	if err != nil {
		c.t.Fatalf("onebox: start %s: %v", name, err)
	}
	c.waitReady(name, a)
	c.mu.Lock()
	c.controllers = append(c.controllers, a)
	c.mu.Unlock()
	return a
}

// Controller returns the i-th controller started (1-based), nil once stopped.
func (c *Cluster) Controller(i int) *controllerapp.App {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.controllers[i-1]
}

// StopController closes the i-th controller (1-based).
func (c *Cluster) StopController(i int) {
	c.t.Helper()
	c.mu.Lock()
	a := c.controllers[i-1]
	c.controllers[i-1] = nil
	c.mu.Unlock()
	if a == nil {
		c.t.Fatalf("onebox: controller-%d is not running", i)
	}
	if err := a.Close(); err != nil {
		c.t.Logf("onebox: close controller-%d: %v", i, err)
	}
}

// ControllerAddr is the address of a running controller, the leader when
// one leads.
func (c *Cluster) ControllerAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := ""
	for _, a := range c.controllers {
		if a == nil {
			continue
		}
		if a.Leading() {
			return a.Addr()
		}
		if addr == "" {
			addr = a.Addr()
		}
	}
	return addr
}

// StartRecoverer starts one more recoverer (named recoverer-N, N counting
// every recoverer started) and waits until it campaigns. It returns its name.
func (c *Cluster) StartRecoverer() string {
	c.t.Helper()
	c.mu.Lock()
	c.recovererSeq++
	name := fmt.Sprintf("recoverer-%d", c.recovererSeq)
	c.mu.Unlock()
	a, err := recovererapp.Start(context.Background(), recovererapp.Config{
		Name: name, Listen: "127.0.0.1:0", Etcd: c.Etcd.Endpoints, SealTimeout: SealTimeout, Logger: c.logger(name), PeerToken: PeerToken,
		QuorumGrace: 100 * time.Millisecond, SessionTTL: ElectionTTL,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		TLS: c.tlsSettings(name),
	})
	if err != nil {
		c.t.Fatalf("onebox: start %s: %v", name, err)
	}
	c.waitReady(name, a)
	c.mu.Lock()
	c.recoverers[name] = a
	c.mu.Unlock()
	return name
}

// Recoverer returns a running recoverer by name, or nil.
func (c *Cluster) Recoverer(name string) *recovererapp.App {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recoverers[name]
}

// LeadingRecoverer returns the name of the recoverer that leads now ("" if
// none does).
func (c *Cluster) LeadingRecoverer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(c.recoverers)) {
		if c.recoverers[n].Leading() {
			return n
		}
	}
	return ""
}

// StopRecoverer closes a recoverer.
func (c *Cluster) StopRecoverer(name string) {
	c.t.Helper()
	c.mu.Lock()
	a := c.recoverers[name]
	delete(c.recoverers, name)
	c.mu.Unlock()
	if a == nil {
		c.t.Fatalf("onebox: %s is not running", name)
	}
	if err := a.Close(); err != nil {
		c.t.Logf("onebox: close %s: %v", name, err)
	}
}

// Client returns a Go client pointed at the cluster (the leading controller
// and every broker), with retries sized to ride through a failover. It is
// closed at the end of the test.
func (c *Cluster) Client() *client.Client {
	c.t.Helper()
	cl, err := client.New(client.Config{
		Controller:     c.ControllerAddr(),
		Brokers:        c.Addrs(),
		RetryBudget:    30 * time.Second,
		AttemptTimeout: 3 * time.Second,
		ProbeAfter:     500 * time.Millisecond,
		BackoffMax:     200 * time.Millisecond,
		Token:          c.AdminToken,
		TLS:            c.clientTLSConfig(),
	})
	if err != nil {
		c.t.Fatalf("onebox: client: %v", err)
	}
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// Admin is the AdminService through a client pointed at the controller
// that leads now (or any running one), which follows leader redirects.
func (c *Cluster) Admin() strandv1connect.AdminServiceClient {
	c.t.Helper()
	addr := c.ControllerAddr()
	c.mu.Lock()
	cl, ok := c.admins[addr]
	c.mu.Unlock()
	if !ok {
		cl = c.Client()
		c.mu.Lock()
		c.admins[addr] = cl
		c.mu.Unlock()
	}
	return cl.Admin()
}

// clientTLSConfig is the admin client's TLS configuration on a Secure
// cluster, nil otherwise.
func (c *Cluster) clientTLSConfig() *tls.Config {
	if c.clientTLS == nil {
		return nil
	}
	return c.clientTLS.ClientConfig()
}

// Streams is a raw StreamService client of one broker (no redirects).
func (c *Cluster) Streams(node string) strandv1connect.StreamServiceClient {
	d := c.Dialer()
	return strandv1connect.NewStreamServiceClient(d.HTTPClient(), d.BaseURL(c.Addr(node)), auth.WithBearer(c.AdminToken))
}

// Replication is a raw ReplicationService client of one broker, with the
// cluster's peer token (on a Secure cluster the admin client certificate,
// which brokers refuse Follow and Seal to: see ReplicationAs).
func (c *Cluster) Replication(node string) strandv1connect.ReplicationServiceClient {
	d := c.Dialer()
	return strandv1connect.NewReplicationServiceClient(d.HTTPClient(), d.BaseURL(c.Addr(node)), rpcserver.WithPeerToken(PeerToken))
}

// ReplicationAs is a raw ReplicationService client of one broker that
// presents the node certificate of as (a Secure cluster's; issued when as
// has none yet).
func (c *Cluster) ReplicationAs(node, as string) strandv1connect.ReplicationServiceClient {
	c.t.Helper()
	r, err := tlsconfig.New(tlsconfig.NodeFiles(c.tlsSettings(as).CertsDir))
	if err != nil {
		c.t.Fatalf("onebox: certificate of %s: %v", as, err)
	}
	d := rpcserver.Dialer{TLS: r}
	return strandv1connect.NewReplicationServiceClient(d.HTTPClient(), d.BaseURL(c.Addr(node)))
}

// Ctx is the cluster's context for calls, cancelled when the test ends.
func (c *Cluster) Ctx() context.Context { return c.ctx }

// view is the cluster's state in etcd, as tests read it.
func (c *Cluster) view() clustertest.View {
	return clustertest.View{T: c.t, Cli: c.Cli, Schema: c.Schema}
}

// Assignment reads a stream's assignment from etcd.
func (c *Cluster) Assignment(stream string) (cluster.Assignment, bool) {
	return c.view().Assignment(stream)
}

// Recovery reads a stream's pending recovery from etcd.
func (c *Cluster) Recovery(stream string) (cluster.Recovery, bool) {
	return c.view().Recovery(stream)
}

// History reads a stream's history starts from etcd; absent is empty.
func (c *Cluster) History(stream string) cluster.HistoryStarts {
	return c.view().History(stream)
}

// HasKey reports whether key exists in etcd.
func (c *Cluster) HasKey(key string) bool { return c.view().HasKey(key) }

// Tails reads what node last published about its copy of stream in its
// heartbeat; ok is false when the broker publishes no heartbeat or no copy.
func (c *Cluster) Tails(node, stream string) (cluster.CopyTails, bool) {
	return c.view().Tails(node, stream)
}

// Put writes a value into etcd as a service would (broker-level tests play
// the controller and the recoverer with it).
func (c *Cluster) Put(key string, v any) {
	c.t.Helper()
	if _, err := c.Cli.Put(c.Ctx(), key, cluster.Encode(v)); err != nil {
		c.t.Fatalf("onebox: put %s: %v", key, err)
	}
}

// CreateStream creates a stream through the AdminService and waits until
// every copy applied the assignment (the owner owns, each follower follows
// at epoch 1), so a publish confirms at once.
func (c *Cluster) CreateStream(name string, copies int, policy cluster.Policy) cluster.Assignment {
	c.t.Helper()
	_, err := c.Admin().CreateStream(c.Ctx(), connect.NewRequest(&strandv1.CreateStreamRequest{
		Name: name, Copies: uint32(copies), Policy: &strandv1.ConfirmPolicy{Name: policy.Name, Nodes: uint32(policy.Nodes)},
	}))
	if err != nil {
		c.t.Fatalf("onebox: create stream %s: %v", name, err)
	}
	a, ok := c.Assignment(name)
	if !ok {
		c.t.Fatalf("onebox: no assignment of %s after create", name)
	}
	c.WaitApplied(a)
	return a
}

// WaitApplied waits until every running member of a published its copy in
// its heartbeat at a's epoch in its role.
func (c *Cluster) WaitApplied(a cluster.Assignment) {
	c.t.Helper()
	c.view().WaitApplied(a, 15*time.Second, func(node string) bool { return c.Broker(node) == nil })
}

// WaitAssignment waits for a stream's assignment to satisfy cond and
// returns it.
func (c *Cluster) WaitAssignment(stream string, within time.Duration, what string, cond func(cluster.Assignment) error) cluster.Assignment {
	c.t.Helper()
	var a cluster.Assignment
	clustertest.Eventually(c.t, within, what, func() error {
		var ok bool
		a, ok = c.Assignment(stream)
		if !ok {
			return fmt.Errorf("no assignment of %s", stream)
		}
		return cond(a)
	})
	return a
}

// ReadAll reads every confirmed record of stream that node's copy shows,
// from its head, with raw Read calls to that broker (a follower serves
// reads below its watermark). The tests keep whole logs: it starts at 0.
func (c *Cluster) ReadAll(node, stream string) ([]*strandv1.StoredRecord, error) {
	return clustertest.ReadAll(c.Streams(node), node, stream)
}

// Publish publishes payloads through raw Publish calls to node, retrying
// while the copy is not yet serving as owner, and returns their offsets.
func (c *Cluster) Publish(node, stream string, payloads ...string) []uint64 {
	c.t.Helper()
	recs := make([]*strandv1.Record, 0, len(payloads))
	for _, p := range payloads {
		recs = append(recs, &strandv1.Record{Payload: []byte(p)})
	}
	var offsets []uint64
	clustertest.Eventually(c.t, 15*time.Second, fmt.Sprintf("publish %d records to %s on %s", len(payloads), stream, node), func() error {
		resp, err := c.Streams(node).Publish(c.Ctx(), connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: recs}))
		if err != nil {
			return err
		}
		offsets = resp.Msg.GetOffsets()
		return nil
	})
	return offsets
}

// SameRecords reports the first difference between two reads of a stream:
// offsets, epochs, payloads, headers, producer stamps, publish times and
// chain values must all agree.
func SameRecords(aName string, a []*strandv1.StoredRecord, bName string, b []*strandv1.StoredRecord) error {
	if len(a) != len(b) {
		return fmt.Errorf("%s shows %d records, %s shows %d", aName, len(a), bName, len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.GetOffset() != y.GetOffset() || x.GetEpoch() != y.GetEpoch() || string(x.GetPayload()) != string(y.GetPayload()) ||
			x.GetChain() != y.GetChain() || !maps.Equal(x.GetHeaders(), y.GetHeaders()) ||
			x.GetProducerId() != y.GetProducerId() || x.GetSequence() != y.GetSequence() ||
			!x.GetPublishTime().AsTime().Equal(y.GetPublishTime().AsTime()) {
			return fmt.Errorf("record %d differs: %s has %v, %s has %v", i, aName, x, bName, y)
		}
	}
	return nil
}

// Payloads returns the records' payloads as strings, in order.
func Payloads(recs []*strandv1.StoredRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.GetPayload())
	}
	return out
}

// Numbered returns n payloads prefix-000 … prefix-(n-1).
func Numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// Others returns nodes without the ones given.
func Others(nodes []string, without ...string) []string {
	return slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return slices.Contains(without, n) })
}

// Attention lists the controller's attention entries for stream.
func (c *Cluster) Attention(stream string) ([]*strandv1.AttentionEntry, error) {
	resp, err := c.Admin().ListAttention(c.Ctx(), connect.NewRequest(&strandv1.ListAttentionRequest{}))
	if err != nil {
		return nil, err
	}
	var out []*strandv1.AttentionEntry
	for _, e := range resp.Msg.GetEntries() {
		if e.GetStream() == stream {
			out = append(out, e)
		}
	}
	return out, nil
}

// describe is a short form of attention entries for messages.
func describe(entries []*strandv1.AttentionEntry) string {
	var parts []string
	for _, e := range entries {
		parts = append(parts, fmt.Sprintf("%s(%s)", e.GetKind(), e.GetReason()))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}
