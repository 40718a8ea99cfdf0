package bench

import (
	"cmp"
	"context"
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

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/cluster"
)

// Options are the settings plus where the bench runs.
type Options struct {
	Config
	// Controller and BrokerAddrs target a running cluster (Config.External).
	Controller  string
	BrokerAddrs []string
	// BinDir is where the service binaries are for the bench's own cluster.
	BinDir string
	// Stderr receives progress lines.
	Stderr io.Writer
}

// Result is the bench's JSON line.
type Result struct {
	Confirmed          int     `json:"confirmed"`
	Lost               int     `json:"lost"`
	Duplicates         int     `json:"duplicates"`
	OffsetMismatches   int     `json:"offset_mismatches"`
	RecordsPerS        float64 `json:"records_per_s"`
	MBPerS             float64 `json:"mb_per_s"`
	ConfirmP50Ms       float64 `json:"confirm_p50_ms"`
	ConfirmP99Ms       float64 `json:"confirm_p99_ms"`
	UnavailableMs      float64 `json:"unavailable_ms"`
	MaxGapMs           float64 `json:"max_gap_ms"`
	OldOwner           string  `json:"old_owner"`
	NewOwner           string  `json:"new_owner"`
	RejoinedAsFollower bool    `json:"rejoined_as_follower"`
	Recoveries         int     `json:"recoveries"`
	BrokerPeakRSSMB    float64 `json:"broker_peak_rss_mb"`
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
	// StageMeanMs is where a publish waited, as the mean milliseconds of
	// each stage over the publishing window, from the brokers' /metrics
	// (stages.go): on the owner publish_durable and publish_confirm (from
	// queued for the log), owner_commit_write and owner_commit_sync (one
	// committer batch), follow_ack (a batch sent to a follower until it is
	// acknowledged durable); on the followers follower_commit_write,
	// follower_commit_sync and follow_apply (a batch received until
	// durable). Runs without a kill on a cluster the bench started only.
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
	KillSignal        string   `json:"kill_signal,omitempty"`
	Stream            string   `json:"stream"`
	Copies            int      `json:"copies"`
	Policy            string   `json:"policy"`
	Size              int      `json:"size"`
	Inflight          int      `json:"inflight"`
	Publishers        string   `json:"publishers"`
	ProducerIDs       bool     `json:"producer_ids"`
	Problems          []string `json:"problems,omitempty"`
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
	r := &runner{o: o, res: &Result{Stream: o.Stream, Copies: o.Copies, Policy: policyName(o.Config), Size: o.Size, Inflight: o.Inflight, Publishers: cmp.Or(o.Publishers, PublishersAsync), ProducerIDs: !o.NoProducerIDs}}
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
		dopts := devcluster.Options{Dir: dir, Brokers: o.Brokers, PortBase: port, BinDir: o.BinDir, Log: o.Stderr}
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
		r.cl = cl
		info := cl.Info()
		o.Controller, o.BrokerAddrs = info.Controller, info.BrokerAddresses()
	}
	c, err := client.New(client.Config{Controller: o.Controller, Brokers: o.BrokerAddrs, Idempotent: client.Bool(!o.NoProducerIDs), Lanes: o.Lanes, Linger: o.Linger})
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

	start     time.Time
	confirmed atomic.Int64
	failed    atomic.Int64
	peakRSS   atomic.Int64 // kB
	peakAnon  atomic.Int64 // kB

	// watch records the recovery and assignment keys' changes (kill
	// runs on the bench's own cluster).
	watch *keyWatch

	mu       sync.Mutex
	owner    string
	oldEpoch uint64
	killAt   time.Duration
	newAt    time.Duration
	newOwner string
}

func (r *runner) since() time.Duration { return time.Since(r.start) }

func (r *runner) run(ctx context.Context) error {
	o := r.o
	admin := r.c.Admin()
	req := &strandv1.CreateStreamRequest{Name: o.Stream, Copies: uint32(o.Copies), Policy: &strandv1.ConfirmPolicy{Name: o.Policy, Nodes: uint32(o.Nodes)}}
	if _, err := admin.CreateStream(ctx, connect.NewRequest(req)); err != nil {
		if connect.CodeOf(err) == connect.CodeAlreadyExists {
			return fmt.Errorf("bench: stream %q exists; the bench needs a fresh stream (pick another --stream): %w", o.Stream, err)
		}
		return fmt.Errorf("bench: create stream: %w", err)
	}
	before, err := r.waitServing(ctx)
	if err != nil {
		return err
	}
	r.owner = before.GetAssignment().GetOwner()
	r.res.OldOwner = r.owner
	historyBefore := len(before.GetHistory())
	if o.KillAt > 0 && r.cl != nil {
		w, err := watchKeys(ctx, r.cl.Etcd(), cluster.NewSchema(r.cl.Info().Prefix), o.Stream)
		if err != nil {
			r.res.PhaseNotes = append(r.res.PhaseNotes, err.Error())
		} else {
			r.watch = w
			defer w.stop()
		}
	}

	// Publish, for the warm-up and then the measured duration. The CPU
	// and stage figures start with the measured part.
	end := o.Warmup + o.Duration
	var (
		cpuBefore    time.Duration
		cpuOK        bool
		stagesBefore map[string]brokerHistograms
	)
	measureFrom := func() {
		cpuBefore, cpuOK = r.brokerCPU()
		stagesBefore = r.brokerHistograms(ctx)
	}
	if o.Warmup <= 0 {
		measureFrom()
	}
	r.start = time.Now()
	var (
		wg     sync.WaitGroup
		next   atomic.Uint64
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
	record := func(w int, id uint64, sent, done time.Duration, res *strandv1.PublishResponse) {
		dup := len(res.GetDuplicate()) > 0 && res.GetDuplicate()[0]
		if dup {
			dedupe.Add(1)
		}
		confirms[w] = append(confirms[w], Confirm{ID: id, Offset: res.GetOffsets()[0], Sent: sent, Done: done, Duplicate: dup})
		r.confirmed.Add(1)
	}
	if r.res.Publishers == PublishersSync {
		confirms = make([][]Confirm, o.Inflight)
		for w := range o.Inflight {
			wg.Go(func() {
				for pubCtx.Err() == nil && r.since() < end {
					id := next.Add(1)
					sent := r.since()
					res, err := r.c.Publish(pubCtx, o.Stream, []*strandv1.Record{{Payload: RecordPayload(id, o.Size)}})
					if err != nil {
						r.failed.Add(1)
						continue
					}
					record(w, id, sent, r.since(), res)
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
				id := next.Add(1)
				sent := r.since()
				pending.Add(1)
				r.c.PublishAsync(pubCtx, o.Stream, []*strandv1.Record{{Payload: RecordPayload(id, o.Size)}}, func(res *strandv1.PublishResponse, err error) {
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
						record(w, id, sent, done, res)
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
	var killErr error
	if o.KillAt > 0 {
		bgWG.Go(func() { killErr = r.kill(bg) })
	}
	wg.Wait()
	elapsed := r.since()
	// Publishing outlasts the warm-up unless ctx ended it, which ends the
	// warm-up's wait too (bg is ctx's), and the scrape is bounded
	// (brokerHistograms): warmedUp closes either way. After ctx ended,
	// the figures are not reported (ctx.Err below).
	<-warmedUp
	cpuAfter, cpuAfterOK := r.brokerCPU()
	if stagesBefore != nil && o.KillAt <= 0 {
		if after := r.brokerHistograms(ctx); after != nil {
			r.res.StageMeanMs = stageMeans(r.owner, stagesBefore, after)
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
	if err := ctx.Err(); err != nil {
		return err
	}
	if killErr != nil {
		return killErr
	}

	all := slices.Concat(confirms...)
	slices.SortFunc(all, func(a, b Confirm) int { return cmp.Compare(a.ID, b.ID) })
	measured := Measured(all, o.Warmup)
	if cpuAfterOK && cpuOK && o.KillAt <= 0 && len(measured) > 0 {
		r.res.BrokerCPUUsPerRecord = round(float64(cpuAfter-cpuBefore) / float64(len(measured)) / 1000)
	}
	r.res.DurationS = round((elapsed - o.Warmup).Seconds())
	r.res.WarmupS = round(o.Warmup.Seconds())
	r.res.Failed = int(r.failed.Load())
	r.res.DedupeHits = int(dedupe.Load())

	// Bring the old owner back and wait for it to rejoin as a follower.
	if o.KillAt > 0 {
		if err := r.restartOldOwner(ctx); err != nil {
			fmt.Fprintf(o.Stderr, "bench: restarting %s: %v\n", r.res.OldOwner, err)
		}
	}
	after, err := r.c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: o.Stream}))
	if err != nil {
		return fmt.Errorf("bench: get stream after the run: %w", err)
	}
	r.res.Recoveries = len(after.Msg.GetHistory()) - historyBefore
	if o.KillAt > 0 {
		r.mu.Lock()
		if r.newOwner == "" {
			// The owner moved only after the run (a recovery that
			// waited for the killed broker to come back): no time to
			// report, but the owner it moved to.
			if owner := after.Msg.GetAssignment().GetOwner(); owner != r.owner {
				r.newOwner = owner
			}
		}
		r.mu.Unlock()
	}
	r.samplePeakRSS()

	// Read back and verify.
	stored, err := r.readAll(ctx)
	if err != nil {
		return fmt.Errorf("bench: read back: %w", err)
	}
	v := Verify(all, stored)
	r.res.Confirmed, r.res.Lost, r.res.Duplicates, r.res.OffsetMismatches = v.Confirmed, v.Lost, v.Duplicates, v.OffsetMismatches
	r.res.UnconfirmedStored, r.res.Stored, r.res.Problems, r.res.OK = v.UnconfirmedStored, len(stored), v.Examples, v.OK()
	// Rates are over the publishing window: publishes still in flight
	// at its end (retrying through a stuck recovery) are not time the
	// cluster was offered new work.
	window := min(elapsed-o.Warmup, o.Duration).Seconds()
	r.res.RecordsPerS = round(float64(len(measured)) / window)
	r.res.MBPerS = round(float64(len(measured)) * float64(o.Size) / 1e6 / window)
	lat := Summarize(Latencies(measured))
	r.res.ConfirmP50Ms, r.res.ConfirmP99Ms, r.res.ConfirmMaxMs = round(lat.P50), round(lat.P99), round(lat.Max)
	r.res.MaxGapMs = round(ms(MaxGap(measured)))
	r.res.BrokerPeakRSSMB = round(float64(r.peakRSS.Load()) / 1024)
	r.res.BrokerPeakAnonMB = round(float64(r.peakAnon.Load()) / 1024)

	var marks []Mark
	if o.KillAt > 0 {
		r.mu.Lock()
		killAt, newAt := r.killAt, r.newAt
		r.res.NewOwner = r.newOwner
		r.mu.Unlock()
		r.res.KillAtS, r.res.KillSignal = round(killAt.Seconds()), o.KillSignal
		u, uok := Unavailable(all, killAt)
		if uok {
			r.res.UnavailableMs = round(ms(u))
		} else {
			// Nothing was confirmed after the kill: the stream never
			// served again, which is the failure this bench looks for.
			r.res.UnavailableMs = -1
			r.res.OK = false
			r.res.Problems = append(r.res.Problems, "no publish was confirmed after the kill: the stream did not serve again within the run")
		}
		r.phases(killAt, u, uok)
		marks = append(marks, Mark{At: killAt, Label: "SIG" + strings.TrimPrefix(o.KillSignal, "SIG") + " " + r.res.OldOwner, Color: "#c0392b"})
		if newAt > 0 {
			r.res.NewAssignmentMs = round(ms(newAt - killAt))
			marks = append(marks, Mark{At: newAt, Label: "new owner " + r.res.NewOwner, Color: "#27ae60"})
		}
	} else {
		r.res.NewOwner = r.res.OldOwner
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

// phases splits the failover into phases from the watch's events and the
// service logs, and prints them.
func (r *runner) phases(killAt, unavailable time.Duration, unavailableOK bool) {
	if r.cl == nil {
		return
	}
	r.mu.Lock()
	in := FailoverInput{Start: r.start, Kill: killAt, Stream: r.o.Stream, OldOwner: r.owner, OldEpoch: r.oldEpoch,
		Unavailable: unavailable, UnavailableOK: unavailableOK}
	r.mu.Unlock()
	if r.watch != nil {
		events, err := r.watch.Events(r.start)
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

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// waitServing waits until the stream has an owner that answers Locate.
func (r *runner) waitServing(ctx context.Context) (*strandv1.GetStreamResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		loc, err := r.c.Locate(ctx, r.o.Stream)
		if err == nil && loc.GetOwner().GetAddress() != "" {
			res, err := r.c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: r.o.Stream}))
			if err == nil && res.Msg.GetAssignment().GetOwner() != "" {
				return res.Msg, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bench: stream %q has no serving owner: %w", r.o.Stream, ctx.Err())
		case <-tick.C:
		}
	}
}

// kill kills the owner at KillAt and watches for the new assignment.
func (r *runner) kill(ctx context.Context) error {
	sig, _ := ParseSignal(r.o.KillSignal)
	t := time.NewTimer(time.Until(r.start.Add(r.o.KillAt)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-t.C:
	}
	res, err := r.c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: r.o.Stream}))
	if err != nil {
		return fmt.Errorf("bench: find the owner to kill: %w", err)
	}
	owner, epoch := res.Msg.GetAssignment().GetOwner(), res.Msg.GetAssignment().GetEpoch()
	r.samplePeakRSS()
	if err := r.cl.Kill(owner, sig); err != nil {
		return fmt.Errorf("bench: kill %s: %w", owner, err)
	}
	at := r.since()
	r.mu.Lock()
	r.owner, r.oldEpoch, r.killAt = owner, epoch, at
	r.mu.Unlock()
	r.res.OldOwner = owner
	fmt.Fprintf(r.o.Stderr, "bench: %.2fs sent SIG%s to the owner %s (pid %d)\n", at.Seconds(), r.o.KillSignal, owner, r.cl.PID(owner))
	r.waitNewAssignment(ctx)
	return nil
}

// waitNewAssignment polls the assignment until its owner is not the killed
// one, recording when that was first seen.
func (r *runner) waitNewAssignment(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		done, old := r.newAt > 0, r.owner
		r.mu.Unlock()
		if done {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		res, err := r.c.Admin().GetStream(cctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: r.o.Stream}))
		cancel()
		if err == nil {
			if o := res.Msg.GetAssignment().GetOwner(); o != "" && o != old {
				at := r.since()
				r.mu.Lock()
				if r.newAt == 0 {
					r.newAt, r.newOwner = at, o
					fmt.Fprintf(r.o.Stderr, "bench: %.2fs new assignment: epoch %d, owner %s\n", at.Seconds(), res.Msg.GetAssignment().GetEpoch(), o)
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
// until the assignment lists it as a follower.
func (r *runner) restartOldOwner(ctx context.Context) error {
	node := r.res.OldOwner
	if r.o.KillSignal == "STOP" || r.o.KillSignal == "SIGSTOP" {
		if err := r.cl.Kill(node, syscall.SIGCONT); err != nil {
			return err
		}
	} else {
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
	fmt.Fprintf(r.o.Stderr, "bench: %s is back (pid %d); waiting for it to rejoin as a follower\n", node, r.cl.PID(node))
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		res, err := r.c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: r.o.Stream}))
		if err == nil && slices.Contains(res.Msg.GetAssignment().GetFollowers(), node) {
			for _, cp := range res.Msg.GetCopies() {
				if cp.GetNode() == node && cp.GetLive() && cp.GetRole() == "follower" {
					r.res.RejoinedAsFollower = true
					fmt.Fprintf(r.o.Stderr, "bench: %s rejoined as a follower at epoch %d\n", node, res.Msg.GetAssignment().GetEpoch())
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not rejoin as a follower within 60s", node)
		case <-tick.C:
		}
	}
}

// readAll reads the stream from offset 0 to its end.
func (r *runner) readAll(ctx context.Context) ([]Stored, error) {
	var out []Stored
	next := uint64(0)
	for {
		res, err := r.c.Read(ctx, &strandv1.ReadRequest{Stream: r.o.Stream, FromOffset: next})
		if err != nil {
			return nil, err
		}
		if len(res.GetRecords()) == 0 {
			return out, nil
		}
		for _, rec := range res.GetRecords() {
			id, ok := ParseID(rec.GetPayload())
			out = append(out, Stored{Offset: rec.GetOffset(), ID: id, HasID: ok})
			next = rec.GetOffset() + 1
		}
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
	if r.cl == nil {
		return 0, false
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, false
	}
	for _, b := range r.cl.Info().Brokers {
		cpu, ok := procCPU(fs, b.PID)
		if !ok {
			return 0, false
		}
		total += cpu
	}
	return total, true
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
	hc := &http.Client{Timeout: 5 * time.Second}
	out := map[string]brokerHistograms{}
	for _, b := range r.cl.Info().Brokers {
		h, err := scrapeHistograms(ctx, hc, b.Address)
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
