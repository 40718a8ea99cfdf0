// Package liveness is the controller leader's loop over the cluster: it
// notices a lost owner and records a pending recovery for a replicated stream
// (docs/protocol.md, "Stream failover"), and brings an under-replicated stream back to its
// copies by the fast path, preferring a copy left out of the assignment that
// is live again, so an old owner rejoins as a follower without another
// recovery. A member missing past --replace-after, or at once when its
// stream cannot confirm without it, is replaced (replace.go;
// docs/protocol.md, "Replacing a missing copy").
package liveness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/grpchealth"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// Prober checks whether a broker at addr serves; an error means it does not.
type Prober func(ctx context.Context, addr string) error

// HealthProber probes with a gRPC health check over Connect, dialled with
// d (h2c, or TLS with the controller's node certificate).
func HealthProber(d rpcserver.Dialer) Prober {
	hc := d.HTTPClient()
	return func(ctx context.Context, addr string) error {
		resp, err := grpchealth.NewClient(hc, d.BaseURL(addr)).Check(ctx, &grpchealth.CheckRequest{})
		if err != nil {
			return err
		}
		if resp.Status != grpchealth.StatusServing {
			return fmt.Errorf("liveness: broker at %s is %v", addr, resp.Status)
		}
		return nil
	}
}

// Config is what the loop needs.
type Config struct {
	// View is the controller's view of the cluster; the loop passes over
	// its snapshot whenever it changes.
	View   *state.View
	Schema cluster.Schema
	Log    zerolog.Logger
	// ProbeGrace bounds the probe of a suspected owner.
	ProbeGrace time.Duration
	// Probe defaults to HealthProber.
	Probe Prober
	// Resync passes again this often even without changes, over the
	// streams the last pass left something to do on (a failed probe, a
	// conflicting write, a copy still to place), so that is retried
	// (default 1s).
	Resync time.Duration
	// FullResync passes over every stream this often (default
	// 10 × Resync): the safety net under the incremental passes, which
	// look only at the streams whose keys changed and those still to be
	// acted on.
	FullResync time.Duration
	Now        func() time.Time
	// Pass, when set, is called with the snapshot of every pass before the
	// pass acts on it, and the streams that may have changed since the
	// snapshot of the pass before (all: every stream; state.Changes.Take):
	// what the controller remembers between snapshots and its metrics are
	// kept from it, at the pace of the loop, looking again only at what
	// changed.
	Pass func(s *state.Snapshot, changed []string, all bool)
	// ReplaceAfter is how long a member may be missing before it is
	// replaced (default transition.DefaultReplaceAfter); MissingSince says
	// since when each is (replace.go).
	ReplaceAfter time.Duration
	MissingSince MissingSince
}

// Run runs the loop while term leads; it returns when ctx ends.
//
// A pass is incremental: it looks at the streams whose keys changed since
// the last pass (state.Changes: the spec, assignment, recovery, history or
// refusals of the stream, a copy status of it in a heartbeat) and at those
// the last pass left something to do on (loop.watch), not at every
// stream, so a flood of stream creations costs a pass per change, not a
// walk of the cluster per change. A broker coming or going, or the view
// loading again, makes the next pass a full one, and so does FullResync,
// the safety net for a stream whose need no change of its own shows.
func Run(ctx context.Context, cfg Config, term *leader.Term) error {
	return newLoop(cfg, term).run(ctx)
}

// newLoop is the loop of Run, cfg with its defaults.
func newLoop(cfg Config, term *leader.Term) *loop {
	if cfg.Probe == nil {
		cfg.Probe = HealthProber(rpcserver.Dialer{})
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Second
	}
	if cfg.FullResync <= 0 {
		cfg.FullResync = 10 * cfg.Resync
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &loop{cfg: cfg, commit: transition.Committer{Term: term, Schema: cfg.Schema}}
	l.awaitFresh = func(ctx context.Context) { _, _ = cfg.View.Fresh(ctx) }
	return l
}

// run is Run's loop, once cfg has its defaults.
func (l *loop) run(ctx context.Context) error {
	cfg := l.cfg
	changes := cfg.View.Track()
	tick := time.NewTicker(cfg.Resync)
	defer tick.Stop()
	full := time.NewTicker(cfg.FullResync)
	defer full.Stop()
	fullNext := false
	for {
		// The pass reads the view, never etcd: a change of any size costs
		// a pass over the decoded snapshot, not a read and decoding of the
		// whole prefix. A stale snapshot is safe: every write the pass
		// makes compares the mod revisions it read, and one that lost the
		// race is made again from a newer snapshot at a later pass.
		snap, changed, status, all, next := changes.Take()
		if snap != nil && cfg.Pass != nil {
			cfg.Pass(snap, changed, all)
		}
		if snap != nil {
			if fullNext {
				all, fullNext = true, false
			}
			var streams []string
			if all {
				streams, l.watchedAt = slices.Sorted(maps.Keys(snap.Assignments)), time.Now()
			} else {
				// Only the streams with a change other than a copy's
				// progress: no judgement of the pass reads progress
				// (cluster.CopyTails.SameStatus), and under publish load
				// every stream progresses at every heartbeat interval,
				// which made each pass one over every stream.
				//
				// The streams under watch go with it once a Resync: what
				// they wait for that is not a key of theirs (time passing
				// for a missing member, a probe to try again) is judged
				// at that pace. With a broker gone every stream it holds
				// a copy of is under watch until it returns, and looked
				// at by every pass, each change-driven pass of a mass
				// failover was one over thousands of streams.
				// Paced by the wall clock, as the Resync ticker is, not
				// by cfg.Now, the clock of the judgements themselves.
				streams = status
				if now := time.Now(); now.Sub(l.watchedAt) >= cfg.Resync {
					streams, l.watchedAt = l.pending(status), now
				}
				if l.incremental != nil {
					streams = l.incremental(streams)
				}
			}
			if l.reconcile(ctx, snap, streams) && l.awaitView {
				// Wait for the view to hold the pass's own writes, and
				// pass again at once over what changed meanwhile: a pass
				// on a view without them would propose again what this
				// one wrote, which its compare refuses at the cost of a
				// transaction per stream. Recorded recoveries alone need
				// no wait (unseenRecovery skips them until the view holds
				// them): after a mass failover the view trails etcd by
				// the heartbeats of every copy that changed, and a wait
				// for it held the recording of the lost owner's other
				// streams back by up to a Resync while their suspicions
				// were already in the view's hands. The loop then waits
				// for the view's next change, as after a pass that wrote
				// nothing.
				wctx, cancel := context.WithTimeout(ctx, cfg.Resync)
				l.awaitFresh(wctx)
				cancel()
				if ctx.Err() != nil {
					return ctx.Err()
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-full.C:
			fullNext = true
		case <-next:
		}
	}
}

type loop struct {
	cfg    Config
	commit transition.Committer
	// load is the placement load of the pass's snapshot: it costs a walk
	// over every assignment, so it is taken once per pass, and only by a
	// pass that needs it (placementLoad), rather than per stream that
	// needs a broker placed.
	load    placement.Load
	loadFor *state.Snapshot
	// wrote is set when the pass committed a write; awaitView when one
	// of its writes is not a batched recovery record (recordedAt), so a
	// pass on a view without it would propose it again.
	wrote, awaitView bool
	// placeProbed holds what this pass's probes of brokers placement
	// picked found (true: failed), so each broker is probed once a pass
	// however many streams it is picked for: after a mass failover
	// hundreds of streams want a copy placed at once.
	placeProbed map[string]bool
	// watching holds the streams a pass left something to do on: a pass
	// looks at them again whether or not their keys changed (watch), the
	// first pass at least a Resync after watchedAt.
	watching map[string]struct{}
	// watchedAt is when a pass last looked at every stream under watch
	// (or at every stream).
	watchedAt time.Time
	// awaitFresh waits, until ctx ends, for the view to hold every write
	// made before the call (View.Fresh; tests stand in for it).
	awaitFresh func(ctx context.Context)
	// incremental, when set (tests), sees and may change the streams of
	// each incremental pass: a change the pass is not told of is how a
	// test shows the full pass finding what it missed.
	incremental func(streams []string) []string
	// recordedAt holds the streams whose pending recovery this loop
	// recorded, with the revision of the write, until a snapshot at or
	// past it (unseenRecovery). recordedMu guards it: the batches of a
	// pass are written concurrently.
	recordedMu sync.Mutex
	recordedAt map[string]int64
}

// unseenRecovery reports whether this loop recorded stream's pending
// recovery at a revision s is older than: s does not show the recovery
// yet, and a pass on it would propose the stream again. Its guarded write
// would fail its compare (docs/etcd-schema.md: a recovery is only recorded
// while none is pending), and, written in a batch, fail the whole batch,
// which is then written one stream at a time: after a mass failover a view
// lagging behind the controller's own writes turned the recording of a
// lost owner's streams into a transaction per stream. Skipping such a
// stream writes nothing, which is always safe; a snapshot at or past the
// write judges the stream afresh, whatever happened to the recovery since.
func (l *loop) unseenRecovery(s *state.Snapshot, stream string) bool {
	l.recordedMu.Lock()
	defer l.recordedMu.Unlock()
	rev, ok := l.recordedAt[stream]
	return ok && s.Rev < rev
}

// forgetSeen drops every recorded write s is at or past: s shows it, so
// no pass needs it any more. Done once per pass, not per stream, so an
// entry whose stream no pass looks at again (deleted meanwhile) does not
// stay for the life of the term.
func (l *loop) forgetSeen(s *state.Snapshot) {
	l.recordedMu.Lock()
	defer l.recordedMu.Unlock()
	for stream, rev := range l.recordedAt {
		if s.Rev >= rev {
			delete(l.recordedAt, stream)
		}
	}
}

// noteRecorded remembers that the recoveries of batch were recorded at rev.
func (l *loop) noteRecorded(batch []pendingWrite, rev int64) {
	l.recordedMu.Lock()
	defer l.recordedMu.Unlock()
	if l.recordedAt == nil {
		l.recordedAt = map[string]int64{}
	}
	for _, w := range batch {
		l.recordedAt[w.write.Rec.Stream] = rev
	}
}

// pending returns the streams an incremental pass looks at: changed and
// the ones under watch, in order.
func (l *loop) pending(changed []string) []string {
	if len(l.watching) == 0 {
		return changed
	}
	set := maps.Clone(l.watching)
	for _, s := range changed {
		set[s] = struct{}{}
	}
	return slices.Sorted(maps.Keys(set))
}

// watch keeps stream under watch: a pass looks at it again even if none of
// its keys changed, within a Resync. A pass keeps a stream watched while it has
// something to do on it that may need another try or a later look (an
// owner suspected or lost, copies sealed past the assignment, copies to
// add, a member whose broker is not registered); a judgement that depends
// on time passing, not on a key, must watch its stream too.
func (l *loop) watch(stream string) {
	if l.watching == nil {
		l.watching = map[string]struct{}{}
	}
	l.watching[stream] = struct{}{}
}

// placementLoad returns the placement load of s, counted once per pass.
func (l *loop) placementLoad(s *state.Snapshot) placement.Load {
	if l.loadFor != s {
		l.load, l.loadFor = transition.LoadOf(s), s
		transition.CountProposals(s, l.load)
	}
	return l.load
}

// reconcile passes over streams of s (those of them with an assignment)
// and reports whether it wrote anything. streams must be in order.
func (l *loop) reconcile(ctx context.Context, s *state.Snapshot, streams []string) bool {
	l.loadFor, l.wrote, l.awaitView, l.placeProbed = nil, false, false, map[string]bool{}
	// Looked at now: watched again only if this pass finds a need.
	for _, stream := range streams {
		delete(l.watching, stream)
	}
	// A recovery this loop recorded that s does not show yet is pending:
	// the stream is left alone, as one whose recovery s shows, and looked
	// at again once the view holds the write.
	l.forgetSeen(s)
	streams = slices.DeleteFunc(slices.Clone(streams), func(stream string) bool {
		if l.unseenRecovery(s, stream) {
			l.watch(stream)
			return true
		}
		return false
	})
	lost := l.lostOwners(ctx, s, streams)
	// The recoveries are written together after the walk: when a broker
	// owning many streams is lost, they are recorded in a few batched
	// transactions instead of one transaction each, and before the fast
	// path changes of other streams, which do not stop a stream serving.
	var recoveries []pendingWrite
	var others []string
	for _, stream := range streams {
		av, ok := s.Assignments[stream]
		if !ok {
			continue
		}
		if _, pending := s.Recoveries[stream]; pending {
			continue
		}
		if reason, ok := lost[stream]; ok {
			l.watch(stream)
			if w, ok := l.proposeRecovery(ctx, s, stream, []string{av.Value.Owner}, reason, "owner lost; pending recovery recorded"); ok {
				recoveries = append(recoveries, w)
			}
			continue
		}
		a := av.Value
		if fence, by := SealedPast(s, a); len(by) > 0 && a.Copies() > 1 {
			l.watch(stream)
			reason := fmt.Sprintf("copies on %s sealed at epoch %d past assignment epoch %d with no recovery pending (a recovery was withdrawn)",
				strings.Join(by, ", "), fence, a.Epoch)
			// The owner is not lost: as for an operator's failover, a live
			// owner is not replaced, since its copy answers the seal.
			if w, ok := l.proposeRecovery(ctx, s, stream, nil, reason, "copies sealed past their assignment with no recovery pending; pending recovery recorded"); ok {
				recoveries = append(recoveries, w)
			}
			continue
		}
		if spec, ok := s.Streams[stream]; ok && spec.Value.Copies > a.Copies() {
			l.watch(stream)
		}
		for _, m := range a.Members() {
			if !s.Live(m) {
				l.watch(stream)
				break
			}
		}
		others = append(others, stream)
	}
	l.recordRecoveries(ctx, recoveries)
	for _, stream := range others {
		if !l.replace(ctx, s, stream) {
			l.replenish(ctx, s, stream)
		}
	}
	return l.wrote
}

// SealedPast returns the members of a whose heartbeat reports their copy
// sealed at a fence epoch above a's epoch, and the highest such epoch.
//
// Only a pending recovery seals past the assignment's epoch, and a sealed
// copy waits until an assignment at or past its fence epoch includes it
// (docs/protocol.md, "Stream failover"). A member sealed past a with no recovery
// pending was sealed for a recovery an operator withdrew before it
// committed. Nothing else releases it: the owner is registered, and a
// sealed copy reports the fence epoch, which Suspecting does not match. So
// the loop records a new recovery, whose transition takes the seal over at
// the same fence epoch (docs/protocol.md, "Copies with a longer tail").
//
// The comparison is strict. A recovery's commit moves the assignment to
// its fence epoch and clears the recovery in one transaction, so a copy
// that has not applied that commit yet, or is left sealed at that epoch,
// is not past the assignment. Copies left out of the assignment stay
// sealed by design and are not looked at.
func SealedPast(s *state.Snapshot, a cluster.Assignment) (fence uint64, by []string) {
	for _, m := range a.Members() {
		if t, ok := s.Tails(m, a.Stream); ok && t.SealEpoch > a.Epoch {
			by = append(by, m)
			fence = max(fence, t.SealEpoch)
		}
	}
	return fence, by
}

// lostOwners decides which streams lost their owner: its broker key is gone
// (lease expired or revoked on clean shutdown), or a follower reports it
// suspect and the controller's own probe of it fails too (eager failover).
func (l *loop) lostOwners(ctx context.Context, s *state.Snapshot, streams []string) map[string]string {
	lost := map[string]string{}
	suspected := map[string][]string{} // owner -> streams
	for _, stream := range streams {
		av, ok := s.Assignments[stream]
		if !ok {
			continue
		}
		if _, pending := s.Recoveries[stream]; pending {
			// Its recovery is under way; reconcile leaves it alone.
			continue
		}
		a := av.Value
		if !s.Live(a.Owner) {
			lost[stream] = fmt.Sprintf("owner %s lost: its broker lease ended", a.Owner)
			continue
		}
		if OwnerStandsDown(s, a) {
			lost[stream] = fmt.Sprintf("owner %s stands down: it restarted after an unclean stop on a new boot and may miss records its followers hold, so it cannot continue epoch %d", a.Owner, a.Epoch)
			continue
		}
		if by := Suspecting(s, a); len(by) > 0 {
			suspected[a.Owner] = append(suspected[a.Owner], stream)
			// Probed again at the next pass while the suspicion lasts,
			// as a full pass did at every Resync.
			l.watch(stream)
		}
	}
	failed := l.probe(ctx, s, slices.Collect(maps.Keys(suspected)))
	for owner, streams := range suspected {
		if !failed[owner] {
			continue
		}
		for _, stream := range streams {
			by := Suspecting(s, s.Assignments[stream].Value)
			lost[stream] = fmt.Sprintf("owner %s lost: suspected by %s and failed the controller's probe", owner, strings.Join(by, ", "))
		}
	}
	return lost
}

// OwnerStandsDown reports that a's owner names itself suspect at a's epoch:
// a broker does that for a replicated stream it owned when it restarts
// after an unclean stop on a new boot. Followers take records once the
// owner has written them, before its fsync, so a machine crash can leave a
// follower holding records the owner lost; continuing the epoch would give
// other records their offsets. A recovery at a new epoch promotes the
// furthest copy instead (docs/protocol.md, "Safety argument").
func OwnerStandsDown(s *state.Snapshot, a cluster.Assignment) bool {
	t, ok := s.Tails(a.Owner, a.Stream)
	return ok && t.Suspect == a.Owner && t.Epoch == a.Epoch
}

// Suspecting returns the live members of a whose heartbeat reports a's owner
// as suspect at a's epoch.
func Suspecting(s *state.Snapshot, a cluster.Assignment) []string {
	var by []string
	for _, f := range a.Followers {
		if t, ok := s.Tails(f, a.Stream); ok && t.Suspect == a.Owner && t.Epoch == a.Epoch {
			by = append(by, f)
		}
	}
	return by
}

// probe checks the owners concurrently, each within the probe grace, and
// returns those that failed.
func (l *loop) probe(ctx context.Context, s *state.Snapshot, owners []string) map[string]bool {
	failed := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, owner := range owners {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, l.cfg.ProbeGrace)
			defer cancel()
			err := l.cfg.Probe(pctx, s.Brokers[owner].Address)
			if err != nil && ctx.Err() == nil {
				mu.Lock()
				failed[owner] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// probePicks probes the brokers placement picked that this pass has not
// probed yet and returns those that failed, this pass's earlier probes
// included.
func (l *loop) probePicks(ctx context.Context, s *state.Snapshot, nodes []string) map[string]bool {
	if l.placeProbed == nil {
		l.placeProbed = map[string]bool{}
	}
	var todo []string
	for _, n := range nodes {
		if _, done := l.placeProbed[n]; !done {
			todo = append(todo, n)
		}
	}
	newly := l.probe(ctx, s, todo)
	for _, n := range todo {
		l.placeProbed[n] = newly[n]
	}
	failed := map[string]bool{}
	for _, n := range nodes {
		if l.placeProbed[n] {
			failed[n] = true
		}
	}
	return failed
}

// pendingWrite is a pending recovery proposed for one stream and not yet
// written, with what its log line says.
type pendingWrite struct {
	write transition.RecoveryWrite
	msg   string
}

// proposeRecovery proposes a pending recovery for a replicated stream whose
// owner is lost or whose copies are sealed past its assignment, for
// recordRecoveries to write and log with msg; a single-copy stream waits
// under attention. lost names members known lost beyond those whose broker
// key is gone (transition.ProposeRecovery). It adds no member, except to
// replace members due for replacement now (withDueReplacements). The fence epoch is the next
// epoch, or the highest one a member is sealed at already: a copy refuses a
// seal below its epoch, and a new transition at the seal's own fence epoch
// takes it over.
func (l *loop) proposeRecovery(ctx context.Context, s *state.Snapshot, stream string, lost []string, reason, msg string) (pendingWrite, bool) {
	a := s.Assignments[stream].Value
	if a.Copies() == 1 {
		return pendingWrite{}, false
	}
	rec, err := transition.ProposeRecoveryWith(s, l.placementLoad(s), stream, lost, reason)
	if err != nil {
		l.cfg.Log.Warn().Err(err).Str(logging.Stream, stream).Msg("liveness: cannot propose a recovery; retrying at the next change")
		return pendingWrite{}, false
	}
	rec = l.withDueReplacements(ctx, s, a, rec)
	if fence, _ := SealedPast(s, a); fence > rec.FenceEpoch {
		rec.FenceEpoch = fence
	}
	rec = transition.Stamp(rec, l.cfg.Now())
	return pendingWrite{write: transition.RecoveryWrite{AsgModRev: s.Assignments[stream].ModRev, Rec: rec}, msg: msg}, true
}

// batchesInFlight bounds the recovery batches written at once. etcd
// commits proposals that arrive together in one raft entry with one WAL
// sync, so batches in flight record a lost owner's streams in about the
// time of one. A batch carries 63 streams at etcd's default --max-txn-ops
// (two compares and two operations each), so 64 record a broker of 4,000
// streams in one round: with 4 batches of 31, a broker owning 3,300
// streams took 27 rounds of etcd's sync, over 2.5 s on a slow disk, and
// with 16 of 63 its recordings still spread over one to three seconds
// under load (docs/limits.md).
const batchesInFlight = 64

// recordRecoveries writes the proposed recoveries in batches that fit one
// transaction each (transition.Batches), each stream guarded as it would be
// alone: its assignment's mod revision and no recovery pending. The batches
// hold disjoint streams, so they are written concurrently (batchesInFlight)
// and in any order.
func (l *loop) recordRecoveries(ctx context.Context, writes []pendingWrite) {
	sizes := make([]transition.TxnSize, len(writes))
	for i, w := range writes {
		sizes[i] = l.commit.RecoverySize(w.write)
	}
	sem := make(chan struct{}, batchesInFlight)
	var wg sync.WaitGroup
	var wrote atomic.Bool
	start := 0
	for _, end := range transition.Batches(sizes, transition.DefaultTxnLimit) {
		batch := writes[start:end]
		start = end
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if l.recordBatch(ctx, batch) {
				wrote.Store(true)
			}
		})
	}
	wg.Wait()
	if wrote.Load() {
		// The pass wrote: the next one waits for the view to hold it.
		l.wrote = true
	}
}

// recordBatch writes one batch in one transaction. A transaction is all or
// nothing, so a batch whose write fails is written again one stream at a
// time: a stream that moved since the read loses only its own write, and
// waits for the next read, while the others of its batch are recorded.
//
// It reports whether it recorded any recovery.
func (l *loop) recordBatch(ctx context.Context, batch []pendingWrite) (wrote bool) {
	ws := make([]transition.RecoveryWrite, len(batch))
	for i, w := range batch {
		ws[i] = w.write
	}
	rev, err := l.commit.WriteRecoveries(ctx, ws)
	if err == nil {
		l.noteRecorded(batch, rev)
		for _, w := range batch {
			l.logRecorded(w)
		}
		return true
	}
	if len(batch) == 1 || errors.Is(err, leader.ErrNotLeader) || ctx.Err() != nil {
		// Nothing one stream at a time could change: the term is over, or
		// the batch was one stream's write.
		for _, w := range batch {
			l.logWriteError(err, w.write.Rec.Stream, "liveness: recovery not recorded; re-reading")
		}
		return false
	}
	l.cfg.Log.Debug().Err(err).Int("streams", len(batch)).Msg("liveness: batch of recoveries not recorded; writing them one by one")
	for i, w := range batch {
		rev, err := l.commit.WriteRecoveries(ctx, []transition.RecoveryWrite{w.write})
		if err != nil {
			l.logWriteError(err, w.write.Rec.Stream, "liveness: recovery not recorded; re-reading")
			continue
		}
		l.noteRecorded(batch[i:i+1], rev)
		l.logRecorded(w)
		wrote = true
	}
	return wrote
}

func (l *loop) logRecorded(w pendingWrite) {
	rec := w.write.Rec
	l.cfg.Log.Info().Str(logging.Stream, rec.Stream).Uint64(logging.Epoch, rec.FromEpoch).Uint64(logging.FenceEpoch, rec.FenceEpoch).
		Str(logging.Transition, rec.TransitionID).Str(logging.Owner, rec.OldOwner).Str("proposed_owner", rec.ProposedOwner).
		Strs("added_members", rec.AddedMembers).Strs("removed_members", rec.RemovedMembers).Str(logging.Reason, rec.Reason).Msg(w.msg)
}

// replenish adds followers to a stream with fewer copies than its spec asks
// for, while the change stays on the fast path: first copies left out of
// the assignment whose broker is live and still reports the stream (the
// furthest first), then brokers placement picks.
func (l *loop) replenish(ctx context.Context, s *state.Snapshot, stream string) {
	spec, ok := s.Streams[stream]
	av := s.Assignments[stream]
	if !ok || spec.Value.Copies <= av.Value.Copies() {
		return
	}
	// A broker with no copy of the stream says nothing in its heartbeat
	// about being alive (brokers write on change), and a killed one stays
	// registered until its lease ends: one that placement picks is probed
	// first, as a suspected owner is, and one that fails is left out.
	var down []string
	var next cluster.Assignment
	var added, blocked []string
	for range maxPlacementRounds {
		next, added, blocked = ReplenishWith(s, l.placementLoad(s), av.Value, spec.Value.Copies, down)
		var fresh []string
		for _, n := range append(slices.Clone(added), blocked...) {
			if _, holds := s.Tails(n, stream); !holds {
				fresh = append(fresh, n)
			}
		}
		failed := l.probePicks(ctx, s, fresh)
		if len(failed) == 0 {
			break
		}
		l.cfg.Log.Info().Str(logging.Stream, stream).Strs("failed_probe", slices.Sorted(maps.Keys(failed))).
			Msg("brokers placement picked failed the probe; picking others")
		down = append(down, slices.Collect(maps.Keys(failed))...)
		added, blocked = nil, nil
	}
	if len(added) == 0 {
		l.restoreThroughRecovery(ctx, s, stream, blocked)
		return
	}
	if err := l.commit.FastPath(ctx, av, next); err != nil {
		l.logWriteError(err, stream, "liveness: follower not added; trying again at the next pass")
		return
	}
	l.wrote, l.awaitView = true, true
	l.cfg.Log.Info().Str(logging.Stream, stream).Uint64(logging.Epoch, next.Epoch).Strs("added", added).
		Strs(logging.Followers, next.Followers).Msg("followers added on the fast path")
}

// maxPlacementRounds bounds how often one pass picks again after picks
// failed their probe.
const maxPlacementRounds = 3

// Replenish returns a with followers added toward copies, one at a time
// while IsFastPath holds: returning copies (live, not members, still
// reporting the stream in their heartbeat; furthest first), then brokers
// placement picks, never one in down (found not serving).
//
// blocked lists the candidates left out because adding them would raise W:
// those additions need a recovery (docs/protocol.md, "Stream failover").
func Replenish(s *state.Snapshot, a cluster.Assignment, copies int, down []string) (next cluster.Assignment, added, blocked []string) {
	return ReplenishWith(s, transition.LoadOf(s), a, copies, down)
}

// ReplenishWith is Replenish with the placement load of s taken already.
func ReplenishWith(s *state.Snapshot, load placement.Load, a cluster.Assignment, copies int, down []string) (next cluster.Assignment, added, blocked []string) {
	// A copy of the stream counts only if its broker has written the
	// stream's heartbeat shard since the assignment was written, which it
	// does on taking the assignment in: a SIGKILLed owner's key and
	// heartbeat outlive it until its lease ends, and adding it back would
	// count a dead copy in E and raise the next recovery's R. It is not
	// placed either.
	since := s.Assignments[a.Stream].ModRev
	var returning []transition.Candidate
	silent := slices.Clone(down)
	for node, hb := range s.Heartbeats {
		if !hb.Holds(a.Stream) || a.Includes(node) {
			continue
		}
		if !s.HeardSince(node, a.Stream, since) {
			silent = append(silent, node)
			continue
		}
		// A draining broker takes no copy back (docs/operating.md,
		// "Draining a broker").
		if s.Live(node) && !slices.Contains(down, node) && !s.IsDraining(node) {
			returning = append(returning, transition.Candidates(s, a.Stream, []string{node})...)
		}
	}
	for _, node := range s.LiveBrokers() {
		// Registered, and not one heartbeat shard written yet: still
		// starting (a broker writes every shard on registering).
		if _, ok := s.Heartbeats[node]; !ok {
			silent = append(silent, node)
		}
	}
	slices.SortFunc(returning, transition.Better)
	order := make([]string, 0, len(returning))
	for _, c := range returning {
		order = append(order, c.Node)
	}
	need := copies - a.Copies()
	// Silent brokers are left out of the live ones rather than excluded:
	// not being members, they must not count as covering a zone either
	// (placement.Pick spreads by the zones of the live brokers excluded).
	exclude := append(a.Members(), order...)
	order = append(order, placement.PickUpTo(load.Without(silent), need, exclude)...)

	next = a
	next.Followers = slices.Clone(a.Followers)
	for i, node := range order {
		if len(added) == need {
			break
		}
		try := next
		try.Followers = append(slices.Clone(next.Followers), node)
		if !cluster.IsFastPath(a, try) {
			blocked = order[i:min(len(order), i+need-len(added))]
			break
		}
		next = try
		added = append(added, node)
	}
	return next, added, blocked
}

// restoreThroughRecovery records a pending recovery that keeps the live
// owner and adds the blocked members, as UpdateStream does for a change
// that raises W: records confirmed under the old W need not meet a seal of
// the new R, so the copies are sealed and the start re-recorded. It only
// runs while the owner is live and heard from; an owner loss is handled by
// its own recovery first.
func (l *loop) restoreThroughRecovery(ctx context.Context, s *state.Snapshot, stream string, blocked []string) {
	av, ok := s.Assignments[stream]
	if !ok || len(blocked) == 0 {
		return
	}
	if _, pending := s.Recoveries[stream]; pending {
		return
	}
	a := av.Value
	if !s.Live(a.Owner) || !s.HeardSince(a.Owner, stream, av.ModRev) {
		return
	}
	spec := s.Streams[stream].Value
	rec := transition.Stamp(cluster.Recovery{
		Stream: stream, FromEpoch: a.Epoch, FenceEpoch: a.Epoch + 1,
		OldOwner: a.Owner, OldFollowers: slices.Clone(a.Followers), ProposedOwner: a.Owner,
		AddedMembers: slices.Clone(blocked), Policy: spec.Policy,
		Reason: fmt.Sprintf("restoring %d copies under %s needs more copies to confirm", spec.Copies, spec.Policy),
	}, l.cfg.Now())
	if err := l.commit.WriteRecovery(ctx, av.ModRev, rec); err != nil {
		l.logWriteError(err, stream, "liveness: copy restore not recorded; trying again at the next pass")
		return
	}
	l.wrote, l.awaitView = true, true
	l.cfg.Log.Info().Str(logging.Stream, stream).Uint64(logging.FenceEpoch, rec.FenceEpoch).Str(logging.Transition, rec.TransitionID).
		Strs("added_members", rec.AddedMembers).Str(logging.Reason, rec.Reason).Msg("copies restored through a pending recovery")
}

func (l *loop) logWriteError(err error, stream, msg string) {
	if errors.Is(err, transition.ErrConflict) || errors.Is(err, leader.ErrNotLeader) {
		l.cfg.Log.Debug().Err(err).Str(logging.Stream, stream).Msg(msg)
		return
	}
	l.cfg.Log.Warn().Err(err).Str(logging.Stream, stream).Msg(msg)
}
