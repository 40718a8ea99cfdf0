// Package app is the embeddable broker: tests, strandctl dev and main start
// it through Start, never by copying its wiring.
package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	"github.com/strandhq/strand/services/broker/internal/api"
	"github.com/strandhq/strand/services/broker/internal/coord"
	"github.com/strandhq/strand/services/broker/internal/metrics"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Config configures a broker.
type Config struct {
	// HTTPLimits bounds client connections (zero fields: the defaults;
	// docs/limits.md, "HTTP server").
	HTTPLimits rpcserver.Limits
	Node       string
	// Zone is the failure zone the broker runs in (a rack, an availability
	// zone), stored in its registration: placement spreads each stream's
	// copies over zones (docs/operating.md, "Zones"). Empty: none.
	Zone           string
	Listen         string
	Advertise      string
	DataDir        string
	Etcd           []string
	Prefix         string
	Heartbeat      time.Duration
	LeaseTTL       time.Duration
	ConfirmTimeout time.Duration
	// PublishApplyWait bounds how long a publish to a copy sealed for a
	// recovery waits for the recovery's assignment (0:
	// replica.DefaultPublishApplyWait).
	PublishApplyWait time.Duration
	// MaxRecordBytes, MaxBatchBytes and MaxBatchRecords bound what one
	// publish may carry (0: api.Default*). They also set how large a
	// publish request is read at all (api.StreamService.Handler).
	MaxRecordBytes  int
	MaxBatchBytes   int
	MaxBatchRecords int
	// MaxInflightBytes bounds unacknowledged bytes per follower.
	MaxInflightBytes int
	// MaxPublishBytesInFlight bounds the request bytes of the publishes
	// handled at once (0: api.DefaultMaxPublishBytesInFlight).
	MaxPublishBytesInFlight int
	// DedupeProducers, DedupeWindow and DedupeBatches bound idempotent
	// publish state per stream: producers tracked, and records and batches
	// per producer (0: defaults).
	DedupeProducers int
	DedupeWindow    int
	DedupeBatches   int
	Logger          *zerolog.Logger
	LogLevel        string
	// PeerToken is the cluster's peer token (rpcserver.PeerTokenEnv): it
	// guards ReplicationService here and goes with this broker's own
	// Follow calls. Empty leaves ReplicationService open to any client.
	PeerToken string
	// PeerTokensAccepted are tokens ReplicationService accepts here
	// besides PeerToken, never sent (rpcserver.PeerTokenAcceptEnv): a
	// rotation under way.
	PeerTokensAccepted []string
	// TLS is the broker's TLS (tlsconfig.Settings): its certs dir, or
	// Insecure. With TLS every port serves TLS only, Follow and Seal admit
	// node certificates only, a Follow only from the node its certificate
	// names, and the peer token is not used (docs/operating.md,
	// "Security").
	TLS tlsconfig.Settings
	// BootIDPath is where the id of the running boot is read (empty: the
	// kernel's, storage.BootIDPath); tests point it at a file to play a
	// reboot.
	BootIDPath string
	// OrphanGrace is how long a copy its stream's assignment leaves out is
	// kept before it is deleted (0: replica.DefaultOrphanGrace;
	// docs/operating.md, "Orphan copies").
	OrphanGrace time.Duration
	// StorageFault, when set, fails the store's next writes while it
	// returns an error (storage.Options.WriteFault): fault tests of a
	// broker whose disk fails.
	StorageFault func() error
	// Auth checks every StreamService call's credentials, permissions and
	// per-principal limits (docs/operating.md, "Security"); off by default.
	// ReplicationService stays under the peer token.
	Auth auth.Options
}

func (c *Config) defaults() error {
	if err := cluster.ValidateNodeName(c.Node); err != nil {
		return fmt.Errorf("broker: --node: %w", err)
	}
	if err := cluster.ValidateZone(c.Zone); err != nil {
		return fmt.Errorf("broker: --zone: %w", err)
	}
	if err := rpcserver.ValidatePeerTokens(c.PeerToken, c.PeerTokensAccepted); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if err := c.TLS.Validate(); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if c.DataDir == "" {
		return errors.New("broker: --data-dir is required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7110"
	}
	if len(c.Etcd) == 0 {
		c.Etcd = []string{"http://127.0.0.1:2379"}
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 3 * time.Second
	}
	if c.ConfirmTimeout <= 0 {
		c.ConfirmTimeout = 5 * time.Second
	}
	return nil
}

// App is a running broker.
type App struct {
	cfg     Config
	log     zerolog.Logger
	etcd    *clientv3.Client
	db      *storage.DB
	manager *replica.Manager
	coord   *coord.Coord
	server  *rpcserver.Server

	coordCancel context.CancelFunc
	coordDone   chan struct{}
	ready       chan struct{}
	errc        chan error
	closeOnce   sync.Once
	closeErr    error
	// authStop ends the credential cache (nil with Auth off).
	authStop func()
}

// Start opens storage, serves the Connect services and registers in etcd.
func Start(ctx context.Context, cfg Config) (*App, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	log := logging.New(os.Stderr, "broker", cfg.LogLevel).With().Str(logging.Node, cfg.Node).Logger()
	if cfg.Logger != nil {
		log = cfg.Logger.With().Str(logging.Node, cfg.Node).Logger()
	}
	a := &App{cfg: cfg, log: log, ready: make(chan struct{}), errc: make(chan error, 1), coordDone: make(chan struct{})}
	if window, batch := orDefault(cfg.DedupeWindow, storage.DefaultProducerWindow), orDefault(cfg.MaxBatchRecords, api.DefaultMaxBatchRecords); window < batch {
		// Not an error: nothing is stored twice. But a retry of a batch
		// larger than the window, whose answer was lost, is refused
		// (OutOfRange) although its records are stored.
		log.Warn().Int("dedupe_window", window).Int("max_batch_records", batch).
			Msg("--dedupe-window is below --max-batch-records: a retried batch larger than the window is refused although stored")
	}
	ok := false
	defer func() {
		if !ok {
			_ = a.Close()
		}
	}()
	certs, etcdTLS, err := etcdcfg.NodeTLS(cfg.TLS, cfg.Etcd)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	switch {
	case certs == nil && !cfg.Auth.Enabled:
		log.Warn().Msg("insecure (--insecure): no TLS on any port and no authentication; any client that reaches this broker can read, publish and, without a peer token, follow and seal")
	case certs == nil:
		log.Warn().Msg("insecure (--insecure): no TLS on any port; tokens cross the network in the clear, and without a peer token any client can follow and seal")
	case !cfg.Auth.Enabled:
		log.Warn().Msg("authentication off: any client that reaches this broker over TLS can read and publish")
	}
	dial := rpcserver.Dialer{TLS: certs}
	ln, err := rpcserver.Listen(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("broker: listen: %w", err)
	}
	if a.cfg.Advertise == "" {
		a.cfg.Advertise = ln.Addr().String()
	}
	// Where publishes and follow batches wait, at /metrics (package
	// metrics lists the series).
	met := metrics.New()
	a.db, err = storage.Open(storage.Options{Dir: cfg.DataDir, Logger: log,
		MaxProducers: cfg.DedupeProducers, ProducerWindow: cfg.DedupeWindow, ProducerBatches: cfg.DedupeBatches, BootIDPath: cfg.BootIDPath,
		OnCommit: met.Commit, WriteFault: cfg.StorageFault,
		// A failed write stops the store until it is opened again, and
		// with it every stream this broker holds. The broker stops too, as
		// etcd does on a failed fsync: Run closes it, which revokes its
		// lease, so the streams it owns fail over at once (eager failover)
		// instead of answering Unavailable until an operator restarts it.
		OnFail: func(err error) {
			log.Error().Err(err).Msg("storage failed; stopping the broker so its streams fail over")
			a.fail(fmt.Errorf("broker: storage failed: %w", err))
		}})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("broker: storage: %w", err)
	}
	// The client outlives ctx: Close still needs it to revoke the lease
	// after the caller's context (a signal) has ended.
	a.etcd, err = clientv3.New(clientv3.Config{Endpoints: cfg.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: etcdTLS})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("broker: etcd: %w", err)
	}
	schema := cluster.NewSchema(cfg.Prefix)
	httpClient := dial.HTTPClient()
	// The peer token goes with Follow only on a cluster without TLS: with
	// TLS the node certificate is the credential.
	sendToken := cfg.PeerToken
	if certs != nil {
		sendToken = ""
	}
	var co *coord.Coord
	a.manager, err = replica.NewManager(replica.Config{
		Node:             cfg.Node,
		Storage:          a.db,
		Logger:           log,
		ConfirmTimeout:   cfg.ConfirmTimeout,
		PublishApplyWait: cfg.PublishApplyWait,
		MaxInflightBytes: cfg.MaxInflightBytes,
		// co is made after the manager, so the hook reads it when called.
		History: func(ctx context.Context, stream string, atLeast int64) (cluster.HistoryStarts, error) {
			return co.History(ctx, stream, atLeast)
		},
		Dial: func(addr string) strandv1connect.ReplicationServiceClient {
			return strandv1connect.NewReplicationServiceClient(httpClient, dial.BaseURL(addr), rpcserver.WithPeerToken(sendToken))
		},
		Metrics:     met,
		OrphanGrace: cfg.OrphanGrace,
		ReadStream: func(ctx context.Context, stream string) (replica.StreamKeys, error) {
			return co.ReadStream(ctx, stream)
		},
	})
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("broker: copies: %w", err)
	}
	co = coord.New(coord.Config{
		Client: a.etcd, Schema: schema, Node: cfg.Node, Zone: cfg.Zone, Address: a.cfg.Advertise,
		Heartbeat: cfg.Heartbeat, LeaseTTL: cfg.LeaseTTL, Logger: log, Manager: a.manager,
	})
	a.coord = co
	met.Heartbeats(co.HeartbeatTicks, co.HeartbeatTxns, co.HeartbeatTailsSkipped, co.HeartbeatOmitted)
	met.Sessions(co.SessionsLapsed, co.LeasesResumed)

	mux, _ := rpcserver.Mux(strandv1connect.StreamServiceName, strandv1connect.ReplicationServiceName)
	// Responses are not compressed: records are already as small as their
	// producers made them, and gzip on every follow batch and read cost
	// more CPU than the whole log write (measured with perf under the
	// cluster bench).
	noGzip := connect.WithCompressMinBytes(math.MaxInt)
	streams := api.NewStreamService(a.manager, api.Limits{
		MaxRecordBytes: cfg.MaxRecordBytes, MaxBatchBytes: cfg.MaxBatchBytes, MaxBatchRecords: cfg.MaxBatchRecords,
		MaxPublishBytesInFlight: cfg.MaxPublishBytesInFlight,
	}, log)
	met.PublishGate(streams.PublishesWaiting, streams.PublishBytesInFlight, streams.PublishesRefused)
	if cfg.Auth.Enabled {
		guard := a.startAuth(schema)
		path, h := streams.Handler(noGzip, guard.Option())
		mux.Handle(path, guard.Precheck(h))
	} else {
		// Auth off said explicitly: PublishMany's entries are checked
		// against the call's marker and refused without one (auth.CheckEntry).
		mux.Handle(streams.Handler(noGzip, auth.Open()))
	}
	// Follow and Seal are for peers only (docs/operating.md, "Security"): a client that could
	// seal would fence copies and stop their streams until a recovery.
	// With TLS a peer is a node certificate; without, the peer token.
	peers := rpcserver.RequireNode()
	var serveOpts []rpcserver.ServeOption
	switch {
	case certs != nil:
		serveOpts = append(serveOpts, rpcserver.WithTLS(certs.ServerConfig(cfg.TLS.RequireClientCert)))
		if cfg.PeerToken != "" {
			log.Info().Msg("TLS: the peer token is not used; Follow and Seal admit node certificates")
		}
	case cfg.PeerToken == "":
		log.Warn().Msg("no peer token (" + rpcserver.PeerTokenEnv + "): Follow and Seal are open to any client that reaches this broker")
		peers = rpcserver.RequirePeerToken("")
	default:
		peers = rpcserver.RequirePeerToken(cfg.PeerToken, cfg.PeerTokensAccepted...)
	}
	mux.Handle(api.NewReplicationService(a.manager, log).Handler(noGzip, peers))
	mux.Handle(metrics.Path, met.Handler())
	a.server = rpcserver.ServeLimits(ln, auth.WithConnState(mux), cfg.HTTPLimits, serveOpts...)

	cctx, cancel := context.WithCancel(context.Background())
	a.coordCancel = cancel
	go func() {
		defer close(a.coordDone)
		if err := co.Run(cctx); err != nil {
			a.fail(err)
		}
	}()
	go func() {
		select {
		case <-co.Ready():
			close(a.ready)
			log.Info().Str(logging.Addr, a.cfg.Advertise).Msg("broker ready")
		case <-cctx.Done():
		}
	}()
	go func() {
		if err := <-a.server.Done(); err != nil {
			a.fail(err)
		}
	}()
	ok = true
	return a, nil
}

// startAuth runs the credential cache until Close and returns the guard
// of StreamService.
func (a *App) startAuth(schema cluster.Schema) *auth.Guard {
	cache := auth.NewCache(a.etcd, schema, a.log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cache.Run(ctx)
	}()
	a.authStop = func() {
		cancel()
		<-done
	}
	return auth.NewGuard(cache, a.cfg.Auth)
}

func (a *App) fail(err error) {
	select {
	case a.errc <- err:
	default:
	}
}

// Addr is the address the broker serves on.
func (a *App) Addr() string { return a.cfg.Advertise }

// Node is the broker's node id.
func (a *App) Node() string { return a.cfg.Node }

// Ready is closed once the broker is registered and serving.
func (a *App) Ready() <-chan struct{} { return a.ready }

// Err delivers a fatal error after Start.
func (a *App) Err() <-chan error { return a.errc }

// Close shuts down in order: stop taking publishes, revoke the lease so the
// controller fails over at once (eager failover), drain in-flight requests,
// stop the copies, close storage.
func (a *App) Close() error {
	a.closeOnce.Do(func() {
		if a.manager != nil {
			a.manager.StopPublishes()
		}
		if a.coord != nil {
			if err := a.coord.Revoke(); err != nil {
				a.log.Warn().Err(err).Msg("lease revoke failed; the controller will wait for the lease TTL")
			}
		}
		if a.coordCancel != nil {
			a.coordCancel()
			<-a.coordDone
		}
		if a.server != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_ = a.server.Shutdown(sctx)
			cancel()
		}
		if a.authStop != nil {
			a.authStop()
		}
		if a.manager != nil {
			a.manager.Close()
		}
		if a.db != nil {
			a.closeErr = a.db.Close()
		}
		if a.etcd != nil {
			_ = a.etcd.Close()
		}
		a.log.Info().Msg("broker stopped")
	})
	return a.closeErr
}

// Run starts the broker and serves until ctx ends or a fatal error.
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

// orDefault is v, or def when v is zero or less.
func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}
