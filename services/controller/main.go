// Command strand-controller runs Strand's controller: stream lifecycle and
// placement, broker liveness, owner-loss detection and the admin API, with one
// active leader elected through etcd.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/debugserver"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/controller/app"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "strand-controller:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var cfg app.Config
	var etcd, policy string
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("strand-controller", flag.ContinueOnError)
	fs.StringVar(&cfg.Name, "name", host, "controller name in logs")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7102", "address to serve on")
	fs.StringVar(&cfg.Advertise, "advertise", "", "address clients reach this controller at (default: the listen address)")
	fs.StringVar(&etcd, "etcd", "http://127.0.0.1:2379", "etcd endpoints, comma separated")
	fs.StringVar(&cfg.Prefix, "prefix", cluster.DefaultPrefix, "etcd key prefix")
	fs.StringVar(&policy, "default-policy", cluster.MajorityDurable, "cluster assignment policy: local_durable, majority_durable, or replica_durable:N / replica_accepted:N (also NAME(N))")
	fs.DurationVar(&cfg.OwnerProbeGrace, "owner-probe-grace", 300*time.Millisecond, "how long the probe of a suspected owner may take")
	fs.DurationVar(&cfg.ReplaceAfter, "replace-after", 10*time.Minute, "how long a stream's copy may be missing (its broker not live) before the controller replaces it on another broker; a stream that cannot confirm without it is replaced at once")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	debugAddr := fs.String("debug-addr", "", "serve net/http/pprof here (off when empty)")
	cfg.HTTPLimits.RegisterFlags(fs)
	fs.Float64Var(&cfg.RebalanceRate, "rebalance-rate", 2, "most handovers and copy replacements a second, for drains and for balancing owners")
	fs.DurationVar(&cfg.RebalanceDelay, "rebalance-delay", time.Minute, "how long after the brokers last changed owners are balanced")
	fs.DurationVar(&cfg.HandoverCatchUp, "handover-catch-up", 2*time.Second, "how long a handover's target may take to catch up before the handover is abandoned")
	cfg.TLS.Flags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.ReplaceAfter <= 0 {
		return fmt.Errorf("--replace-after must be positive, got %s", cfg.ReplaceAfter)
	}
	p, err := parsePolicy(policy)
	if err != nil {
		return err
	}
	cfg.DefaultPolicy = p
	if err := debugserver.Listen(*debugAddr); err != nil {
		return err
	}
	// Secure by default (docs/operating.md, "Security"): TLS and
	// authentication go together, and --insecure turns both off.
	cfg.Auth.Enabled = !cfg.TLS.Insecure
	cfg.PeerToken = rpcserver.PeerToken()
	for _, e := range strings.Split(etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.Etcd = append(cfg.Etcd, e)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return app.Run(ctx, cfg)
}

// parsePolicy reads --default-policy by the one rule for a policy string
// (cluster.ParsePolicy).
func parsePolicy(s string) (cluster.Policy, error) {
	p, err := cluster.ParsePolicy(s)
	if err != nil {
		return p, fmt.Errorf("--default-policy: %w", err)
	}
	return p, nil
}
