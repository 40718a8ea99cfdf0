package bench

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/procfs"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/rpcserver"
)

// Options are the settings plus where the bench runs.
type Options struct {
	Config
	// Controller and BrokerAddrs target a running cluster (Config.External).
	Controller  string
	BrokerAddrs []string
	// Etcd is the etcd endpoints of a running cluster, for the etcd
	// figures (optional; the bench's own cluster has its own etcd).
	Etcd []string
	// BinDir is where the service binaries are for the bench's own cluster.
	BinDir string
	// Secure runs the bench's own cluster with TLS (devcluster.Options.Secure);
	// TLS is a running cluster's (strandctl --certs-dir, or a secure dev
	// cluster's cluster.json).
	Secure bool
	TLS    *tls.Config
	// Stderr receives progress lines.
	Stderr io.Writer
}

// Result is the bench's JSON line.
type Result struct {
	Confirmed        int     `json:"confirmed"`
	Lost             int     `json:"lost"`
	Duplicates       int     `json:"duplicates"`
	OffsetMismatches int     `json:"offset_mismatches"`
	RecordsPerS      float64 `json:"records_per_s"`
	MBPerS           float64 `json:"mb_per_s"`
	ConfirmP50Ms     float64 `json:"confirm_p50_ms"`
	ConfirmP99Ms     float64 `json:"confirm_p99_ms"`
	// UnavailableMs is from the kill to the first confirm of a publish
	// sent after it, to one of the streams the killed broker owned.
	UnavailableMs      float64 `json:"unavailable_ms"`
	MaxGapMs           float64 `json:"max_gap_ms"`
	OldOwner           string  `json:"old_owner"`
	NewOwner           string  `json:"new_owner"`
	RejoinedAsFollower bool    `json:"rejoined_as_follower"`
	// The restart within --replace-after (--restart-owner-after-secs):
	// RecordsMissed is the killed copies' tail gap at the restart
	// (RecordsMissed); BytesRereplicated what every broker stored from
	// Follow from the restart until the returning copy reached the tail
	// the stream had at the restart (with the records published meanwhile
	// that every follower stored), BytesReturningCopy the part the
	// returning copy stored, RejoinCaughtUpMs how long that took;
	// SpareCopies the copies at the end on brokers that held none of the
	// stream at its creation (SpareCopies: 0 when nothing was replaced).
	RestartAfterS      float64  `json:"restart_after_s,omitempty"`
	RecordsMissed      *int64   `json:"records_missed,omitempty"`
	BytesRereplicated  *int64   `json:"bytes_rereplicated,omitempty"`
	BytesReturningCopy *int64   `json:"bytes_returning_copy,omitempty"`
	RejoinCaughtUpMs   *float64 `json:"rejoin_caught_up_ms,omitempty"`
	SpareCopies        *int     `json:"spare_copies,omitempty"`
	Recoveries         int      `json:"recoveries"`
	BrokerPeakRSSMB    float64  `json:"broker_peak_rss_mb"`
	// BrokerPeakAnonMB is the largest anonymous resident memory seen in a
	// broker (heap, stacks): RSS less the file pages Badger maps, which the
	// kernel can reclaim.
	BrokerPeakAnonMB float64 `json:"broker_peak_anon_mb"`
	// BrokerCPUUsPerRecord is the CPU time (user and system) all brokers
	// spent while publishing, per confirmed record, from /proc/PID/stat at
	// the start and the end of the publishing window: what replication
	// costs in CPU, which bounds throughput on a small machine. Runs
	// without a kill on a cluster the bench started only (0 otherwise).
	BrokerCPUUsPerRecord float64 `json:"broker_cpu_us_per_record"`
	// ClusterCPUUsPerRecord is BrokerCPUUsPerRecord over every process of
	// the run: the brokers, the controller, the recoverer and the bench's
	// own (the client publishing and the embedded etcd). On a machine
	// whose cores the bench shares, this is what bounds its throughput,
	// and what TLS adds to (strandctl bench --secure against without).
	ClusterCPUUsPerRecord float64 `json:"cluster_cpu_us_per_record"`
	// StageMeanMs is where a publish waited, as the mean milliseconds of
	// each stage over the publishing window, from the brokers' /metrics
	// (stages.go): on the owner publish_durable and publish_confirm (from
	// queued for the log), owner_commit_write and owner_commit_sync (one
	// committer batch), follow_ack (a batch sent to a follower until it is
	// acknowledged durable); on the followers follower_commit_write,
	// follower_commit_sync and follow_apply (a batch received until
	// durable). With --streams above 1 every broker owns some streams and
	// follows others: every stage is over every broker, and the committer's
	// are commit_write and commit_sync. Runs without a kill on a cluster
	// the bench started only.
	StageMeanMs map[string]float64 `json:"stage_mean_ms,omitempty"`

	// The failover split into phases (runs with a kill only), adding up to
	// unavailable_ms: kill → the pending recovery recorded (detect) → the
	// recoverer's promote decision on its seal answers (seal) → its
	// guarded commit of the new assignment (commit) → the new owner
	// promoted (apply) → the first confirm of a publish sent after the
	// kill (first_confirm). -1: that phase's end was not found.
	DetectMs       *float64 `json:"detect_ms,omitempty"`
	SealMs         *float64 `json:"seal_ms,omitempty"`
	CommitMs       *float64 `json:"commit_ms,omitempty"`
	ApplyMs        *float64 `json:"apply_ms,omitempty"`
	FirstConfirmMs *float64 `json:"first_confirm_ms,omitempty"`

	// The streams (--streams): how many, how long until the controller
	// had created all of them, and until every one had an owner that
	// answered Locate.
	Streams int `json:"streams"`
	// TLS says the cluster ran with TLS (strandctl bench --secure).
	TLS      bool    `json:"tls,omitempty"`
	CreateMs float64 `json:"create_ms"`
	ReadyMs  float64 `json:"ready_ms"`
	// CreateWorkers is the CreateStream calls made at once
	// (--create-workers); CreateBusyRetries how many of their attempts
	// the controller refused as busy (Unavailable with a RetryInfo) and
	// the bench sent again after the delay it named.
	CreateWorkers     int   `json:"create_workers"`
	CreateBusyRetries int64 `json:"create_busy_retries"`
	// The kill with many streams (runs with a kill only): the bench kills
	// the broker owning the most streams. streams_failed_over is how many
	// it owned; all_serving_ms the time from the kill until the last of
	// them confirmed a publish again (a confirm at a later epoch, or of a
	// publish sent after the kill), serving_p50_ms the median of those
	// times; -1 when that stream (or the median one) did not serve again
	// within the run, streams_not_serving says how many.
	StreamsFailedOver *int     `json:"streams_failed_over,omitempty"`
	AllServingMs      *float64 `json:"all_serving_ms,omitempty"`
	ServingP50Ms      *float64 `json:"serving_p50_ms,omitempty"`
	StreamsNotServing int      `json:"streams_not_serving,omitempty"`
	// The probes after the kill (--probe-workers; runs with a kill
	// only): probe_workers at once, probes sent (one per stream the
	// killed broker owned, unless the run ended first), probes_failed of
	// them not confirmed within --timeout, and streams_served_by_probe of
	// the streams that served again whose first proof was a probe's
	// confirm rather than the load's. Probe records count in confirmed,
	// stored and the verification, not in the load's rates, latencies or
	// failed.
	ProbeWorkers         int  `json:"probe_workers,omitempty"`
	Probes               int  `json:"probes,omitempty"`
	ProbesFailed         int  `json:"probes_failed,omitempty"`
	StreamsServedByProbe *int `json:"streams_served_by_probe,omitempty"`
	// The failover of all those streams split as the phase stream's is
	// (SummarizeMassFailover; runs with a kill on the bench's own
	// cluster): from the kill until the last of them had its pending
	// recovery recorded, and the median; until the last had its new
	// assignment committed, and the median (both as the bench's etcd
	// watch received them); and per stream from its new assignment to its
	// first serving confirm, the median and the longest. -1: a stream's
	// (or the median one's) was not seen.
	AllRecoveryRecordedMs   *float64 `json:"all_recovery_recorded_ms,omitempty"`
	RecoveryRecordedP50Ms   *float64 `json:"recovery_recorded_p50_ms,omitempty"`
	AllAssignedMs           *float64 `json:"all_assigned_ms,omitempty"`
	AssignedP50Ms           *float64 `json:"assigned_p50_ms,omitempty"`
	ServeAfterAssignedP50Ms *float64 `json:"serve_after_assigned_p50_ms,omitempty"`
	ServeAfterAssignedMaxMs *float64 `json:"serve_after_assigned_max_ms,omitempty"`
	// StreamIntervalMs is, with many streams, the mean time between two
	// publishes to one stream (streams / records_per_s): a stream with
	// no publish in flight at the kill shows that it serves again only
	// with its next publish, so its serving time may hold up to about
	// this much of the bench's own pace.
	StreamIntervalMs float64 `json:"stream_interval_ms,omitempty"`
	// RejoinedStreams is, with many streams, of how many of the streams
	// it owned the restarted broker became a live follower again
	// (rejoined_as_follower: all of them).
	RejoinedStreams int `json:"rejoined_streams,omitempty"`
	// PhaseStream is the stream whose failover the phases above and
	// new_owner describe, with many streams.
	PhaseStream string `json:"phase_stream,omitempty"`

	// What the cluster costs, over the measured window and (the _idle
	// figures) over the idle window before publishing (--idle-window):
	// etcd's revisions per second (writes to etcd, heartbeats included),
	// the CPU of the controller, the recoverer and the mean over the
	// brokers (percent of one core, from /proc/PID/stat; the killed owner
	// is left out of the loaded mean), and the brokers' peak anonymous
	// resident memory (heap and stacks, sampled every 250 ms). The CPU
	// and memory need the bench's own cluster (absent otherwise), etcd's
	// figures its etcd or --etcd. etcd_db_bytes is etcd's database size
	// at the end.
	EtcdRevisionsPerS     *float64 `json:"etcd_revisions_per_s,omitempty"`
	EtcdRevisionsPerSIdle *float64 `json:"etcd_revisions_per_s_idle,omitempty"`
	EtcdDBBytes           *int64   `json:"etcd_db_bytes,omitempty"`
	ControllerCPUPct      *float64 `json:"controller_cpu_pct,omitempty"`
	ControllerCPUPctIdle  *float64 `json:"controller_cpu_pct_idle,omitempty"`
	RecovererCPUPct       *float64 `json:"recoverer_cpu_pct,omitempty"`
	RecovererCPUPctIdle   *float64 `json:"recoverer_cpu_pct_idle,omitempty"`
	BrokerCPUPct          *float64 `json:"broker_cpu_pct,omitempty"`
	BrokerCPUPctIdle      *float64 `json:"broker_cpu_pct_idle,omitempty"`
	BrokerPeakHeapMB      *float64 `json:"broker_peak_heap_mb,omitempty"`
	BrokerPeakHeapMBIdle  *float64 `json:"broker_peak_heap_mb_idle,omitempty"`
	IdleWindowS           float64  `json:"idle_window_s,omitempty"`

	// Context for the figures above.
	OK                bool     `json:"ok"`
	Failed            int      `json:"failed"`
	UnconfirmedStored int      `json:"unconfirmed_stored"`
	DedupeHits        int      `json:"dedupe_hits"`
	Stored            int      `json:"stored"`
	ConfirmMaxMs      float64  `json:"confirm_max_ms"`
	NewAssignmentMs   float64  `json:"new_assignment_ms"`
	RecoveryReason    string   `json:"recovery_reason,omitempty"`
	PhaseNotes        []string `json:"phase_notes,omitempty"`
	DurationS         float64  `json:"duration_s"`
	WarmupS           float64  `json:"warmup_s,omitempty"`
	KillAtS           float64  `json:"kill_at_s,omitempty"`
	// The handover (--handover-at-secs): when it was asked for, the
	// longest stretch without a confirm around it (HandoverUnavailable),
	// and the owner it moved from and to.
	HandoverAtS           float64  `json:"handover_at_s,omitempty"`
	HandoverUnavailableMs *float64 `json:"handover_unavailable_ms,omitempty"`
	HandoverFrom          string   `json:"handover_from,omitempty"`
	HandoverTo            string   `json:"handover_to,omitempty"`
	// HandoverAttempts counts the Failover calls made: refusals
	// (FailedPrecondition) are asked again for up to 5 s.
	HandoverAttempts int      `json:"handover_attempts,omitempty"`
	KillSignal       string   `json:"kill_signal,omitempty"`
	Stream           string   `json:"stream"`
	Copies           int      `json:"copies"`
	Policy           string   `json:"policy"`
	Size             int      `json:"size"`
	Inflight         int      `json:"inflight"`
	Publishers       string   `json:"publishers"`
	ProducerIDs      bool     `json:"producer_ids"`
	Problems         []string `json:"problems,omitempty"`
}

// Run runs the bench. It cleans up the processes and temp dir it made, also
// when ctx is cancelled (Ctrl-C).
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	r := &runner{o: o, res: &Result{Stream: o.Stream, Copies: o.Copies, Policy: policyName(o.Config), Size: o.Size, Inflight: o.Inflight, Publishers: cmp.Or(o.Publishers, PublishersAsync), ProducerIDs: !o.NoProducerIDs,
		Streams: o.Streams}, phaseStream: -1}
	r.names = StreamNames(o.Stream, o.Streams)
	r.index = make(map[string]int, len(r.names))
	for i, n := range r.names {
		r.index[n] = i
	}
	if !o.External {
		dir, err := os.MkdirTemp("", "strand-bench-")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		port, err := devcluster.FreePortBase(o.Brokers)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Stderr, "bench: starting a cluster of %d brokers in %s\n", o.Brokers, dir)
		dopts := devcluster.Options{Dir: dir, Brokers: o.Brokers, PortBase: port, BinDir: o.BinDir, Log: o.Stderr, Secure: o.Secure}
		if o.KillAt > 0 {
			// The seal phase ends at the recoverer's "seal round done",
			// a debug line.
			dopts.RecovererArgs = []string{"--log-level", "debug"}
		}
		cl, err := devcluster.Start(ctx, dopts)
		if err != nil {
			return nil, err
		}
		defer func() { _ = cl.Close() }()
		r.cl, r.etcd = cl, cl.Etcd()
		info := cl.Info()
		o.Controller, o.BrokerAddrs, o.TLS = info.Controller, info.BrokerAddresses(), cl.ClientTLS()
	}
	r.o.TLS = o.TLS
	r.res.TLS = o.TLS != nil
	if o.External && len(o.Etcd) > 0 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: o.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("bench: etcd client: %w", err)
		}
		defer func() { _ = cli.Close() }()
		r.etcd = cli
	}
	c, err := client.New(client.Config{Controller: o.Controller, Brokers: o.BrokerAddrs, Idempotent: client.Bool(!o.NoProducerIDs), Lanes: o.Lanes, Linger: o.Linger, TLS: o.TLS,
		Options: []connect.ClientOption{connect.WithInterceptors(waitRetryInfo(&r.busyRetries))}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	r.c = c
	if err := r.run(ctx); err != nil {
		return nil, err
	}
	return r.res, nil
}

func policyName(c Config) string {
	if c.Nodes > 0 {
		return c.Policy + ":" + strconv.Itoa(c.Nodes)
	}
	return c.Policy
}

type runner struct {
	o   Options
	cl  *devcluster.Cluster // nil for an external cluster
	c   *client.Client
	res *Result
	// etcd is the cluster's etcd, for its revision and size: the bench's
	// own, or the one --etcd names; nil when there is none.
	etcd *clientv3.Client
	// names are the streams (StreamNames), index their positions.
	names []string
	index map[string]int

	start time.Time
	// nextID numbers the records, the load's and the probes' alike, so
	// every id is unique across the streams (Verify).
	nextID    atomic.Uint64
	confirmed atomic.Int64
	failed    atomic.Int64
	peakRSS   atomic.Int64 // kB
	peakAnon  atomic.Int64 // kB
	// busyRetries counts create attempts refused busy (waitRetryInfo).
	busyRetries atomic.Int64

	// The probes after the kill (probe): their confirms, how many were
	// sent and failed, and the wait for the last of them.
	probeMu      sync.Mutex
	probes       []Confirm
	probesSent   atomic.Int64
	probesFailed atomic.Int64
	probeWG      sync.WaitGroup

	// watch records the recovery and assignment keys' changes (kill
	// runs on the bench's own cluster), streamsWatch those of every
	// stream the killed broker owned.
	watch        *keyWatch
	streamsWatch *streamsWatch

	mu sync.Mutex
	// owner and oldEpoch are the phase stream's owner and epoch when it
	// was killed (before the kill: the first stream's owner).
	owner    string
	oldEpoch uint64
	killAt   time.Duration
	newAt    time.Duration
	newOwner string
	// killed is the broker the bench killed; killEpochs the epoch, at the
	// kill, of each stream it owned (by index); phaseStream the one of
	// them whose failover is split into phases and whose new owner is
	// reported (the first by name; -1 before the kill).
	killed      string
	killEpochs  map[int]uint64
	phaseStream int
	// handoverFrom and handoverTo bound the handover call (since start).
	handoverFrom, handoverTo time.Duration
	// restartAt is when the killed owner was started again mid-run
	// (RestartAfter; 0: not yet); membersBefore every stream's members
	// at its creation, for spare_copies.
	restartAt     time.Duration
	membersBefore map[string][]string
}

func (r *runner) since() time.Duration { return time.Since(r.start) }

func (r *runner) run(ctx context.Context) error {
	o := r.o
	historyBefore, err := r.createStreams(ctx)
	if err != nil {
		return err
	}
	// The kill starts the watch on the stream whose phases it reports
	// (kill); it ends with the run.
	defer func() {
		r.mu.Lock()
		w := r.watch
		r.mu.Unlock()
		if w != nil {
			w.stop()
		}
		r.mu.Lock()
		sw := r.streamsWatch
		r.mu.Unlock()
		if sw != nil {
			sw.stop()
		}
	}()
	if o.IdleWindow > 0 {
		if err := r.idle(ctx); err != nil {
			return err
		}
	}

	// Publish, for the warm-up and then the measured duration. The CPU
	// and stage figures start with the measured part.
	end := o.Warmup + o.Duration
	var (
		cpuBefore    time.Duration
		cpuOK        bool
		allCPUBefore time.Duration
		allCPUOK     bool
		stagesBefore map[string]brokerHistograms
		loaded       *usageWindow
	)
	measureFrom := func() {
		loaded = r.startUsage(ctx)
		cpuBefore, cpuOK = r.brokerCPU()
		allCPUBefore, allCPUOK = r.clusterCPU()
		stagesBefore = r.brokerHistograms(ctx)
	}
	if o.Warmup <= 0 {
		measureFrom()
	}
	r.start = time.Now()
	var (
		wg     sync.WaitGroup
		dedupe atomic.Int64
		// confirms holds one slice per publisher goroutine (sync), or
		// chunks that the done callbacks append to under confirmsMu
		// (async: callbacks may overlap, with several lanes, without
		// producer ids, or for a call dropped at the end). Chunks, not one
		// slice: growing a slice of a million confirms copies tens of
		// megabytes on the lane's goroutine and stalls every publish.
		confirms   [][]Confirm
		confirmsMu sync.Mutex
	)
	const confirmChunk = 1 << 16
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	record := func(w int, id uint64, stream int, sent, done time.Duration, res *strandv1.PublishResponse) {
		dup := len(res.GetDuplicate()) > 0 && res.GetDuplicate()[0]
		if dup {
			dedupe.Add(1)
		}
		confirms[w] = append(confirms[w], Confirm{ID: id, Offset: res.GetOffsets()[0], Epoch: res.GetEpoch(), Stream: uint32(stream),
			Sent: sent, Done: done, Duplicate: dup})
		r.confirmed.Add(1)
	}
	if r.res.Publishers == PublishersSync {
		confirms = make([][]Confirm, o.Inflight)
		for w := range o.Inflight {
			wg.Go(func() {
				for pubCtx.Err() == nil && r.since() < end {
					id := r.nextID.Add(1)
					stream := StreamFor(id, len(r.names))
					sent := r.since()
					res, err := r.c.Publish(pubCtx, r.names[stream], []*strandv1.Record{{Payload: RecordPayload(id, o.Size)}})
					if err != nil {
						r.failed.Add(1)
						continue
					}
					record(w, id, stream, sent, r.since(), res)
				}
			})
		}
	} else {
		confirms = [][]Confirm{make([]Confirm, 0, confirmChunk)}
		wg.Go(func() {
			// A slot per record in flight: a confirm frees its slot, and
			// this goroutine takes it for the next record at once.
			slots := make(chan struct{}, o.Inflight)
			var pending sync.WaitGroup
			for pubCtx.Err() == nil && r.since() < end {
				select {
				case slots <- struct{}{}:
				case <-pubCtx.Done():
					continue
				}
				if r.since() >= end {
					// The window was full until the end: nothing is
					// sent after it.
					<-slots
					break
				}
				id := r.nextID.Add(1)
				stream := StreamFor(id, len(r.names))
				sent := r.since()
				pending.Add(1)
				r.c.PublishAsync(pubCtx, r.names[stream], []*strandv1.Record{{Payload: RecordPayload(id, o.Size)}}, func(res *strandv1.PublishResponse, err error) {
					defer pending.Done()
					if err != nil {
						r.failed.Add(1)
					} else {
						done := r.since()
						confirmsMu.Lock()
						w := len(confirms) - 1
						if len(confirms[w]) == confirmChunk {
							confirms = append(confirms, make([]Confirm, 0, confirmChunk))
							w++
						}
						record(w, id, stream, sent, done, res)
						confirmsMu.Unlock()
					}
					<-slots
				})
			}
			if ctx.Err() != nil {
				// Interrupted: a batch in flight would otherwise
				// retry for the client's whole budget (the sync
				// publishers' calls end with pubCtx instead).
				_ = r.c.Close()
			}
			pending.Wait()
		})
	}
	bg, stopBg := context.WithCancel(ctx)
	var bgWG sync.WaitGroup
	bgWG.Go(func() { r.progress(bg) })
	warmedUp := make(chan struct{})
	if o.Warmup > 0 {
		bgWG.Go(func() {
			defer close(warmedUp)
			t := time.NewTimer(o.Warmup - r.since())
			defer t.Stop()
			select {
			case <-t.C:
				measureFrom()
			case <-bg.Done():
			}
		})
	} else {
		close(warmedUp)
	}
	var killErr, restartErr error
	if o.KillAt > 0 {
		bgWG.Go(func() { killErr = r.kill(bg, ctx, end) })
	}
	if o.RestartAfter > 0 {
		bgWG.Go(func() { restartErr = r.restartMidRun(bg, ctx) })
	}
	if o.HandoverAt > 0 {
		bgWG.Go(func() {
			if err := r.handover(bg); err != nil {
				fmt.Fprintf(o.Stderr, "bench: %v\n", err)
				r.mu.Lock()
				r.res.Problems = append(r.res.Problems, err.Error())
				r.mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := r.since()
	// Publishing outlasts the warm-up unless ctx ended it, which ends the
	// warm-up's wait too (bg is ctx's), and the scrape is bounded
	// (brokerHistograms): warmedUp closes either way. After ctx ended,
	// the figures are not reported (ctx.Err below).
	<-warmedUp
	cpuAfter, cpuAfterOK := r.brokerCPU()
	allCPUAfter, allCPUAfterOK := r.clusterCPU()
	if loaded != nil {
		r.mu.Lock()
		killed := r.killed
		r.mu.Unlock()
		u := loaded.end(ctx, r, killed)
		r.res.ControllerCPUPct, r.res.RecovererCPUPct, r.res.BrokerCPUPct = u.cpu.Controller, u.cpu.Recoverer, u.cpu.Broker
		r.res.BrokerPeakHeapMB, r.res.EtcdRevisionsPerS = u.peakAnonMB, u.revisionsPS
	}
	if stagesBefore != nil && o.KillAt <= 0 {
		if after := r.brokerHistograms(ctx); after != nil {
			owner := r.owner
			if len(r.names) > 1 {
				owner = "" // every broker owns some of the streams
			}
			r.res.StageMeanMs = stageMeans(owner, stagesBefore, after)
		}
	}
	if o.KillAt > 0 {
		// The kill watcher waits for the new assignment; give it until
		// the recovery would have to be stuck.
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		r.waitNewAssignment(waitCtx)
		cancel()
	}
	stopBg()
	bgWG.Wait()
	// The probes end on their own (each within --timeout, none started
	// after the run's end plus --timeout): their confirms are verified
	// with the others.
	r.probeWG.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	if killErr != nil {
		return killErr
	}
	if restartErr != nil {
		return restartErr
	}

	// all is every confirm, the probes' too, for the verification and
	// the failover figures; load is the publishing window's alone, for
	// the rates and latencies.
	byID := func(a, b Confirm) int { return cmp.Compare(a.ID, b.ID) }
	load := slices.Concat(confirms...)
	slices.SortFunc(load, byID)
	r.probeMu.Lock()
	all := slices.Concat(load, r.probes)
	r.probeMu.Unlock()
	slices.SortFunc(all, byID)
	measured := Measured(load, o.Warmup)
	if cpuAfterOK && cpuOK && o.KillAt <= 0 && len(measured) > 0 {
		r.res.BrokerCPUUsPerRecord = round(float64(cpuAfter-cpuBefore) / float64(len(measured)) / 1000)
	}
	if allCPUAfterOK && allCPUOK && o.KillAt <= 0 && len(measured) > 0 {
		r.res.ClusterCPUUsPerRecord = round(float64(allCPUAfter-allCPUBefore) / float64(len(measured)) / 1000)
	}
	r.res.DurationS = round((elapsed - o.Warmup).Seconds())
	r.res.WarmupS = round(o.Warmup.Seconds())
	r.res.Failed = int(r.failed.Load())
	r.res.DedupeHits = int(dedupe.Load())
	for _, p := range r.probes {
		if p.Duplicate {
			r.res.DedupeHits++
		}
	}

	// Bring the old owner back and wait for it to rejoin as a follower.
	if o.KillAt > 0 {
		if err := r.restartOldOwner(ctx); err != nil {
			fmt.Fprintf(o.Stderr, "bench: restarting %s: %v\n", r.res.OldOwner, err)
		}
	}
	after, err := r.getStreams(ctx)
	if err != nil {
		return fmt.Errorf("bench: get streams after the run: %w", err)
	}
	historyAfter := 0
	for _, a := range after {
		historyAfter += len(a.GetHistory())
	}
	r.res.Recoveries = historyAfter - historyBefore
	if o.RestartAfter > 0 {
		spare := SpareCopies(r.membersBefore, members(after))
		r.res.SpareCopies = &spare
		r.res.RestartAfterS = round(o.RestartAfter.Seconds())
		r.mu.Lock()
		restartAt, epochs := r.restartAt, r.killEpochs
		r.mu.Unlock()
		if restartAt > 0 {
			missed := RecordsMissed(all, epochs, restartAt)
			r.res.RecordsMissed = &missed
		}
	}
	if o.KillAt > 0 {
		r.mu.Lock()
		if r.newOwner == "" && r.phaseStream >= 0 {
			// The owner moved only after the run (a recovery that
			// waited for the killed broker to come back): no time to
			// report, but the owner it moved to.
			if owner := after[r.phaseStream].GetAssignment().GetOwner(); owner != r.owner {
				r.newOwner = owner
			}
		}
		r.mu.Unlock()
	}
	r.samplePeakRSS()
	if m, err := etcdStatus(ctx, r.etcd); err == nil {
		r.res.EtcdDBBytes = &m.db
	}

	// Read back and verify.
	stored, err := r.readAll(ctx)
	if err != nil {
		return fmt.Errorf("bench: read back: %w", err)
	}
	v := Verify(all, stored)
	r.res.Confirmed, r.res.Lost, r.res.Duplicates, r.res.OffsetMismatches = v.Confirmed, v.Lost, v.Duplicates, v.OffsetMismatches
	// Problems raised during the run (a handover refused) stay.
	r.res.UnconfirmedStored, r.res.Stored, r.res.OK = v.UnconfirmedStored, len(stored), v.OK()
	r.res.Problems = append(r.res.Problems, v.Examples...)
	// Rates are over the publishing window: publishes still in flight
	// at its end (retrying through a stuck recovery) are not time the
	// cluster was offered new work.
	window := min(elapsed-o.Warmup, o.Duration).Seconds()
	r.res.RecordsPerS = round(float64(len(measured)) / window)
	r.res.MBPerS = round(float64(len(measured)) * float64(o.Size) / 1e6 / window)
	lat := Summarize(Latencies(measured))
	r.res.ConfirmP50Ms, r.res.ConfirmP99Ms, r.res.ConfirmMaxMs = round(lat.P50), round(lat.P99), round(lat.Max)
	r.res.MaxGapMs = round(ms(MaxGap(measured)))
	if len(r.names) > 1 && r.res.RecordsPerS > 0 {
		r.res.StreamIntervalMs = round(float64(len(r.names)) / r.res.RecordsPerS * 1000)
	}
	r.res.BrokerPeakRSSMB = round(float64(r.peakRSS.Load()) / 1024)
	r.res.BrokerPeakAnonMB = round(float64(r.peakAnon.Load()) / 1024)

	var marks []Mark
	if o.KillAt > 0 {
		r.mu.Lock()
		killAt, newAt, epochs, phaseStream := r.killAt, r.newAt, r.killEpochs, r.phaseStream
		r.res.NewOwner = r.newOwner
		r.mu.Unlock()
		r.res.KillAtS, r.res.KillSignal = round(killAt.Seconds()), o.KillSignal
		r.res.ProbeWorkers, r.res.Probes, r.res.ProbesFailed = o.ProbeWorkers, int(r.probesSent.Load()), int(r.probesFailed.Load())
		// unavailable_ms is over the streams that failed over: with many
		// streams the others served on through the kill.
		u, uok := Unavailable(onStreams(all, epochs, len(r.names)), killAt)
		if uok {
			r.res.UnavailableMs = round(ms(u))
		} else {
			// Nothing was confirmed after the kill: the stream never
			// served again, which is the failure this bench looks for.
			r.res.UnavailableMs = -1
			r.res.OK = false
			r.res.Problems = append(r.res.Problems, "no publish was confirmed after the kill: the stream did not serve again within the run")
		}
		r.serving(all, killAt, epochs, uok)
		pu, puok := u, uok
		if len(r.names) > 1 {
			pu, puok = Unavailable(onStreams(all, map[int]uint64{phaseStream: 0}, len(r.names)), killAt)
		}
		r.phases(killAt, pu, puok)
		marks = append(marks, Mark{At: killAt, Label: "SIG" + strings.TrimPrefix(o.KillSignal, "SIG") + " " + r.res.OldOwner, Color: "#c0392b"})
		if newAt > 0 {
			r.res.NewAssignmentMs = round(ms(newAt - killAt))
			marks = append(marks, Mark{At: newAt, Label: "new owner " + r.res.NewOwner, Color: "#27ae60"})
		}
	} else {
		r.res.NewOwner = r.res.OldOwner
	}
	if o.HandoverAt > 0 {
		r.mu.Lock()
		from, to := r.handoverFrom, r.handoverTo
		r.mu.Unlock()
		r.res.HandoverAtS = round(o.HandoverAt.Seconds())
		if to > 0 {
			if u, ok := HandoverUnavailable(onStreams(all, map[int]uint64{0: 0}, len(r.names)), from, to); ok {
				v := round(ms(u))
				r.res.HandoverUnavailableMs = &v
			} else {
				r.res.OK = false
				r.res.Problems = append(r.res.Problems, "no publish was confirmed after the handover began")
			}
			marks = append(marks, Mark{At: from, Label: "handover " + r.res.HandoverFrom + " to " + r.res.HandoverTo, Color: "#2980b9"})
		} else {
			// Asked for and not made: there is no figure, and the run
			// must not read as one that measured it.
			r.res.OK = false
		}
	}
	if o.Warmup > 0 {
		marks = append(marks, Mark{At: o.Warmup, Label: "warm-up ends", Color: "#7f8c8d"})
	}
	if o.Plot != "" {
		if err := r.plot(all, elapsed, marks); err != nil {
			return fmt.Errorf("bench: plot: %w", err)
		}
	}
	return nil
}

// onStreams is the confirms of the streams in set (by stream index); all of
// them when set holds every one of the n streams.
func onStreams(confirms []Confirm, set map[int]uint64, n int) []Confirm {
	if len(set) == n {
		return confirms
	}
	out := make([]Confirm, 0, len(confirms)*len(set)/max(n, 1))
	for _, c := range confirms {
		if _, ok := set[int(c.Stream)]; ok {
			out = append(out, c)
		}
	}
	return out
}

// serving reports how long the streams the killed broker owned took to
// serve again.
func (r *runner) serving(all []Confirm, killAt time.Duration, epochs map[int]uint64, servedAny bool) {
	n := len(epochs)
	r.res.StreamsFailedOver = &n
	want := make([]int, 0, n)
	for i := range epochs {
		want = append(want, i)
	}
	served := ServedAgain(all, killAt, epochs)
	s := SummarizeServing(served, want)
	if r.o.ProbeWorkers > 0 {
		r.res.StreamsServedByProbe = &s.ByProbe
	}
	allMs, p50Ms := -1.0, -1.0
	if s.AllOK {
		allMs = round(ms(s.All))
	}
	if s.P50OK {
		p50Ms = round(ms(s.P50))
	}
	r.res.AllServingMs, r.res.ServingP50Ms = &allMs, &p50Ms
	r.mu.Lock()
	sw := r.streamsWatch
	r.mu.Unlock()
	if sw != nil {
		recorded, assigned, err := sw.Seen(r.start)
		if err != nil {
			r.res.PhaseNotes = append(r.res.PhaseNotes, "etcd watch of the streams broken: "+err.Error())
		}
		m := SummarizeMassFailover(killAt, recorded, assigned, served, want)
		r.res.AllRecoveryRecordedMs, r.res.RecoveryRecordedP50Ms = msOrNone(m.Recorded.All, m.Recorded.AllOK), msOrNone(m.Recorded.P50, m.Recorded.P50OK)
		r.res.AllAssignedMs, r.res.AssignedP50Ms = msOrNone(m.Assigned.All, m.Assigned.AllOK), msOrNone(m.Assigned.P50, m.Assigned.P50OK)
		r.res.ServeAfterAssignedP50Ms, r.res.ServeAfterAssignedMaxMs = msOrNone(m.ServeAfter.P50, m.ServeAfter.P50OK), msOrNone(m.ServeAfter.All, m.ServeAfter.AllOK)
		fmt.Fprintf(r.o.Stderr, "bench: the %d streams' failover: recovery recorded for all %s (p50 %s), new assignment for all %s (p50 %s), serving after it p50 %s max %s; all serving %s\n",
			n, msText(r.res.AllRecoveryRecordedMs), msText(r.res.RecoveryRecordedP50Ms), msText(r.res.AllAssignedMs), msText(r.res.AssignedP50Ms),
			msText(r.res.ServeAfterAssignedP50Ms), msText(r.res.ServeAfterAssignedMaxMs), msText(&allMs))
	}
	if s.Missing > 0 {
		r.res.StreamsNotServing = s.Missing
		r.res.OK = false
	}
	if s.Missing > 0 && servedAny {
		// (When none served again, the unavailable_ms problem says so.)
		r.res.Problems = append(r.res.Problems, fmt.Sprintf("%d of the %d streams the killed broker owned confirmed no publish after the kill (probes sent %d, failed %d)",
			s.Missing, n, r.probesSent.Load(), r.probesFailed.Load()))
	}
}

// phases splits the failover into phases from the watch's events and the
// service logs, and prints them.
func (r *runner) phases(killAt, unavailable time.Duration, unavailableOK bool) {
	if r.cl == nil {
		return
	}
	r.mu.Lock()
	in := FailoverInput{Start: r.start, Kill: killAt, Stream: r.names[max(r.phaseStream, 0)], OldOwner: r.owner, OldEpoch: r.oldEpoch,
		Unavailable: unavailable, UnavailableOK: unavailableOK}
	w := r.watch
	r.mu.Unlock()
	if w != nil {
		events, err := w.Events(r.start)
		in.Events, in.Watched = events, true
		if err != nil {
			r.res.PhaseNotes = append(r.res.PhaseNotes, "etcd watch broken: "+err.Error())
		}
	}
	logs, notes := readPhaseLogs(r.cl)
	in.Logs = logs
	r.res.PhaseNotes = append(r.res.PhaseNotes, notes...)
	f := FindFailover(in)
	p := f.Phases()
	r.res.DetectMs, r.res.SealMs, r.res.CommitMs, r.res.ApplyMs, r.res.FirstConfirmMs = &p.DetectMs, &p.SealMs, &p.CommitMs, &p.ApplyMs, &p.FirstConfirmMs
	r.res.RecoveryReason = f.Reason
	r.res.PhaseNotes = append(r.res.PhaseNotes, p.Notes...)
	to := f.NewOwner
	if to == "" {
		to = "?"
	}
	fmt.Fprintf(r.o.Stderr, "bench: failover of %s to %s (epoch %d): %s; unavailable %.1f ms\n",
		in.OldOwner, to, f.NewEpoch, p, r.res.UnavailableMs)
	for _, n := range r.res.PhaseNotes {
		fmt.Fprintf(r.o.Stderr, "bench: phases: %s\n", n)
	}
}

// msOrNone is d in ms, or -1 when not ok.
func msOrNone(d time.Duration, ok bool) *float64 {
	v := -1.0
	if ok {
		v = round(ms(d))
	}
	return &v
}

func msText(v *float64) string { return strconv.FormatFloat(*v, 'f', 1, 64) + " ms" }

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// createStreams creates the streams, CreateWorkers at a time, and waits
// until each has an owner that answers Locate; it returns the length of
// their histories then, summed, for the recoveries count.
func (r *runner) createStreams(ctx context.Context) (int, error) {
	o := r.o
	t0 := time.Now()
	var created, serving atomic.Int64
	stop := r.countProgress(ctx, "created", &created)
	workers := cmp.Or(o.CreateWorkers, DefaultCreateWorkers)
	r.res.CreateWorkers = workers
	defer func() { r.res.CreateBusyRetries = r.busyRetries.Load() }()
	err := forEach(ctx, len(r.names), workers, func(ctx context.Context, i int) error {
		req := &strandv1.CreateStreamRequest{Name: r.names[i], Copies: uint32(o.Copies), Policy: &strandv1.ConfirmPolicy{Name: o.Policy, Nodes: uint32(o.Nodes)}}
		// One --timeout for the create and its retries, the busy ones
		// among them (waitRetryInfo counts those in ctx).
		ctx, cancel := r.withTimeout(withBusyCount(ctx))
		defer cancel()
		if _, err := r.c.Admin().CreateStream(ctx, connect.NewRequest(req)); err != nil {
			if connect.CodeOf(err) == connect.CodeAlreadyExists {
				return fmt.Errorf("bench: stream %q exists; the bench needs fresh streams (pick another --stream): %w", r.names[i], err)
			}
			return fmt.Errorf("bench: create stream %q: %w", r.names[i], err)
		}
		created.Add(1)
		return nil
	})
	stop()
	if err != nil {
		return 0, err
	}
	r.res.CreateMs = round(ms(time.Since(t0)))
	stop = r.countProgress(ctx, "serving", &serving)
	// Locate asks the brokers, not the controller: as many at once as the
	// creates.
	err = forEach(ctx, len(r.names), workers, func(ctx context.Context, i int) error {
		err := r.waitServing(ctx, r.names[i])
		serving.Add(1)
		return err
	})
	stop()
	if err != nil {
		return 0, err
	}
	r.res.ReadyMs = round(ms(time.Since(t0)))
	before, err := r.getStreams(ctx)
	if err != nil {
		return 0, fmt.Errorf("bench: get streams: %w", err)
	}
	if len(r.names) > 1 {
		fmt.Fprintf(o.Stderr, "bench: %d streams created in %.0f ms, all serving after %.0f ms\n", len(r.names), r.res.CreateMs, r.res.ReadyMs)
	}
	r.owner = before[0].GetAssignment().GetOwner()
	r.res.OldOwner = r.owner
	r.membersBefore = members(before)
	history := 0
	for _, b := range before {
		history += len(b.GetHistory())
	}
	return history, nil
}

// countProgress prints how many of the streams are done every 5 s, with
// many streams (a thousand take minutes on a small machine), until stop.
func (r *runner) countProgress(ctx context.Context, what string, done *atomic.Int64) (stop func()) {
	if len(r.names) == 1 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fmt.Fprintf(r.o.Stderr, "bench: %d of %d streams %s\n", done.Load(), len(r.names), what)
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// idle watches the cluster for the idle window, the streams created and
// nothing published: the cluster's cost at rest.
func (r *runner) idle(ctx context.Context) error {
	fmt.Fprintf(r.o.Stderr, "bench: idle for %v before publishing\n", r.o.IdleWindow)
	w := r.startUsage(ctx)
	t := time.NewTimer(r.o.IdleWindow)
	defer t.Stop()
	select {
	case <-ctx.Done():
		w.mem.stop()
		return ctx.Err()
	case <-t.C:
	}
	u := w.end(ctx, r, "")
	r.res.IdleWindowS = round(r.o.IdleWindow.Seconds())
	r.res.ControllerCPUPctIdle, r.res.RecovererCPUPctIdle, r.res.BrokerCPUPctIdle = u.cpu.Controller, u.cpu.Recoverer, u.cpu.Broker
	r.res.BrokerPeakHeapMBIdle, r.res.EtcdRevisionsPerSIdle = u.peakAnonMB, u.revisionsPS
	return nil
}

// getStreams reads every stream's state, in the order of r.names. Each
// admin call reads the whole cluster's state, so for many streams it asks
// for the list once and looks up only the streams the list left out (a
// list cut into pages, say).
func (r *runner) getStreams(ctx context.Context) ([]*strandv1.GetStreamResponse, error) {
	out := make([]*strandv1.GetStreamResponse, len(r.names))
	if len(r.names) > 1 {
		list, err := r.c.Admin().ListStreams(ctx, connect.NewRequest(&strandv1.ListStreamsRequest{}))
		if err != nil {
			return nil, fmt.Errorf("list streams: %w", err)
		}
		for _, st := range list.Msg.GetStreams() {
			if i, ok := r.index[st.GetSpec().GetName()]; ok {
				out[i] = st
			}
		}
	}
	var missing []int
	for i, st := range out {
		if st == nil {
			missing = append(missing, i)
		}
	}
	err := forEach(ctx, len(missing), streamWorkers, func(ctx context.Context, j int) error {
		name := r.names[missing[j]]
		res, err := r.c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: name}))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		out[missing[j]] = res.Msg
		return nil
	})
	return out, err
}

// waitServing waits until the stream has an owner that answers Locate (a
// broker that holds the stream's assignment names it).
func (r *runner) waitServing(ctx context.Context, stream string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		loc, err := r.c.Locate(ctx, stream)
		if err == nil && loc.GetOwner().GetAddress() != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: stream %q has no serving owner: %w", stream, ctx.Err())
		case <-tick.C:
		}
	}
}

// owners reads the streams' assignments from etcd: each stream's owner and
// epoch, by stream index.
func (r *runner) owners(ctx context.Context) (map[string]string, map[int]uint64, error) {
	schema := cluster.NewSchema(r.cl.Info().Prefix)
	res, err := r.etcd.Get(ctx, schema.AssignmentsDir(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	owners, epochs := map[string]string{}, map[int]uint64{}
	for _, kv := range res.Kvs {
		name, err := cluster.NameIn(schema.AssignmentsDir(), string(kv.Key))
		if err != nil {
			continue
		}
		i, ours := r.index[name]
		if !ours {
			continue
		}
		a, err := cluster.Decode[cluster.Assignment](kv.Value)
		if err != nil {
			return nil, nil, fmt.Errorf("assignment of %s: %w", name, err)
		}
		owners[name], epochs[i] = a.Owner, a.Epoch
	}
	return owners, epochs, nil
}

// handover hands the first stream over, at HandoverAt, to its first
// follower (a failover to it), and records when the call began and ended.
func (r *runner) handover(ctx context.Context) error {
	t := time.NewTimer(time.Until(r.start.Add(r.o.HandoverAt)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-t.C:
	}
	stream := r.names[0]
	got, err := r.c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: stream}))
	if err != nil {
		return fmt.Errorf("bench: handover: get %s: %w", stream, err)
	}
	a := got.Msg.GetAssignment()
	if len(a.GetFollowers()) == 0 {
		return fmt.Errorf("bench: handover: %s has no follower", stream)
	}
	to := a.GetFollowers()[0]
	// A refused handover writes nothing (docs/protocol.md, "Handover",
	// step 1), so a refusal is asked again for a while: under load the
	// target can read as lagging by the tails its last heartbeat
	// published. The stretch measured is the accepted call's.
	var (
		from, end time.Duration
		resp      *connect.Response[strandv1.FailoverResponse]
		attempts  int
	)
	deadline := time.Now().Add(handoverRetryFor)
	for {
		attempts++
		from = r.since()
		resp, err = r.c.Admin().Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: to, Who: "strandctl bench", Why: "--handover-at-secs"}))
		end = r.since()
		if err == nil {
			break
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || time.Now().After(deadline) {
			r.mu.Lock()
			r.res.HandoverAttempts = attempts
			r.mu.Unlock()
			return fmt.Errorf("bench: handover of %s to %s (%d attempts): %w", stream, to, attempts, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(handoverRetryEvery):
		}
	}
	r.mu.Lock()
	r.res.HandoverAttempts = attempts
	r.handoverFrom, r.handoverTo = from, end
	r.res.HandoverFrom, r.res.HandoverTo = a.GetOwner(), resp.Msg.GetAssignment().GetOwner()
	if o := resp.Msg.GetAssignment().GetOwner(); o != "" {
		r.owner = o
	}
	r.mu.Unlock()
	fmt.Fprintf(r.o.Stderr, "bench: %.2fs handed %s over from %s to %s (asked %s) in %.1f ms\n",
		from.Seconds(), stream, a.GetOwner(), dashIfEmpty(resp.Msg.GetAssignment().GetOwner()), to, ms(end-from))
	return nil
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// How long and how often the bench asks again for a handover refused with
// FailedPrecondition.
const (
	handoverRetryFor   = 5 * time.Second
	handoverRetryEvery = 100 * time.Millisecond
)

// kill kills, at KillAt, the broker that owns the most of the streams,
// starts the probes of the streams it owned (on runCtx: they outlast the
// publishing, until end plus --timeout), and watches for the new
// assignment of the first of them (the phase stream).
func (r *runner) kill(ctx, runCtx context.Context, end time.Duration) error {
	sig, _ := ParseSignal(r.o.KillSignal)
	t := time.NewTimer(time.Until(r.start.Add(r.o.KillAt)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-t.C:
	}
	owners, epochs, err := r.owners(ctx)
	if err != nil {
		return fmt.Errorf("bench: find the owner to kill: %w", err)
	}
	owner, streams := MostStreamsOwner(owners)
	if owner == "" {
		return fmt.Errorf("bench: find the owner to kill: none of the %d streams has an owner", len(r.names))
	}
	owned := make(map[int]uint64, len(streams))
	for _, s := range streams {
		owned[r.index[s]] = epochs[r.index[s]]
	}
	phase := r.index[streams[0]]
	// The watch starts from the current revision before the signal, so
	// the recovery and the new assignment cannot be missed.
	schema := cluster.NewSchema(r.cl.Info().Prefix)
	w, err := watchKeys(ctx, r.etcd, schema, streams[0])
	r.mu.Lock()
	if err != nil {
		r.res.PhaseNotes = append(r.res.PhaseNotes, err.Error())
	} else {
		r.watch = w
	}
	r.mu.Unlock()
	// On runCtx: the probes wait on it for the assignments, and the
	// streams' failover may outlast the publishing (bg ends with it).
	sw, err := watchStreams(runCtx, r.etcd, schema, r.index, owned)
	r.mu.Lock()
	if err != nil {
		r.res.PhaseNotes = append(r.res.PhaseNotes, err.Error())
	} else {
		r.streamsWatch = sw
	}
	r.mu.Unlock()
	r.samplePeakRSS()
	if err := r.cl.Kill(owner, sig); err != nil {
		return fmt.Errorf("bench: kill %s: %w", owner, err)
	}
	at := r.since()
	r.mu.Lock()
	r.owner, r.oldEpoch, r.killAt = owner, owned[phase], at
	r.killed, r.killEpochs, r.phaseStream = owner, owned, phase
	r.mu.Unlock()
	r.res.OldOwner = owner
	if len(r.names) > 1 {
		r.res.PhaseStream = streams[0]
	}
	fmt.Fprintf(r.o.Stderr, "bench: %.2fs sent SIG%s to %s (pid %d), the owner of %d of the %d streams\n",
		at.Seconds(), r.o.KillSignal, owner, r.cl.PID(owner), len(streams), len(r.names))
	if r.o.ProbeWorkers > 0 {
		probed := make([]int, len(streams))
		for j, s := range streams {
			probed[j] = r.index[s]
		}
		r.probeWG.Go(func() { r.probe(runCtx, probed, end+r.timeout()) })
	}
	r.waitNewAssignment(ctx)
	return nil
}

// probe publishes one probe record to each of the streams (indices), at
// most ProbeWorkers at once, each with the client's Publish and its
// retries under --timeout, so that every stream the killed broker owned is
// asked to serve again within the run however long the load takes to come
// round to it (stream_interval_ms). A stream is probed once the etcd watch
// saw its new assignment committed (streamsWatch; all at once without the
// watch): a probe sent before would hold its worker, retrying, while the
// recovery of that stream runs, and the probes of streams that already
// have a new owner would queue behind it. A commit comes before the new
// owner serves, so the gate does not delay a probe past the stream's
// serving, but for the watch's delivery. A probe still unsent at until
// (since the start of publishing) is not sent. The confirms are kept with
// the load's (ServedAgain takes whichever came first) and verified with
// them.
func (r *runner) probe(ctx context.Context, streams []int, until time.Duration) {
	ctx, cancel := context.WithDeadline(ctx, r.start.Add(until))
	defer cancel()
	r.mu.Lock()
	sw := r.streamsWatch
	r.mu.Unlock()
	feed := make(chan int)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(feed)
		waiting := slices.Clone(streams)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for len(waiting) > 0 {
			var ready []int
			if sw == nil {
				ready, waiting = waiting, nil
			} else {
				ready, waiting = sw.splitAssigned(waiting)
			}
			for _, i := range ready {
				select {
				case feed <- i:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	})
	// No more workers than streams to probe: a 1,000-stream run needs a
	// few hundred, not the default's thousands of idle goroutines.
	for range min(r.o.ProbeWorkers, len(streams)) {
		wg.Go(func() {
			for stream := range feed {
				r.probeOne(ctx, stream)
			}
		})
	}
	wg.Wait()
}

// probeOne publishes the probe of one stream and keeps its confirm.
func (r *runner) probeOne(ctx context.Context, stream int) {
	id := r.nextID.Add(1)
	ctx, cancel := r.withTimeout(ctx)
	defer cancel()
	r.probesSent.Add(1)
	sent := r.since()
	res, err := r.c.Publish(ctx, r.names[stream], []*strandv1.Record{{Payload: RecordPayload(id, r.o.Size)}})
	done := r.since()
	if err != nil {
		// The outcome is unknown: a probe stored all the same is an
		// unconfirmed record, as for a failed load publish.
		r.probesFailed.Add(1)
		return
	}
	c := Confirm{ID: id, Offset: res.GetOffsets()[0], Epoch: res.GetEpoch(), Stream: uint32(stream), Sent: sent, Done: done,
		Duplicate: len(res.GetDuplicate()) > 0 && res.GetDuplicate()[0], Probe: true}
	r.probeMu.Lock()
	r.probes = append(r.probes, c)
	r.probeMu.Unlock()
}

// timeout is --timeout, or the client's retry budget when it is 0.
func (r *runner) timeout() time.Duration {
	return cmp.Or(r.o.Timeout, client.DefaultRetryBudget)
}

// withTimeout bounds one create or probe by timeout.
func (r *runner) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout())
}

// waitNewAssignment polls the phase stream's assignment until its owner is
// not the killed one, recording when that was first seen. It reads the
// assignment's key from etcd (kills run on the bench's own cluster): an
// admin call reads the whole cluster's state on the controller, which
// every 20 ms with thousands of streams is load the failover it measures
// would share.
func (r *runner) waitNewAssignment(ctx context.Context) {
	schema := cluster.NewSchema(r.cl.Info().Prefix)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		done, old, phase := r.newAt > 0, r.owner, r.phaseStream
		r.mu.Unlock()
		if done || phase < 0 {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		res, err := r.etcd.Get(cctx, schema.AssignmentKey(r.names[phase]))
		cancel()
		if err == nil && len(res.Kvs) == 1 {
			a, err := cluster.Decode[cluster.Assignment](res.Kvs[0].Value)
			if o := a.Owner; err == nil && o != "" && o != old {
				at := r.since()
				r.mu.Lock()
				if r.newAt == 0 {
					r.newAt, r.newOwner = at, o
					fmt.Fprintf(r.o.Stderr, "bench: %.2fs new assignment: epoch %d, owner %s\n", at.Seconds(), a.Epoch, o)
				}
				r.mu.Unlock()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// restartOldOwner brings the killed broker back (SIGCONT for STOP) and waits
// until every stream it owned lists it as a live follower.
func (r *runner) restartOldOwner(ctx context.Context) error {
	node := r.res.OldOwner
	switch {
	case r.o.RestartAfter > 0:
		// Started again mid-run (restartMidRun).
	case r.o.KillSignal == "STOP" || r.o.KillSignal == "SIGSTOP":
		if err := r.cl.Kill(node, syscall.SIGCONT); err != nil {
			return err
		}
	default:
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := r.cl.Wait(wctx, node)
		cancel()
		if err != nil {
			return fmt.Errorf("%s did not exit: %w", node, err)
		}
		if err := r.cl.Restart(ctx, node); err != nil {
			return err
		}
	}
	r.mu.Lock()
	waiting := make(map[int]bool, len(r.killEpochs))
	for i := range r.killEpochs {
		waiting[i] = true
	}
	r.mu.Unlock()
	fmt.Fprintf(r.o.Stderr, "bench: %s is back (pid %d); waiting for it to rejoin as a follower of %d streams\n", node, r.cl.PID(node), len(waiting))
	// A minute, and more for many streams: each rejoin is a catch-up
	// from the new owner.
	limit := time.Minute + time.Duration(len(waiting))*100*time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// Every look-up reads the whole cluster's state on the controller:
	// with many streams, once a second.
	every := 100 * time.Millisecond
	if len(r.names) > 1 {
		every = time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if states, err := r.getStreams(ctx); err == nil {
			for i := range waiting {
				if rejoined(states[i], node) {
					delete(waiting, i)
				}
			}
		}
		if len(r.names) > 1 {
			r.res.RejoinedStreams = len(r.killEpochs) - len(waiting)
		}
		if len(waiting) == 0 {
			r.res.RejoinedAsFollower = true
			fmt.Fprintf(r.o.Stderr, "bench: %s rejoined as a follower of every stream it owned\n", node)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not rejoin as a follower of %d streams within %v", node, len(waiting), limit)
		case <-tick.C:
		}
	}
}

// rejoined reports whether node is a live follower of the stream.
func rejoined(st *strandv1.GetStreamResponse, node string) bool {
	if !slices.Contains(st.GetAssignment().GetFollowers(), node) {
		return false
	}
	for _, cp := range st.GetCopies() {
		if cp.GetNode() == node && cp.GetLive() && cp.GetRole() == "follower" {
			return true
		}
	}
	return false
}

// readAll reads every stream from offset 0 to its end.
func (r *runner) readAll(ctx context.Context) ([]Stored, error) {
	per := make([][]Stored, len(r.names))
	err := forEach(ctx, len(r.names), streamWorkers, func(ctx context.Context, i int) error {
		next, failed := uint64(0), 0
		for {
			res, err := r.c.Read(ctx, &strandv1.ReadRequest{Stream: r.names[i], FromOffset: next})
			if err != nil {
				if failed < readBackRetries && readBackRetryable(ctx, err) {
					failed++
					if !waitReadBack(ctx, failed) {
						return fmt.Errorf("%s: %w", r.names[i], err)
					}
					continue
				}
				return fmt.Errorf("%s: %w", r.names[i], err)
			}
			if len(res.GetRecords()) == 0 {
				return nil
			}
			for _, rec := range res.GetRecords() {
				id, ok := ParseID(rec.GetPayload())
				per[i] = append(per[i], Stored{Offset: rec.GetOffset(), ID: id, Stream: uint32(i), HasID: ok})
				next = rec.GetOffset() + 1
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return slices.Concat(per...), nil
}

// A read-back must end in a verdict on the records, not on a moment of the
// cluster: on an overloaded machine leases lapse and owners keep moving
// after the publishing ends, and one Read (the client's retries within
// --timeout) can run out while a recovery is still under way. A stream's
// read-back is asked again after such a failure, from where it got to, up
// to readBackRetries times, waiting a second more each time; each Read
// keeps its own deadline, so a stream's read-back is bounded.
const readBackRetries = 10

// readBackRetryable says whether a failed read-back Read is worth asking
// again: the cluster was busy or moving (Unavailable, FailedPrecondition
// while an owner changes, Aborted, ResourceExhausted) or the Read ran out
// of time, and the bench itself is not stopping.
func readBackRetryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeFailedPrecondition, connect.CodeAborted, connect.CodeResourceExhausted:
		return true
	}
	return false
}

// waitReadBack waits attempt seconds before a read-back is asked again;
// false when ctx ended first.
func waitReadBack(ctx context.Context, attempt int) bool {
	t := time.NewTimer(time.Duration(attempt) * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// progress prints a line per second.
func (r *runner) progress(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := int64(0)
	warming := r.o.Warmup > 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		phase := ""
		if warming {
			phase = " (warm-up)"
			if r.since() >= r.o.Warmup {
				phase, warming = " (warm-up done: measuring)", false
			}
		}
		r.samplePeakRSS()
		n := r.confirmed.Load()
		r.mu.Lock()
		owner := r.owner
		if r.newOwner != "" {
			owner = r.newOwner
		}
		r.mu.Unlock()
		fmt.Fprintf(r.o.Stderr, "bench: %5.1fs confirmed %d (%d/s) failed %d owner %s%s\n", r.since().Seconds(), n, n-last, r.failed.Load(), owner, phase)
		last = n
	}
}

// samplePeakRSS records the largest VmHWM over the broker processes.
func (r *runner) samplePeakRSS() {
	if r.cl == nil {
		return
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return
	}
	for _, b := range r.cl.Info().Brokers {
		if hwm, anon, ok := procMemoryKB(fs, b.PID); ok {
			storeMax(&r.peakRSS, hwm)
			storeMax(&r.peakAnon, anon)
		}
	}
}

// brokerCPU is the CPU time all brokers of the bench's own cluster have
// used so far; ok is false when there is no such cluster or a broker's
// /proc/PID/stat cannot be read.
func (r *runner) brokerCPU() (total time.Duration, ok bool) {
	s, ok := r.sampleCPU()
	if !ok {
		return 0, false
	}
	for _, b := range r.brokerNodes() {
		p, ok := s.procs[b]
		if !ok {
			return 0, false
		}
		total += p.cpu
	}
	return total, true
}

// clusterCPU is the CPU time every process of the bench's own cluster
// (sampleCPU) and the bench itself (its client and embedded etcd) have
// used so far; ok is false as for brokerCPU, or when one of them cannot
// be read.
func (r *runner) clusterCPU() (total time.Duration, ok bool) {
	s, ok := r.sampleCPU()
	if !ok || len(s.procs) != len(r.processes()) {
		return 0, false
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, false
	}
	self, ok := procCPU(fs, os.Getpid())
	if !ok {
		return 0, false
	}
	for _, p := range s.procs {
		total += p.cpu
	}
	return total + self, true
}

// brokerHistograms reads every broker's /metrics histograms, by node; nil
// when there is no cluster of the bench's own or a broker cannot be read
// (the result then has no stages).
func (r *runner) brokerHistograms(ctx context.Context) map[string]brokerHistograms {
	if r.cl == nil {
		return nil
	}
	// A broker's /metrics that stalls must not hold the bench (this runs
	// at the end of a warm-up too, under load): no figures then.
	hc, baseURL := r.metricsClient()
	out := map[string]brokerHistograms{}
	for _, b := range r.cl.Info().Brokers {
		h, err := scrapeHistograms(ctx, hc, baseURL(b.Address))
		if err != nil {
			return nil
		}
		out[b.Node] = h
	}
	return out
}

// procCPU is a process's user and system CPU time, from its /proc/PID/stat
// (procfs: the command name may hold spaces and parentheses).
func procCPU(fs procfs.FS, pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, false
	}
	st, err := p.Stat()
	if err != nil {
		return 0, false
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), true
}

func storeMax(v *atomic.Int64, kb int64) {
	for {
		cur := v.Load()
		if kb <= cur || v.CompareAndSwap(cur, kb) {
			return
		}
	}
}

// procMemoryKB reads a process's peak resident set size (VmHWM) and its
// resident anonymous memory now (RssAnon), in KiB, from /proc/PID/status.
func procMemoryKB(fs procfs.FS, pid int) (hwm, anon int64, ok bool) {
	if pid <= 0 {
		return 0, 0, false
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, 0, false
	}
	st, err := p.NewStatus()
	if err != nil || st.VmHWM == 0 {
		return 0, 0, false
	}
	return int64(st.VmHWM >> 10), int64(st.RssAnon >> 10), true
}

func (r *runner) plot(all []Confirm, elapsed time.Duration, marks []Mark) error {
	f, err := os.Create(r.o.Plot)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("strand bench: %s, %d copies, %s, %d B, window %d", r.o.Stream, r.o.Copies, policyName(r.o.Config), r.o.Size, r.o.Inflight)
	if err := WriteSVG(f, title, Buckets(all, PlotWidth, elapsed), PlotWidth, marks); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// ErrNotOK is returned when verification found lost, duplicated or moved
// confirmed records.
var ErrNotOK = errors.New("bench: verification failed")

// metricsClient is how the bench reads the brokers' /metrics: a client
// that gives up after 5 s (a stalled broker must not hold the bench) and
// the broker URL form, both over TLS when the bench's cluster is secure.
func (r *runner) metricsClient() (*http.Client, func(addr string) string) {
	if r.o.TLS == nil {
		return &http.Client{Timeout: 5 * time.Second}, rpcserver.BaseURL
	}
	hc := rpcserver.HTTPClientTLS(r.o.TLS)
	hc.Timeout = 5 * time.Second
	return hc, rpcserver.BaseURLTLS
}
