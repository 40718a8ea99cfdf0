// Command strand-recoverer runs Strand's recovery worker: one active leader,
// elected through etcd, finishes every pending stream recovery by sealing
// the old copies, promoting the furthest one and committing the new
// assignment with one guarded transaction.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/debugserver"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/recoverer/app"
)

func main() {
	host, _ := os.Hostname()
	var (
		cfg  app.Config
		etcd string
	)
	flag.StringVar(&cfg.Name, "name", host, "name of this recoverer in the leader election")
	flag.StringVar(&cfg.Listen, "listen", app.DefaultListen, "address to serve gRPC health on")
	flag.StringVar(&etcd, "etcd", app.DefaultEtcd, "etcd client endpoints, comma separated")
	flag.StringVar(&cfg.Prefix, "prefix", cluster.DefaultPrefix, "etcd key prefix of the coordination state")
	flag.DurationVar(&cfg.SealTimeout, "seal-timeout", app.DefaultSealTimeout, "how long a round of seals waits for copies to answer")
	flag.IntVar(&cfg.MaxInFlight, "max-in-flight", app.DefaultMaxInFlight, "pending recoveries sealed and committed at once")
	flag.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	debugAddr := flag.String("debug-addr", "", "serve net/http/pprof here (off when empty)")
	cfg.HTTPLimits.RegisterFlags(flag.CommandLine)
	cfg.TLS.Flags(flag.CommandLine)
	flag.Parse()
	for e := range strings.SplitSeq(etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.Etcd = append(cfg.Etcd, e)
		}
	}

	cfg.PeerToken = rpcserver.PeerToken()
	if err := debugserver.Listen(*debugAddr); err != nil {
		fmt.Fprintln(os.Stderr, "strand-recoverer:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "strand-recoverer:", err)
		os.Exit(1)
	}
}
