// Package app is the embeddable strand-recoverer: the recovery worker behind
// an etcd election, with gRPC health on its listen address. main.go, tests
// and strandctl dev all start the recoverer through Start (docs/architecture.md,
// "Every service's app package").
package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/grpchealth"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	"github.com/strandhq/strand/services/recoverer/internal/worker"
)

// Defaults for Config's zero fields (docs/operating.md, "Flags").
const (
	DefaultListen      = "127.0.0.1:7103"
	DefaultEtcd        = "http://127.0.0.1:2379"
	DefaultSealTimeout = worker.DefaultSealTimeout
	DefaultMaxInFlight = worker.DefaultMaxInFlight
)

// Config configures the recoverer. Zero fields take the defaults.
type Config struct {
	// HTTPLimits bounds client connections (zero fields: the defaults;
	// docs/limits.md, "HTTP server").
	HTTPLimits rpcserver.Limits
	// Name is the election value (default: the hostname).
	Name string
	// Listen is where gRPC health is served; ":0" ports pick a free one.
	Listen string
	// Etcd lists the etcd client endpoints.
	Etcd []string
	// Prefix roots the coordination state in etcd (default /strand).
	Prefix string
	// SealTimeout bounds one round of seals (default 2s).
	SealTimeout time.Duration
	// LogLevel is debug, info, warn or error (default info).
	LogLevel string
	// Logger, when set, replaces the stderr logger built from LogLevel.
	Logger *zerolog.Logger
	// PeerToken is the cluster's peer token (rpcserver.PeerTokenEnv), sent
	// with every Seal; brokers with a token refuse a Seal without it.
	PeerToken string
	// TLS is the recoverer's TLS (tlsconfig.Settings): its certs dir, or
	// Insecure. With TLS it serves health over TLS and seals with its node
	// certificate instead of the peer token (docs/operating.md, "Security").
	TLS tlsconfig.Settings
	// MaxInFlight bounds the recoveries worked on at once (default
	// worker.DefaultMaxInFlight).
	MaxInFlight int

	// Tuning for tests and benches; zero means the worker's default.
	QuorumGrace time.Duration
	SessionTTL  time.Duration
	BackoffMin  time.Duration
	BackoffMax  time.Duration
}

func (c *Config) fill() {
	if c.Name == "" {
		c.Name, _ = os.Hostname()
		if c.Name == "" {
			c.Name = "strand-recoverer"
		}
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if len(c.Etcd) == 0 {
		c.Etcd = []string{DefaultEtcd}
	}
	if c.Prefix == "" {
		c.Prefix = cluster.DefaultPrefix
	}
	if c.SealTimeout <= 0 {
		c.SealTimeout = DefaultSealTimeout
	}
}

// fieldName is the log key of the recoverer's election name.
const fieldName = "name"

// App is a running recoverer.
type App struct {
	cfg     Config
	log     zerolog.Logger
	cli     *clientv3.Client
	srv     *rpcserver.Server
	checker *grpchealth.StaticChecker
	worker  *worker.Worker

	stop       context.CancelFunc
	workerDone chan struct{}
	ready      chan struct{}
	errc       chan error
	closeOnce  sync.Once
	closeErr   error
}

// Start connects to etcd, serves health and starts campaigning. ctx bounds
// only the start itself; the recoverer runs until Close.
func Start(ctx context.Context, cfg Config) (*App, error) {
	cfg.fill()
	if err := rpcserver.ValidatePeerTokens(cfg.PeerToken, nil); err != nil {
		return nil, fmt.Errorf("recoverer: %w", err)
	}
	log := logging.New(os.Stderr, "recoverer", cfg.LogLevel)
	if cfg.Logger != nil {
		log = *cfg.Logger
	}
	log = log.With().Str(fieldName, cfg.Name).Logger()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	certs, etcdTLS, err := etcdcfg.NodeTLS(cfg.TLS, cfg.Etcd)
	if err != nil {
		return nil, fmt.Errorf("recoverer: %w", err)
	}
	var serveOpts []rpcserver.ServeOption
	peerToken := cfg.PeerToken
	if certs == nil {
		log.Warn().Msg("insecure (--insecure): no TLS; seals carry the peer token only")
	} else {
		serveOpts = append(serveOpts, rpcserver.WithTLS(certs.ServerConfig(cfg.TLS.RequireClientCert)))
		peerToken = "" // the node certificate is the credential
	}

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Etcd,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         etcdTLS,
	})
	if err != nil {
		return nil, fmt.Errorf("recoverer: etcd client for %s: %w", strings.Join(cfg.Etcd, ","), err)
	}
	w, err := worker.New(worker.Config{
		Client:      cli,
		Schema:      cluster.NewSchema(cfg.Prefix),
		Name:        cfg.Name,
		SealTimeout: cfg.SealTimeout,
		QuorumGrace: cfg.QuorumGrace,
		SessionTTL:  cfg.SessionTTL,
		BackoffMin:  cfg.BackoffMin,
		BackoffMax:  cfg.BackoffMax,
		PeerToken:   peerToken,
		Dialer:      rpcserver.Dialer{TLS: certs},
		MaxInFlight: cfg.MaxInFlight,
		Logger:      log,
	})
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	ln, err := rpcserver.Listen(cfg.Listen)
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("recoverer: listen %s: %w", cfg.Listen, err)
	}
	// The recoverer serves no API of its own, only health: readiness is
	// the server-wide status, SERVING once the worker campaigns.
	mux, checker := rpcserver.Mux()
	checker.SetStatus("", grpchealth.StatusNotServing)
	srv := rpcserver.ServeLimits(ln, mux, cfg.HTTPLimits, serveOpts...)

	wctx, stop := context.WithCancel(context.Background())
	a := &App{
		cfg:        cfg,
		log:        log,
		cli:        cli,
		srv:        srv,
		checker:    checker,
		worker:     w,
		stop:       stop,
		workerDone: make(chan struct{}),
		ready:      make(chan struct{}),
		errc:       make(chan error, 1),
	}
	go func() {
		defer close(a.workerDone)
		_ = w.Run(wctx)
	}()
	go func() {
		select {
		case <-w.Campaigning():
			checker.SetStatus("", grpchealth.StatusServing)
			close(a.ready)
			log.Info().Str(logging.Addr, srv.Addr()).Msg("recoverer serving health and campaigning")
		case <-wctx.Done():
		}
	}()
	go func() {
		if err := <-srv.Done(); err != nil {
			a.errc <- fmt.Errorf("recoverer: health server: %w", err)
		}
	}()
	return a, nil
}

// Addr is the address health is served on.
func (a *App) Addr() string { return a.srv.Addr() }

// Ready is closed once the recoverer serves health and campaigns.
func (a *App) Ready() <-chan struct{} { return a.ready }

// Err delivers a fatal error after Start.
func (a *App) Err() <-chan error { return a.errc }

// Leading reports whether this recoverer currently leads.
func (a *App) Leading() bool { return a.worker.Leading() }

// SessionsLapsed counts the election sessions that lapsed: no keep-alive
// answer within the lease TTL.
func (a *App) SessionsLapsed() int64 { return a.worker.SessionsLapsed() }

// LeasesResumed counts the lapsed election sessions whose lease etcd still
// held: kept alive again, a term it held went on.
func (a *App) LeasesResumed() int64 { return a.worker.LeasesResumed() }

// Close shuts down in order: report NOT_SERVING, stop the worker (cancelling
// in-flight seals and revoking its election lease so a successor takes over
// at once), stop serving, close the etcd client.
func (a *App) Close() error {
	a.closeOnce.Do(func() {
		a.checker.SetStatus("", grpchealth.StatusNotServing)
		a.stop()
		// The worker stops at once while etcd answers. If it does not,
		// closing the client below unblocks the etcd calls it is stuck
		// in (a campaign's resign uses the client's own context).
		select {
		case <-a.workerDone:
		case <-time.After(5 * time.Second):
			a.log.Warn().Msg("recovery worker slow to stop; closing the etcd client under it")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := a.srv.Shutdown(ctx)
		if cerr := a.cli.Close(); cerr != nil && !errors.Is(cerr, context.Canceled) {
			err = errors.Join(err, cerr)
		}
		<-a.workerDone
		a.closeErr = err
		a.log.Info().Msg("recoverer stopped")
	})
	return a.closeErr
}

// Run starts the recoverer and runs it until ctx ends or it fails.
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
	return errors.Join(runErr, a.Close())
}
