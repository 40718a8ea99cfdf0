// Command strand-broker holds stream copies: publish/read for clients,
// follow and seal for peers. docs/operating.md lists its flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/debugserver"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/app"
	"github.com/strandhq/strand/services/broker/internal/api"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

func main() {
	var cfg app.Config
	var etcd string
	fs := flag.NewFlagSet("strand-broker", flag.ExitOnError)
	fs.StringVar(&cfg.Node, "node", "", "node id (required)")
	fs.StringVar(&cfg.Zone, "zone", "", "failure zone this broker runs in (a rack, an availability zone); placement spreads each stream's copies over zones")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7110", "address to serve on")
	fs.StringVar(&cfg.Advertise, "advertise", "", "address peers and clients use (default: the listen address)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the Badger store (required)")
	fs.StringVar(&etcd, "etcd", "http://127.0.0.1:2379", "etcd endpoints, comma separated")
	fs.StringVar(&cfg.Prefix, "prefix", cluster.DefaultPrefix, "etcd key prefix")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", 1e9, "heartbeat interval")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 3e9, "lease TTL; the broker is lost this long after it stops")
	fs.DurationVar(&cfg.ConfirmTimeout, "confirm-timeout", 5e9, "how long a publish waits for W copies")
	fs.IntVar(&cfg.MaxRecordBytes, "max-record-bytes", api.DefaultMaxRecordBytes, "largest record accepted")
	fs.IntVar(&cfg.MaxBatchBytes, "max-batch-bytes", api.DefaultMaxBatchBytes, "largest publish batch accepted, in payload and header bytes")
	fs.IntVar(&cfg.MaxBatchRecords, "max-batch-records", api.DefaultMaxBatchRecords, "most records in one publish batch")
	fs.IntVar(&cfg.MaxInflightBytes, "max-inflight-bytes", 8<<20, "unacknowledged bytes in flight per follower")
	fs.IntVar(&cfg.MaxPublishBytesInFlight, "max-publish-inflight-bytes", api.DefaultMaxPublishBytesInFlight, "request bytes of the publishes handled at once; more wait before they are read")
	fs.IntVar(&cfg.DedupeProducers, "dedupe-producers", storage.DefaultMaxProducers, "idempotent publish: producers tracked per stream (least recently used evicted)")
	fs.IntVar(&cfg.DedupeWindow, "dedupe-window", storage.DefaultProducerWindow, "idempotent publish: records per producer kept for duplicate detection")
	fs.IntVar(&cfg.DedupeBatches, "dedupe-batches", storage.DefaultProducerBatches, "idempotent publish: batches per producer kept for duplicate detection (a producer's consecutive batches count as one)")
	fs.DurationVar(&cfg.OrphanGrace, "orphan-grace", replica.DefaultOrphanGrace, "how long a copy no assignment includes is kept before it is deleted (a pending recovery that names this broker keeps it longer)")
	fs.IntVar(&cfg.Auth.PublishBytesPerSecond, "principal-publish-bytes-per-second", auth.DefaultPublishBytesPerSecond, "with TLS (--certs-dir): publish request bytes per second per principal (a one-second token bucket)")
	fs.IntVar(&cfg.Auth.MaxSubscriptions, "principal-max-subscriptions", auth.DefaultMaxSubscriptions, "with TLS (--certs-dir): concurrent subscriptions per principal on this broker")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	cfg.TLS.Flags(fs)
	debugAddr := fs.String("debug-addr", "", "serve net/http/pprof here (off when empty)")
	// A soft limit below what the broker holds live makes the garbage
	// collector run back to back (docs/limits.md, "Memory grows with the
	// copies a broker holds"): 1 GiB leaves a 10,000-copy broker, about
	// 400 MiB live, its headroom.
	memLimit := fs.Int64("memory-limit-mb", 1024, "soft Go memory limit in MiB (GOMEMLIMIT wins when set); keeps a broker's resident memory flat under load: size it at twice its live memory, about 40 KiB per copy it holds (docs/limits.md)")
	cfg.HTTPLimits.RegisterFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if os.Getenv("GOMEMLIMIT") == "" && *memLimit > 0 {
		debug.SetMemoryLimit(*memLimit << 20)
	}
	cfg.Etcd = strings.Split(etcd, ",")
	// Secure by default (docs/operating.md, "Security"): TLS and
	// authentication go together, and --insecure turns both off.
	cfg.Auth.Enabled = !cfg.TLS.Insecure
	cfg.PeerToken = rpcserver.PeerToken()
	cfg.PeerTokensAccepted = rpcserver.PeerTokensAccepted()
	if err := debugserver.Listen(*debugAddr); err != nil {
		fmt.Fprintln(os.Stderr, "strand-broker:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "strand-broker:", err)
		os.Exit(1)
	}
}
