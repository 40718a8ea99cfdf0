// Package app is the embeddable strand-controller: Start serves the admin
// API and campaigns for leadership; only the leader serves AdminService and
// runs the liveness loop (docs/api.md, "Controller leadership").
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/lease"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	"github.com/strandhq/strand/services/controller/internal/admin"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/liveness"
	"github.com/strandhq/strand/services/controller/internal/metrics"
	"github.com/strandhq/strand/services/controller/internal/rebalance"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// Config configures a controller. Zero fields take the defaults of
// docs/operating.md, "Flags".
type Config struct {
	// HTTPLimits bounds client connections (zero fields: the defaults;
	// docs/limits.md, "HTTP server").
	HTTPLimits rpcserver.Limits
	// Name identifies this controller in logs (default: hostname).
	Name string
	// Listen is the address to serve on (default 127.0.0.1:7102).
	Listen string
	// Advertise is the address other parties reach this controller at,
	// the value it campaigns with (default: the bound listen address).
	Advertise string
	// Etcd lists the etcd endpoints (default http://127.0.0.1:2379).
	Etcd []string
	// Prefix roots the etcd schema (default /strand).
	Prefix string
	// DefaultPolicy is the cluster assignment policy (default majority_durable).
	DefaultPolicy cluster.Policy
	// OwnerProbeGrace bounds the probe of a suspected owner (default 300ms).
	OwnerProbeGrace time.Duration
	// ReplaceAfter is how long a member of a stream may be missing, its
	// broker not live, before the controller replaces it with a copy on
	// another broker (default 10m; docs/protocol.md, "Replacing a missing
	// copy"). A stream that cannot confirm with its live members is
	// replaced at once.
	ReplaceAfter time.Duration
	// SessionTTL is the election lease TTL in seconds (default 3).
	SessionTTL int
	// LogLevel and LogWriter configure logging (info, stderr).
	LogLevel  string
	LogWriter io.Writer
	// Probe overrides the owner probe (tests).
	Probe liveness.Prober
	// Auth checks every AdminService call's credentials and permissions
	// (docs/operating.md, "Security"); off by default.
	Auth auth.Options
	// PeerToken is the cluster's peer token (rpcserver.PeerTokenEnv), sent
	// with every Handover to a broker.
	PeerToken string
	// RebalanceRate bounds the handovers and replacements a second
	// (default 2); RebalanceDelay is how long after the brokers last
	// changed owners are balanced (default 1m); HandoverCatchUp bounds a
	// handover's catch-up (default 2s).
	RebalanceRate   float64
	RebalanceDelay  time.Duration
	HandoverCatchUp time.Duration
	// TLS is the controller's TLS (tlsconfig.Settings): its certs dir, or
	// Insecure. With TLS it serves TLS only and probes brokers over TLS
	// with its node certificate (docs/operating.md, "Security").
	TLS tlsconfig.Settings
}

func (c *Config) fill() error {
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7102"
	}
	if len(c.Etcd) == 0 {
		c.Etcd = []string{"http://127.0.0.1:2379"}
	}
	if c.Prefix == "" {
		c.Prefix = cluster.DefaultPrefix
	}
	if c.DefaultPolicy == (cluster.Policy{}) {
		c.DefaultPolicy = cluster.DefaultPolicy
	}
	if err := c.DefaultPolicy.Validate(); err != nil {
		return fmt.Errorf("controller: default policy: %w", err)
	}
	if c.OwnerProbeGrace <= 0 {
		c.OwnerProbeGrace = 300 * time.Millisecond
	}
	if c.ReplaceAfter <= 0 {
		c.ReplaceAfter = transition.DefaultReplaceAfter
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = 3
	}
	if c.RebalanceRate <= 0 {
		c.RebalanceRate = 2
	}
	if c.RebalanceDelay <= 0 {
		c.RebalanceDelay = time.Minute
	}
	if c.HandoverCatchUp <= 0 {
		c.HandoverCatchUp = 2 * time.Second
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	return rpcserver.ValidatePeerTokens(c.PeerToken, nil)
}

// App is a running controller.
type App struct {
	cfg     Config
	log     zerolog.Logger
	cli     *clientv3.Client
	schema  cluster.Schema
	gate    *leader.Gate
	view    *state.View
	checker *grpchealth.StaticChecker
	srv     *rpcserver.Server
	addr    string
	// mem is what the liveness loop remembers between snapshots, read by
	// the admin service; met is the controller's metrics.
	mem *attention.Memory
	met *metrics.Controller
	// leases counts the election leases' lapsed and resumed sessions.
	leases lease.Counters
	// mover makes handovers for the admin service and the rebalance loop.
	mover *rebalance.Mover

	ready     chan struct{}
	readyOnce sync.Once
	errc      chan error
	cancel    context.CancelFunc
	campaign  chan struct{}
	viewDone  chan struct{}
	closeOnce sync.Once
	closeErr  error
	// authDone is closed when the credential cache stops (nil with Auth
	// off).
	authDone chan struct{}
}

// adminRequestMaxBytes bounds one AdminService request, and
// adminCallTimeout one call that arrives without a deadline.
const (
	adminRequestMaxBytes = 1 << 20
	adminCallTimeout     = 30 * time.Second
)

// Start connects to etcd, serves on the listen address and campaigns for
// leadership in the background.
func Start(ctx context.Context, cfg Config) (*App, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	log := logging.New(cfg.LogWriter, "controller", cfg.LogLevel).With().Str("name", cfg.Name).Logger()
	certs, etcdTLS, err := etcdcfg.NodeTLS(cfg.TLS, cfg.Etcd)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	var serveOpts []rpcserver.ServeOption
	switch {
	case certs == nil && !cfg.Auth.Enabled:
		log.Warn().Msg("insecure (--insecure): no TLS and no authentication; any client that reaches this controller can create, change and delete streams")
	case certs == nil:
		log.Warn().Msg("insecure (--insecure): no TLS; tokens cross the network in the clear")
	case !cfg.Auth.Enabled:
		log.Warn().Msg("authentication off: any client that reaches this controller over TLS can create, change and delete streams")
	}
	if certs != nil {
		serveOpts = append(serveOpts, rpcserver.WithTLS(certs.ServerConfig(cfg.TLS.RequireClientCert)))
	}
	if cfg.Probe == nil {
		cfg.Probe = liveness.HealthProber(rpcserver.Dialer{TLS: certs})
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: etcdTLS})
	if err != nil {
		return nil, fmt.Errorf("controller: etcd client: %w", err)
	}
	ln, err := rpcserver.Listen(cfg.Listen)
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("controller: listen: %w", err)
	}
	addr := ln.Addr().String()
	if cfg.Advertise == "" {
		cfg.Advertise = advertiseOf(addr)
	}
	schema := cluster.NewSchema(cfg.Prefix)
	a := &App{
		cfg: cfg, log: log, cli: cli, schema: schema, addr: addr,
		gate: leader.NewGate(cli, schema.ControllerElection()),
		// A controller keeps its view while it does not lead as well, so
		// a controller that takes over passes over the cluster at once.
		view:     state.NewView(cli, schema, log),
		ready:    make(chan struct{}),
		errc:     make(chan error, 1),
		campaign: make(chan struct{}),
		viewDone: make(chan struct{}),
		mem:      attention.NewMemory(),
		met:      metrics.New(),
	}
	a.met.Follow()
	a.met.Sessions(a.leases.Lapsed.Load, a.leases.Resumed.Load)
	a.mem.SetReplaceAfter(cfg.ReplaceAfter)
	a.mover = &rebalance.Mover{Schema: schema, Call: handoverCaller(rpcserver.Dialer{TLS: certs}, cfg.PeerToken), CatchUp: cfg.HandoverCatchUp, Log: log}
	svc := admin.New(admin.Config{View: a.view, Schema: schema, Gate: a.gate, DefaultPolicy: cfg.DefaultPolicy, Log: log, Memory: a.mem, Mover: a.mover, KV: cli})
	mux, checker := rpcserver.Mux(strandv1connect.AdminServiceName)
	checker.SetStatus(strandv1connect.AdminServiceName, grpchealth.StatusNotServing)
	a.checker = checker
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	// Operator requests are names, numbers and a stream spec: a read limit
	// keeps a request of any size, or a gzip body that inflates to one,
	// from being held in memory (rpcserver.ReadLimit).
	// A call without a deadline of its own is bounded too: one waiting on
	// etcd while etcd is away would otherwise hold its handler as long.
	// With Auth, a guard checks each call first, against a credential
	// cache that runs until Close (docs/operating.md, "Security").
	adminOpts := []connect.HandlerOption{rpcserver.ReadLimit(adminRequestMaxBytes)}
	var guard *auth.Guard
	if cfg.Auth.Enabled {
		cache := auth.NewCache(cli, schema, log)
		a.authDone = make(chan struct{})
		go func() {
			defer close(a.authDone)
			cache.Run(runCtx)
		}()
		guard = auth.NewGuard(cache, cfg.Auth)
		adminOpts = append(adminOpts, guard.Option())
	}
	adminOpts = append(adminOpts, connect.WithInterceptors(rpcserver.DefaultTimeout(adminCallTimeout)))
	adminPath, adminHandler := strandv1connect.NewAdminServiceHandler(svc, adminOpts...)
	if guard != nil {
		adminHandler = guard.Precheck(adminHandler)
	}
	mux.Handle(adminPath, adminHandler)
	mux.Handle(metrics.Path, a.met.Handler())
	a.srv = rpcserver.ServeLimits(ln, auth.WithConnState(mux), cfg.HTTPLimits, serveOpts...)

	go a.watchServer()
	go func() {
		defer close(a.viewDone)
		_ = a.view.Run(runCtx)
	}()
	go a.campaignLoop(runCtx)
	log.Info().Str(logging.Addr, addr).Str("advertise", cfg.Advertise).Msg("controller serving; campaigning for leadership")
	return a, nil
}

// handoverCaller sends a Handover to a broker's ReplicationService, with
// the peer token.
//
// With TLS the controller calls as the node its certificate names (brokers
// admit ReplicationService calls from node certificates only, docs/operating.md,
// "Security"); without, it sends the peer token.
func handoverCaller(d rpcserver.Dialer, token string) rebalance.HandoverFunc {
	hc := d.HTTPClient()
	return func(ctx context.Context, addr string, req *strandv1.HandoverRequest) (*strandv1.HandoverResponse, error) {
		cl := strandv1connect.NewReplicationServiceClient(hc, d.BaseURL(addr), rpcserver.WithPeerToken(token))
		resp, err := cl.Handover(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
}

// advertiseOf turns a bound address into one peers can dial: an unspecified
// host becomes loopback.
func advertiseOf(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Addr is the address the controller serves on.
func (a *App) Addr() string { return a.addr }

// Ready is closed once the controller serves and has joined the election.
func (a *App) Ready() <-chan struct{} { return a.ready }

// Err delivers a fatal error after Start.
func (a *App) Err() <-chan error { return a.errc }

// Leading reports whether this controller currently leads.
func (a *App) Leading() bool { return a.gate.Term() != nil }

func (a *App) fail(err error) {
	select {
	case a.errc <- err:
	default:
	}
}

func (a *App) watchServer() {
	if err := <-a.srv.Done(); err != nil {
		a.fail(fmt.Errorf("controller: serve: %w", err))
	}
}

// errLostLeadership ends a term that ended on its own.
var errLostLeadership = errors.New("controller: leadership lost")

// campaignLoop campaigns, leads until the term ends, and campaigns again.
func (a *App) campaignLoop(ctx context.Context) {
	defer close(a.campaign)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := a.lead(ctx)
		if ctx.Err() != nil {
			return
		}
		a.log.Warn().Err(err).Dur("backoff", backoff).Msg("controller term ended; campaigning again")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// lead runs one session: campaign, then lead until the session, the
// election key or ctx ends.
func (a *App) lead(ctx context.Context) error {
	// The election lease outlives a session whose keep-alive answers came
	// late while etcd still held it (package lease): ending the term then
	// would start a new one from nothing, on a machine already short of
	// time. The term's writes compare the election key's create revision,
	// so a term that goes on under a lease since expired writes nothing.
	held, err := lease.Grant(ctx, a.cli, time.Duration(a.cfg.SessionTTL)*time.Second, &a.leases)
	if err != nil {
		return fmt.Errorf("controller: election lease: %w", err)
	}
	// Revoking the lease deletes the election key, so another controller
	// takes over at once.
	defer func() { _ = held.Revoke() }()
	a.readyOnce.Do(func() { close(a.ready) })

	cctx, cancel := held.Context(ctx)
	defer cancel()
	el := concurrency.NewElection(held.Session(), a.schema.ControllerElection())
	if err := a.campaignOn(cctx, el); err != nil {
		return fmt.Errorf("controller: campaign: %w", err)
	}

	done := make(chan struct{})
	term := leader.NewTerm(a.cli, el.Key(), el.Rev(), done)
	a.gate.Set(term)
	a.checker.SetStatus(strandv1connect.AdminServiceName, grpchealth.StatusServing)
	a.log.Info().Str(logging.Addr, a.cfg.Advertise).Msg("controller leads")

	// What an earlier term remembered is stale: this controller did not
	// watch the cluster in between.
	a.mem.Reset()
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = liveness.Run(cctx, liveness.Config{
			View: a.view, Schema: a.schema, Log: a.log, ProbeGrace: a.cfg.OwnerProbeGrace, Probe: a.cfg.Probe,
			Pass: a.observe, ReplaceAfter: a.cfg.ReplaceAfter, MissingSince: a.mem.MissingSince,
		}, term)
	})
	wg.Go(func() {
		_ = rebalance.Run(cctx, rebalance.LoopConfig{
			View: a.view, Mover: a.mover, Log: a.log, Rate: a.cfg.RebalanceRate, Delay: a.cfg.RebalanceDelay,
		}, term)
	})
	// The term also ends if the election key goes away by other means.
	err = errLostLeadership
	for ended := false; !ended; {
		// Watched from a revision just read, never from the key's create
		// revision: a controller that waited in the campaign longer than
		// etcd keeps history would find that revision compacted and give
		// up a term it holds (docs/etcd.md).
		from, held := a.leaderKeyHeld(cctx, el)
		if !held {
			break
		}
		wch := a.cli.Watch(cctx, el.Key(), clientv3.WithRev(from))
		for watching := true; watching && !ended; {
			select {
			case <-cctx.Done():
				ended = true
			case resp, ok := <-wch:
				if !ok || resp.Err() != nil {
					// Compacted or broken: read the key again.
					watching = false
					break
				}
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypeDelete {
						ended = true
					}
				}
			}
		}
	}
	if ctx.Err() != nil {
		err = nil
	}
	close(done)
	a.gate.Set(nil)
	a.checker.SetStatus(strandv1connect.AdminServiceName, grpchealth.StatusNotServing)
	cancel()
	wg.Wait()
	a.met.Follow()
	a.log.Info().Msg("controller stopped leading")
	return err
}

// observe takes one liveness pass's snapshot into the memory and the
// metrics, judging again only the streams changed since the pass before.
func (a *App) observe(s *state.Snapshot, changed []string, all bool) {
	sum := a.mem.ObserveChanged(s, changed, all, time.Now())
	a.met.Observe(metrics.Pass{Streams: sum.Streams, UnderReplicated: sum.UnderReplicated,
		PendingRecoveries: sum.PendingRecoveries, LiveBrokers: len(s.Brokers)})
}

// campaignRetries bounds the campaigns one session makes again after its
// wait's watch met compacted history.
const campaignRetries = 10

// campaignOn campaigns on el until this controller leads. A campaign waits
// for the keys before its own to go with a watch from the revision it read
// them at; etcd can compact that revision before the watch has caught up
// (revision-mode compaction under a burst of writes), and the campaign
// fails. It is made again on the same session, which finds its own key and
// waits in the same place: a new session would queue behind every other
// controller (docs/etcd.md).
func (a *App) campaignOn(ctx context.Context, el *concurrency.Election) error {
	var err error
	for range campaignRetries {
		if err = el.Campaign(ctx, a.cfg.Advertise); !errors.Is(err, rpctypes.ErrCompacted) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// leaderKeyHeld reads el's leader key: it reports whether the key is still
// the one this term campaigned with, and the revision to watch it from.
// An etcd that cannot answer within the election's session ends the term
// with the session; until then the read is retried.
func (a *App) leaderKeyHeld(ctx context.Context, el *concurrency.Election) (int64, bool) {
	for ctx.Err() == nil {
		resp, err := a.cli.Get(ctx, el.Key())
		if err == nil {
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != el.Rev() {
				return 0, false
			}
			return resp.Header.Revision + 1, true
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return 0, false
}

// Close stops leading (revoking the election lease, so another controller
// takes over at once), then stops serving and closes the etcd client.
func (a *App) Close() error {
	a.closeOnce.Do(func() {
		a.cancel()
		<-a.campaign
		<-a.viewDone
		if a.authDone != nil {
			<-a.authDone
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.closeErr = a.srv.Shutdown(ctx)
		if err := a.cli.Close(); err != nil && a.closeErr == nil {
			a.closeErr = err
		}
	})
	return a.closeErr
}

// Run starts the controller and runs it until ctx ends or it fails.
func Run(ctx context.Context, cfg Config) error {
	a, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-a.Err():
	}
	if err := a.Close(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}
