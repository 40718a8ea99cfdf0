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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/strandhq/strand/internal/cluster"
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
	fs.StringVar(&policy, "default-policy", cluster.MajorityDurable, "cluster assignment policy: local_durable, majority_durable, or replica_durable:N / replica_accepted:N")
	fs.DurationVar(&cfg.OwnerProbeGrace, "owner-probe-grace", 300*time.Millisecond, "how long the probe of a suspected owner may take")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	cfg.TLS.Flags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := parsePolicy(policy)
	if err != nil {
		return err
	}
	cfg.DefaultPolicy = p
	for _, e := range strings.Split(etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.Etcd = append(cfg.Etcd, e)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return app.Run(ctx, cfg)
}

// parsePolicy reads --default-policy: a policy name, with ":N" for the
// counted policies.
func parsePolicy(s string) (cluster.Policy, error) {
	name, count, counted := strings.Cut(s, ":")
	p := cluster.Policy{Name: name}
	if counted {
		n, err := strconv.Atoi(count)
		if err != nil {
			return p, fmt.Errorf("--default-policy %q: want NAME or NAME:N", s)
		}
		p.Nodes = n
	}
	if name == "" {
		return p, fmt.Errorf("--default-policy: %w: empty", cluster.ErrInvalidPolicy)
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("--default-policy: %w", err)
	}
	return p, nil
}
