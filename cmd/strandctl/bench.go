package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/bench"
	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
)

// benchFlags are the bench's own flags.
type benchFlags struct {
	secure        bool
	stream        string
	streams       int
	probeWorkers  int
	createWorkers int
	idleWindow    time.Duration
	etcd          string
	copies        int
	policy        string
	nodes         int
	size          int
	inflight      int
	noProducerIDs bool
	lanes         int
	linger        time.Duration
	publishers    string
	duration      time.Duration
	warmup        time.Duration
	killAt        float64
	restartAfter  float64
	handoverAt    float64
	killSignal    string
	plot          string
	brokers       int
	binDir        string
}

func (b *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.stream, "stream", bench.DefaultStream, "stream to create and publish to; with --streams above 1 the base of the streams' names (durable-0000, durable-0001, ...)")
	fs.IntVar(&b.streams, "streams", bench.DefaultStreams, "streams to create (--create-workers at a time; create_ms is until all exist, ready_ms until all serve) and spread the --inflight window over, round-robin by record; with --kill-owner-at-secs the broker owning the most of them is killed, and streams_failed_over, all_serving_ms (kill to the last of its streams confirming a publish again, from the load or a probe, see --probe-workers) and serving_p50_ms (the median stream) report the failover")
	fs.IntVar(&b.probeWorkers, "probe-workers", bench.DefaultProbeWorkers, "with --kill-owner-at-secs, from the kill on publish one probe record to each stream the killed broker owned, this many at a time, each once the bench's etcd watch saw the stream's new assignment (the client's Publish with its retries, each within --timeout; none sent after the run's end plus --timeout), so every one is asked to serve again however rarely the load comes round to it; a stream's serving time is its first confirm after the kill, from the load or its probe, whichever is first (streams_served_by_probe: those a probe's was). Probes are ordinary records, read back and verified with the others, counted in confirmed, not in records_per_s or the latencies; probes and probes_failed report them. 0: no probes")
	fs.IntVar(&b.createWorkers, "create-workers", bench.DefaultCreateWorkers, "CreateStream calls at once (the controller serves 64 admin calls at once and queues 2048); a create the controller refuses as busy (Unavailable with a RetryInfo) is sent again after the delay it names, up to 60 times and within --timeout (create_busy_retries counts them)")
	fs.DurationVar(&b.idleWindow, "idle-window", bench.DefaultIdleWindow, "watch the cluster this long with the streams created and nothing published, for the _idle figures (etcd_revisions_per_s_idle, the CPU and memory ones); 0: no idle window. controller_cpu_pct, recoverer_cpu_pct, broker_cpu_pct (mean over the brokers that ran the whole window, the killed owner left out; percent of one core) and broker_peak_heap_mb (the brokers' peak anonymous resident memory) come from /proc of the processes the bench started: on a running cluster (--controller/--broker) the bench cannot see them and leaves those fields out")
	fs.StringVar(&b.etcd, "etcd", "", "etcd endpoints of a running cluster, comma separated, for etcd_revisions_per_s(_idle) and etcd_db_bytes (the bench's own cluster needs none; without it a running cluster's run leaves those fields out)")
	fs.IntVar(&b.copies, "copies", bench.DefaultCopies, "copies of the stream")
	fs.StringVar(&b.policy, "policy", bench.DefaultPolicy, "confirm policy")
	fs.IntVar(&b.nodes, "nodes", 0, "copy count for replica_durable and replica_accepted")
	fs.IntVar(&b.size, "size", bench.DefaultSize, "record size in bytes")
	fs.IntVar(&b.inflight, "inflight", bench.DefaultInflight, "records in flight at once")
	fs.BoolVar(&b.noProducerIDs, "no-producer-ids", false, "publish without producer ids (no idempotent publish), to measure what dedupe costs; with --publishers sync every record is then a request of its own (the client batches only PublishAsync calls when not idempotent)")
	fs.IntVar(&b.lanes, "lanes", 0, "idempotent batches in flight per stream (0: the client's default, 1)")
	fs.DurationVar(&b.linger, "linger", 0, "how long a lane waits after a confirm for the publishers it released (0: the client's default, 2ms; negative: never; one lane only)")
	fs.StringVar(&b.publishers, "publishers", bench.PublishersAsync, "async: one goroutine keeps the window full with PublishAsync (as NATS's and Kafka's producers do); sync: a goroutine per record in flight, each calling Publish")
	fs.DurationVar(&b.duration, "duration", bench.DefaultDuration, "how long to publish and measure")
	fs.DurationVar(&b.warmup, "warmup", 0, "publish this long first, outside the measurement: records/s, latencies, CPU and stages cover --duration after it (confirmed, stored, failed and dedupe hits count it; every record is verified)")
	fs.Float64Var(&b.handoverAt, "handover-at-secs", 0, "hand the (first) stream over to a follower this many seconds in (strandctl failover --to), and report handover_unavailable_ms: the longest stretch without a confirm around it (0: no handover)")
	fs.Float64Var(&b.killAt, "kill-owner-at-secs", 0, "kill the stream's owner this many seconds in (with --streams, the broker owning the most of them; 0: no kill)")
	fs.Float64Var(&b.restartAfter, "restart-owner-after-secs", 0, "start the killed owner again this many seconds after the kill, while publishing goes on (0: after the run), and report records_missed (its tail gap at the restart), bytes_rereplicated (what the brokers stored from Follow from the restart until it caught up), rejoin_caught_up_ms and spare_copies (copies on brokers that held none of the stream: 0 within the controller's --replace-after)")
	fs.StringVar(&b.killSignal, "kill-signal", bench.DefaultKillSignal, "KILL, STOP or TERM")
	fs.StringVar(&b.plot, "plot", "", "write an SVG timeline of confirms to this file")
	fs.IntVar(&b.brokers, "brokers", 3, "brokers in the bench's own cluster")
	fs.BoolVar(&b.secure, "secure", false, "run the bench's own cluster with TLS (strandctl dev --secure's); a running cluster is dialled with TLS by --certs-dir or its cluster.json")
	fs.StringVar(&b.binDir, "bin-dir", "", "where the service binaries are (default: next to strandctl, else PATH)")
}

// config turns the flags into a bench config; external says whether the
// bench targets a running cluster (--controller/--broker).
func (b *benchFlags) config(external bool, timeout time.Duration) (bench.Config, error) {
	if b.handoverAt < 0 || math.IsNaN(b.handoverAt) || math.IsInf(b.handoverAt, 0) {
		return bench.Config{}, usagef("--handover-at-secs must be a positive number of seconds, got %v", b.handoverAt)
	}
	if b.killAt < 0 || math.IsNaN(b.killAt) || math.IsInf(b.killAt, 0) {
		return bench.Config{}, usagef("--kill-owner-at-secs must be a positive number of seconds, got %v", b.killAt)
	}
	if b.restartAfter < 0 || math.IsNaN(b.restartAfter) || math.IsInf(b.restartAfter, 0) {
		return bench.Config{}, usagef("--restart-owner-after-secs must be a positive number of seconds, got %v", b.restartAfter)
	}
	cfg := bench.Config{
		Stream: b.stream, Streams: b.streams, ProbeWorkers: b.probeWorkers, CreateWorkers: b.createWorkers, Timeout: timeout, IdleWindow: b.idleWindow, Copies: b.copies, Policy: b.policy, Nodes: b.nodes, Size: b.size, Inflight: b.inflight, NoProducerIDs: b.noProducerIDs, Lanes: b.lanes, Linger: b.linger, Publishers: b.publishers,
		Duration: b.duration, Warmup: b.warmup, KillAt: time.Duration(b.killAt * float64(time.Second)), HandoverAt: time.Duration(b.handoverAt * float64(time.Second)), KillSignal: b.killSignal,
		RestartAfter: time.Duration(b.restartAfter * float64(time.Second)),
		Plot:         b.plot, Brokers: b.brokers, External: external,
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{strings.TrimPrefix(err.Error(), "bench: ")}
	}
	return cfg, nil
}

func benchCommand() *command {
	var b benchFlags
	return &command{
		name:    "bench",
		summary: "cluster bench: publish with a bounded window, optionally kill the owner, restart it, verify every confirm",
		flags:   b.register,
		run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
			if err := needArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			external := e.g.controller != "" || e.g.broker != ""
			cfg, err := b.config(external, e.g.timeout)
			if err != nil {
				return err
			}
			opts := bench.Options{Config: cfg, BinDir: b.binDir, Stderr: e.stderr, Secure: b.secure}
			if b.secure && external {
				return usagef("--secure is for the bench's own cluster; a running one is dialled with TLS by --certs-dir")
			}
			if b.etcd != "" && !external {
				return usagef("--etcd is for a running cluster (with --controller/--broker); the bench's own cluster has its etcd")
			}
			if external {
				opts.Etcd = splitList(b.etcd)
				cl, err := e.cluster()
				if err != nil {
					return err
				}
				opts.Controller, opts.BrokerAddrs, opts.TLS = cl.Controller, cl.Brokers, cl.TLS
				if opts.Controller == "" {
					return usagef("the bench needs --controller to create its stream")
				}
			}
			res, err := bench.Run(ctx, opts)
			if errors.Is(err, bench.ErrInvalid) {
				return usageError{err.Error()}
			}
			if errors.Is(err, devcluster.ErrNoCluster) || err != nil {
				return err
			}
			if err := printJSON(e.stdout, res); err != nil {
				return err
			}
			if !res.OK {
				return fmt.Errorf("%w: lost %d, duplicates %d, offset mismatches %d", bench.ErrNotOK, res.Lost, res.Duplicates, res.OffsetMismatches)
			}
			return nil
		},
	}
}
