// Package bench is `strandctl bench`: publish with a
// bounded in-flight window through the client, optionally kill the owner
// partway, restart it, read the stream back and prove that every confirmed
// record is stored once at the offset its confirm named.
//
// The decisions (validation, verification, percentiles, gaps, the timeline)
// are pure functions with table tests; run.go drives a cluster with them.
package bench

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

// Config is the bench's settings.
type Config struct {
	// Stream is the stream's name, or with Streams above 1 the base of
	// the streams' names (StreamNames).
	Stream string
	// Streams is how many streams to create and spread the window over
	// (at least 1).
	Streams  int
	Copies   int
	Policy   string
	Nodes    int
	Size     int
	Inflight int
	// NoProducerIDs publishes without producer ids and sequences (no
	// idempotent publish), to measure what dedupe costs; retries may then
	// store a record twice. The client batches non-idempotent PublishAsync
	// calls but sends each non-idempotent Publish as a request of its own,
	// so with sync publishers this measures unbatched publishing.
	NoProducerIDs bool
	// Lanes is the client's batches in flight per stream (client.Config
	// Lanes; 0: the client's default).
	Lanes int
	// Linger is the client's wait after a confirm for the publishers it
	// released (client.Config Linger; 0: the client's default, negative:
	// never).
	Linger time.Duration
	// Publishers is how the window is kept full: PublishersAsync (one
	// goroutine with PublishAsync, the way NATS's and Kafka's producers
	// work) or PublishersSync (a goroutine per record in flight, each
	// calling Publish). "" means PublishersAsync.
	Publishers string
	Duration   time.Duration
	// Warmup is how long to publish before the measured Duration: its
	// confirms count toward no rate, latency, CPU or stage figure (every
	// record is still verified), as benches of other stores leave out
	// their start (connections, first files, heap growth). 0: measure
	// from the first publish.
	Warmup time.Duration
	// KillAt is when to kill the owner, from the start of publishing; 0
	// (or negative) means no kill: a plain throughput and latency bench.
	KillAt     time.Duration
	KillSignal string
	// RestartAfter starts the killed owner again this long after the kill,
	// while publishing goes on (0: only after the run). Within the
	// controller's --replace-after the copy rejoins from its own tail;
	// the run reports records_missed, bytes_rereplicated and spare_copies.
	RestartAfter time.Duration
	// HandoverAt is when to hand the (first) stream over to a follower
	// with a failover to it (docs/protocol.md, "Handover"), from the start
	// of publishing; 0 means none. It reports handover_unavailable_ms.
	HandoverAt time.Duration
	Plot       string
	// IdleWindow is how long the bench watches the cluster, streams
	// created and nothing published, before it publishes: the idle CPU,
	// memory and etcd revision rate (0: no idle window).
	IdleWindow time.Duration
	// ProbeWorkers bounds the probes after a kill (0: none): from the
	// kill on, the bench publishes one probe record to each stream the
	// killed broker owned, this many at a time, so every one of them is
	// asked to serve again within the run however many streams share the
	// window. A probe is an ordinary record (its id is from the load's
	// sequence, it is read back and verified with the others).
	ProbeWorkers int
	// CreateWorkers bounds the CreateStream calls the bench makes at once
	// (0: DefaultCreateWorkers).
	CreateWorkers int
	// Timeout bounds one create (its retries included) and one probe
	// (strandctl --timeout); 0 means the client's retry budget.
	Timeout time.Duration
	// Brokers is the cluster size when the bench starts its own cluster.
	Brokers int
	// External is set when the bench targets a running cluster.
	External bool
}

// Defaults, as `make bench-failover` runs them.
const (
	DefaultStream     = "durable"
	DefaultCopies     = 3
	DefaultPolicy     = cluster.MajorityDurable
	DefaultSize       = 1024
	DefaultInflight   = 256
	DefaultDuration   = 20 * time.Second
	DefaultKillSignal = "KILL"
	DefaultStreams    = 1
	DefaultIdleWindow = 10 * time.Second
	// DefaultProbeWorkers probes up to 4,096 streams at once after a
	// kill. The probes stand for each stream's own producers, which do not
	// wait for one another, so a probe should wait for its stream, never
	// for a worker: at 64, the 3,334 streams of a killed broker of 10,000
	// queued 52 deep for the workers, and the queue, not the cluster, was
	// most of serve_after_assigned (p50 1.8-3.3 s); at 512 it still was
	// (p50 1.9 s, all serving 6.0-6.5 s), at 1,024 p50 0.8 s and all
	// serving 4.2 s. A probe is sent only once its stream's new assignment
	// is committed, so a worker seldom waits on a stream still
	// recovering, and the client gathers the probes bound for one broker
	// into a few PublishMany calls, so a worker costs the bench a
	// goroutine, not a connection.
	DefaultProbeWorkers = 4096
	// DefaultCreateWorkers matches the admin calls the controller serves
	// at once (docs/errors.md, "AdminService"): more only wait in its
	// queue, and the bench's other admin calls would wait behind them.
	DefaultCreateWorkers = 64
	// MaxWorkers bounds --create-workers.
	MaxWorkers = 1024
	// MaxProbeWorkers bounds --probe-workers: one per stream of a killed
	// broker of a large cluster, a goroutine each.
	MaxProbeWorkers = 16384
)

// The two ways of keeping the window full (Config.Publishers).
const (
	PublishersAsync = "async"
	PublishersSync  = "sync"
)

// MinSize is the smallest record: the id prefix must fit.
const MinSize = 24

// ErrInvalid marks a setting the bench refuses (exit code 2).
var ErrInvalid = errors.New("bench: invalid settings")

// Validate refuses impossible settings with a message naming the flag.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if c.Streams < 1 || c.Streams > MaxStreams {
		return bad("--streams must be 1..%d, got %d", MaxStreams, c.Streams)
	}
	// The longest derived name is the last one.
	names := StreamNames(c.Stream, c.Streams)
	if err := cluster.ValidateStreamName(names[len(names)-1]); err != nil {
		return bad("--stream: %v", err)
	}
	if c.IdleWindow < 0 {
		return bad("--idle-window must be 0 (none) or more, got %v", c.IdleWindow)
	}
	if c.Duration <= 0 {
		return bad("--duration must be positive, got %v", c.Duration)
	}
	if c.Warmup < 0 {
		return bad("--warmup must be 0 or more, got %v", c.Warmup)
	}
	if c.Warmup > 0 && c.KillAt > 0 {
		return bad("--warmup is for runs without --kill-owner-at-secs (a failover run measures from its first publish)")
	}
	if c.KillAt > 0 && c.KillAt >= c.Duration {
		return bad("--kill-owner-at-secs %v is not before the end of --duration %v", c.KillAt.Seconds(), c.Duration)
	}
	if c.RestartAfter < 0 {
		return bad("--restart-owner-after-secs must be 0 (restart after the run) or more, got %v", c.RestartAfter.Seconds())
	}
	if c.RestartAfter > 0 {
		switch {
		case c.KillAt <= 0:
			return bad("--restart-owner-after-secs needs --kill-owner-at-secs: it restarts the killed owner")
		case c.KillAt+c.RestartAfter >= c.Duration:
			return bad("--kill-owner-at-secs %v plus --restart-owner-after-secs %v is not before the end of --duration %v",
				c.KillAt.Seconds(), c.RestartAfter.Seconds(), c.Duration)
		case c.KillSignal == "STOP" || c.KillSignal == "SIGSTOP":
			return bad("--restart-owner-after-secs restarts a process that exited: use --kill-signal KILL or TERM")
		}
	}
	if c.HandoverAt > 0 {
		switch {
		case c.KillAt > 0:
			return bad("--handover-at-secs and --kill-owner-at-secs measure different moves: give one")
		case c.HandoverAt >= c.Duration:
			return bad("--handover-at-secs %v is not before the end of --duration %v", c.HandoverAt.Seconds(), c.Duration)
		case c.Copies < 2:
			return bad("--handover-at-secs needs --copies 2 or more: a handover moves the stream to a follower")
		case c.Warmup > 0:
			return bad("--warmup is for runs without --handover-at-secs")
		}
	}
	if c.Copies < 1 || c.Copies > 7 {
		return bad("--copies must be 1..7, got %d", c.Copies)
	}
	if !c.External && c.Copies > c.Brokers {
		return bad("--copies %d is above the %d brokers (--brokers)", c.Copies, c.Brokers)
	}
	if err := (cluster.Policy{Name: c.Policy, Nodes: c.Nodes}).Validate(); err != nil || c.Policy == "" {
		return bad("--policy %q: want local_durable, majority_durable, replica_durable or replica_accepted (with --nodes)", c.Policy)
	}
	if c.Size < MinSize {
		return bad("--size must be at least %d bytes (the record id prefix), got %d", MinSize, c.Size)
	}
	if c.Lanes < 0 || c.Lanes > 64 {
		return bad("--lanes must be 0 (the client's default) to 64, got %d", c.Lanes)
	}
	if c.Linger > time.Second {
		return bad("--linger must be at most 1s (0: the client's default, negative: never), got %v", c.Linger)
	}
	if c.Publishers != "" && c.Publishers != PublishersAsync && c.Publishers != PublishersSync {
		return bad("--publishers %q: want async or sync", c.Publishers)
	}
	if c.ProbeWorkers < 0 || c.ProbeWorkers > MaxProbeWorkers {
		return bad("--probe-workers must be 0 (no probes) to %d, got %d", MaxProbeWorkers, c.ProbeWorkers)
	}
	if c.CreateWorkers < 0 || c.CreateWorkers > MaxWorkers {
		return bad("--create-workers must be 1 to %d (0: %d), got %d", MaxWorkers, DefaultCreateWorkers, c.CreateWorkers)
	}
	if c.Timeout < 0 {
		return bad("--timeout must be positive (0: the client's retry budget), got %v", c.Timeout)
	}
	if c.Inflight < 1 {
		return bad("--inflight must be at least 1, got %d", c.Inflight)
	}
	if c.KillAt > 0 {
		if _, err := ParseSignal(c.KillSignal); err != nil {
			return bad("%v", err)
		}
		if c.External {
			return bad("--kill-owner-at-secs needs a cluster the bench starts itself (drop --controller/--broker)")
		}
		if c.Copies < 2 {
			return bad("--kill-owner-at-secs needs --copies 2 or more: a single-copy stream waits for its owner")
		}
	}
	return nil
}

// ParseSignal maps KILL, STOP and TERM to signals.
func ParseSignal(s string) (syscall.Signal, error) {
	switch s {
	case "KILL", "SIGKILL":
		return syscall.SIGKILL, nil
	case "STOP", "SIGSTOP":
		return syscall.SIGSTOP, nil
	case "TERM", "SIGTERM":
		return syscall.SIGTERM, nil
	}
	return 0, fmt.Errorf("--kill-signal %q: want KILL, STOP or TERM", s)
}
