package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Copy is this broker's copy of one stream.
type Copy struct {
	m    *Manager
	name string
	st   *storage.Stream

	// kick wakes a reconcile run waiting out its retry backoff; done is
	// closed once the copy is closed for good (dropped, or its manager
	// closed): readers parked on the copy leave then.
	kick     chan struct{}
	done     chan struct{}
	doneOnce sync.Once

	mu      sync.Mutex
	desired *cluster.Assignment
	// desiredRev is the etcd revision desired was read at (0: not known):
	// its history starts are read at or past it (bringOntoHistory).
	desiredRev int64
	deleted    bool
	// applied is the last assignment whose role this copy took.
	applied cluster.Assignment
	role    string
	// roleCtx ends when the role ends; waiters on the role select on it.
	roleCtx    context.Context
	roleCancel context.CancelFunc
	roleWG     sync.WaitGroup
	tracker    *confirmTracker
	// untrackDurable stops storage telling an owner role's tracker the
	// copy's durable tail (startRole); endRole calls it.
	untrackDurable func()
	// follower side: the owner's watermark as last received, capped at the
	// copy's own tail, and a channel closed when it moves.
	followerWM    uint64
	followerWMCh  chan struct{}
	suspect       string
	chainMismatch bool
	cursorNotify  chan struct{}
	// roleChanged is closed and replaced whenever a role starts or ends, so
	// readers parked on the previous role's watermark channel wake up.
	roleChanged     chan struct{}
	lastApplyErrLog time.Time
	// unsureEpoch is the epoch this copy was at when its broker started
	// after an unclean stop on a new boot (storage State.UnsureEpoch, kept
	// in the copy until it moves to a new epoch),
	// and ownerWithheld is set while it stands down as that epoch's owner
	// (withholdOwner).
	unsureEpoch   uint64
	ownerWithheld bool
	// orphanAsked and desiredSet say why the copy was woken: an orphan
	// check (askOrphanCheck), a new assignment (setDesired).
	orphanAsked, desiredSet bool
	// runDone is the running reconcile's (nil when none runs: a copy
	// costs no goroutine while there is nothing to apply), closed when it
	// ends; closed says the copy takes nothing more in (dropped, or its
	// manager closing).
	runDone chan struct{}
	closed  bool
	// dropMu orders a seal against the copy's deletion as an orphan
	// (dropIfOrphan); dropped, set under dropMu, says the deletion
	// happened.
	dropMu  sync.Mutex
	dropped bool
	// orphanHeldFor is the transition id of the pending recovery the last
	// orphan check kept the copy for (the copy's reconcile run alone uses it).
	orphanHeldFor string
	// pause is the handover this owner is paused for (nil when none), and
	// gate is held shared by every append and cursor commit of the owner
	// role, so a pause knows when the last one that started before it
	// ended (handover.go).
	pause *handoverPause
	gate  sync.RWMutex
	// followQueued says a follow queued a batch for storage since the
	// last sync before a follow started (followOnce).
	followQueued atomic.Bool
}

func newCopy(m *Manager, name string, st *storage.Stream) *Copy {
	c := &Copy{
		m:            m,
		name:         name,
		st:           st,
		kick:         make(chan struct{}, 1),
		done:         make(chan struct{}),
		followerWMCh: make(chan struct{}),
		cursorNotify: make(chan struct{}),
		roleChanged:  make(chan struct{}),
	}
	c.roleCtx, c.roleCancel = context.WithCancel(context.Background())
	c.roleCancel()
	s := st.State()
	if s.SealEpoch != 0 {
		c.role = cluster.RoleSealed
	}
	c.followerWM = s.ConfirmWatermark
	return c
}

func (c *Copy) setDesired(a *cluster.Assignment, rev int64) {
	c.mu.Lock()
	if a == nil {
		c.deleted = true
	} else {
		cp := *a
		c.desired, c.desiredRev = &cp, rev
	}
	c.desiredSet = true
	c.wakeLocked()
	c.mu.Unlock()
}

// wakeLocked has a reconcile run take in what was asked (c.mu held): it
// starts one when none runs, and wakes one waiting out a retry. One run
// at a time per copy, so assignments are applied in order; none once the
// copy is closed.
func (c *Copy) wakeLocked() {
	if c.closed || c.m.ctx.Err() != nil {
		return
	}
	if c.runDone == nil {
		done := make(chan struct{})
		c.runDone = done
		// Added under c.mu, before stop can see the run: Close waits for
		// every copy's run (stop) before it waits for the group.
		c.m.wg.Add(1)
		go func() {
			defer c.m.wg.Done()
			defer close(done)
			c.reconcileRun(c.m.ctx)
		}()
		return
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// endRun ends a run that dropped the copy. The copy is marked closed in
// the same step that ends the run: a wake between the two would start a
// run on the dropped copy, and its reconcile would drop the stream's name
// again, by then perhaps the copy created for it anew.
func (c *Copy) endRun() {
	c.mu.Lock()
	c.runDone = nil
	c.closed = true
	c.mu.Unlock()
	c.releaseReaders()
}

// releaseReaders wakes the readers parked on a copy closed for good.
func (c *Copy) releaseReaders() {
	c.doneOnce.Do(func() { close(c.done) })
}

// reconcileRun applies the latest desired assignment, retrying with backoff
// while it cannot (history unreadable, storage error): an assignment is
// withheld rather than applied on a guess (docs/protocol.md, "Copies with
// a longer tail"). It runs only while there is something to take in, and
// ends once there is not: at 10,000 copies a goroutine parked per copy
// was a quarter of a broker's goroutines, stacks the garbage collector
// scans at every cycle (docs/limits.md, "Memory grows with the copies a
// broker holds"). wakeLocked starts it; the check that nothing is left and
// the end of the run are one step under c.mu, so no wake is lost.
func (c *Copy) reconcileRun(ctx context.Context) {
	retry := time.Duration(0)
	for {
		if retry > 0 {
			t := time.NewTimer(retry)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-c.kick:
				t.Stop()
			case <-t.C:
			}
		}
		c.mu.Lock()
		orphan, desiredSet := c.orphanAsked, c.desiredSet
		if ctx.Err() != nil || c.closed || (!orphan && !desiredSet && retry == 0) {
			c.runDone = nil
			c.mu.Unlock()
			return
		}
		c.orphanAsked, c.desiredSet = false, false
		c.mu.Unlock()
		if orphan && c.dropIfOrphan(ctx) {
			c.m.heartbeatNow(c.name, false)
			c.endRun()
			return
		}
		if orphan && !desiredSet && retry == 0 {
			// An orphan check alone: nothing to apply, nor a heartbeat
			// to ask for (a copy that took nothing in says nothing new).
			continue
		}
		dropped, err := c.reconcile(ctx)
		// The status may have changed (a role, an epoch, a cut, the copy
		// gone); a copy that took the assignment in says so even if not.
		c.m.heartbeatNow(c.name, err == nil && !dropped)
		if dropped {
			c.endRun()
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				continue // the check above ends the run
			}
			retry = min(max(2*retry, 50*time.Millisecond), 2*time.Second)
			c.mu.Lock()
			logIt := time.Since(c.lastApplyErrLog) > 5*time.Second
			if logIt {
				c.lastApplyErrLog = time.Now()
			}
			c.mu.Unlock()
			if logIt {
				c.m.log.Warn().Err(err).Str(logging.Stream, c.name).Msg("assignment withheld; retrying")
			}
			continue
		}
		retry = 0
	}
}

func (c *Copy) reconcile(ctx context.Context) (dropped bool, err error) {
	c.mu.Lock()
	deleted, desired, rev := c.deleted, c.desired, c.desiredRev
	c.mu.Unlock()
	if deleted {
		c.endRole("")
		if err := c.m.dropCopy(c); err != nil {
			c.m.log.Error().Err(err).Str(logging.Stream, c.name).Msg("drop of deleted stream failed; data stays on disk")
		} else {
			c.m.log.Info().Str(logging.Stream, c.name).Msg("stream deleted; copy dropped")
		}
		return true, nil
	}
	if desired == nil {
		return false, nil
	}
	a := *desired
	node := c.m.cfg.Node
	// The name may have been deleted and created again while this broker
	// was away: a copy of another incarnation holds the deleted stream's
	// records, which must never be shown as the new one's. It is dropped,
	// and an empty copy opened if the new assignment includes this broker.
	if inc := c.st.State().Incarnation; a.Incarnation != "" && inc != "" && inc != a.Incarnation {
		return true, c.replaceWithEmpty(a, fmt.Errorf("copy of incarnation %q, assignment of %q", inc, a.Incarnation))
	}
	if a.Incarnation != "" && a.Includes(node) {
		if err := c.st.SetIncarnation(ctx, a.Incarnation); errors.Is(err, storage.ErrIncarnation) {
			return true, c.replaceWithEmpty(a, err)
		} else if err != nil {
			return false, fmt.Errorf("record incarnation: %w", err)
		}
	}
	state := c.st.State()
	if !a.Includes(node) {
		// Left out: stop serving. A sealed copy stays sealed until a later
		// assignment includes it (docs/protocol.md, "Stream failover").
		c.mu.Lock()
		role := c.role
		c.mu.Unlock()
		if role == cluster.RoleOwner || role == cluster.RoleFollower {
			c.endRole("")
			c.m.log.Info().Str(logging.Stream, c.name).Uint64(logging.Epoch, a.Epoch).Msg("copy left out of the assignment; stopped")
		}
		return false, nil
	}
	sealed := state.SealEpoch != 0
	if a.Epoch < state.Epoch {
		// The copy is fenced past this assignment (a seal for a pending
		// recovery); it waits for the recovered assignment.
		return false, nil
	}
	newEpoch := a.Epoch > state.Epoch || (sealed && a.Epoch >= state.SealEpoch)
	// history is the stream's history starts if the cut read them, so a
	// copy promoted at a new epoch reads them once, not once for the cut
	// and once more for the confirmed prefix warning: after a mass
	// failover each read is one of thousands in flight.
	var history cluster.HistoryStarts
	if newEpoch {
		// Fence the old epoch and stop the old role before the cut: a
		// publish or follow batch of the old role already past its role
		// check would otherwise land between the cut and the advance, and
		// the advance would make it part of the new epoch's history, on
		// offsets the new owner gives to other records (docs/protocol.md,
		// "Copies with a longer tail"; storage.FenceBelow).
		c.st.FenceBelow(a.Epoch)
		c.endRole("")
		// The cut is decided on the tails after the fence: a write the
		// old role had admitted (its offset assigned) may still be on its
		// way to disk, and State reports durable tails. Decided on the
		// tails read above, such a record (an owner's publish no follower
		// took, so never confirmed) would escape the cut, the advance
		// would make it part of the new epoch's history at an offset the
		// new owner gives to another record, and the copies would no
		// longer hold prefixes of each other: a later pick among copies
		// tied on their tails could then promote the one without a
		// confirmed record (docs/protocol.md, "Copies with a longer
		// tail"). Once every write handed to the committer before the
		// fence is durable, State has them all.
		if err := c.st.Sync(ctx); err != nil {
			return false, fmt.Errorf("sync before the cut: %w", err)
		}
		state = c.st.State()
		if history, err = c.bringOntoHistory(ctx, state, a.Epoch, rev); err != nil {
			return false, err
		}
		if err := c.st.AdvanceEpoch(ctx, a.Epoch); err != nil {
			return false, fmt.Errorf("advance epoch: %w", err)
		}
	}
	wantRole := cluster.RoleFollower
	if a.Owner == node {
		wantRole = cluster.RoleOwner
	}
	if wantRole == cluster.RoleOwner && c.withholdOwner(ctx, a) {
		return false, nil
	}
	c.mu.Lock()
	same := !newEpoch && c.role == wantRole && c.applied.Epoch == a.Epoch && c.applied.Owner == a.Owner
	if same {
		// A fast-path change at the same epoch: followers added or W lowered.
		c.applied = a
		if c.tracker != nil {
			c.tracker.setMembers(cluster.StreamConfirmPolicy(a.Policy, a.Copies()), a.Followers)
		}
		c.mu.Unlock()
		return false, nil
	}
	c.mu.Unlock()
	c.endRole("")
	if newEpoch && wantRole == cluster.RoleOwner {
		c.warnBelowConfirmedPrefix(ctx, a.Epoch, history, rev)
	}
	c.startRole(a, wantRole)
	return false, nil
}

// withholdOwner keeps a copy from continuing as owner an epoch that its
// broker may not hold in full. An owner ships records to followers once
// written, before its own fsync ends (storage.WrittenTail), so after an
// unclean stop on a new boot (a machine crash) a follower may hold records
// this copy lost. Owning the same epoch on would give other records their
// offsets and break the prefix property the safety argument
// (docs/protocol.md) rests on. The copy stands down instead: it names itself suspect in its
// heartbeat, the controller records a pending recovery
// (liveness.OwnerStandsDown), and the recovery promotes the furthest copy
// at a new epoch, which this one then follows or owns at its own tails. A
// single-copy stream has no follower that could hold more, so it goes on.
func (c *Copy) withholdOwner(ctx context.Context, a cluster.Assignment) bool {
	c.mu.Lock()
	if c.unsureEpoch == 0 || a.Epoch > c.unsureEpoch || len(a.Followers) == 0 {
		// A new epoch, or a single copy going on as owner of this one:
		// either way this copy's log is the epoch's from here, so a
		// follower the fast path adds to the same epoch later is no
		// reason to stand down.
		was := c.unsureEpoch
		c.unsureEpoch = 0
		c.mu.Unlock()
		if was != 0 && a.Epoch <= was {
			// The store clears it itself when the epoch advances; a single
			// copy going on at its epoch is said here. Should this write
			// fail, a restart stands down once more: safe, and the store
			// has failed anyway.
			if err := c.st.ClearUnsure(ctx); err != nil {
				c.m.log.Warn().Err(err).Str(logging.Stream, c.name).Msg("could not record that the copy goes on at its epoch")
			}
		}
		return false
	}
	already := c.ownerWithheld
	c.mu.Unlock()
	if !already {
		c.endRole("")
		c.mu.Lock()
		c.ownerWithheld = true
		c.mu.Unlock()
		c.m.log.Warn().Str(logging.Stream, c.name).Uint64(logging.Epoch, a.Epoch).
			Msg("restarted after an unclean stop on a new boot: records written but not synced may be gone here, so this copy does not continue the epoch as owner; asking for a recovery")
	}
	c.setSuspect(c.m.cfg.Node)
	return true
}

// standingDown reports whether the copy withholds its owner role.
func (c *Copy) standingDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ownerWithheld
}

// warnBelowConfirmedPrefix logs when this copy becomes owner with a record
// tail below the latest history start before its epoch: only an accepted
// owner loss promotes such a copy, and the operator accepted losing the
// records above its tail (docs/limits.md).
//
// history is the starts as the cut read them, if it did: read again
// otherwise, at or past rev. The warning only tells an operator; it
// decides nothing.
func (c *Copy) warnBelowConfirmedPrefix(ctx context.Context, epoch uint64, history cluster.HistoryStarts, rev int64) {
	if history == nil {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var err error
		if history, err = c.m.cfg.History(hctx, c.name, rev); err != nil {
			return
		}
	}
	tail := c.st.State().RecordTail
	for i := len(history) - 1; i >= 0; i-- {
		h := history[i]
		if h.Epoch >= epoch {
			continue
		}
		if tail < h.RecordTail {
			c.m.log.Warn().Str(logging.Stream, c.name).Uint64(logging.Epoch, epoch).Uint64(logging.RecordTail, tail).
				Uint64("start_record_tail", h.RecordTail).Str("start_node", h.Node).
				Msg("promoted below the confirmed prefix (an accepted owner loss); records above this tail are gone")
		}
		return
	}
}

// replaceWithEmpty drops a copy of an earlier incarnation than assignment
// a's; dropCopy then applies the stream's latest assignment (a, or one that
// came since), which opens an empty copy if it names this broker.
func (c *Copy) replaceWithEmpty(a cluster.Assignment, why error) error {
	c.endRole("")
	if err := c.m.dropCopy(c); err != nil {
		c.m.log.Error().Err(err).Str(logging.Stream, c.name).Msg("drop of a stale incarnation failed; data stays on disk")
		return err
	}
	c.m.log.Warn().Err(why).Str(logging.Stream, c.name).Uint64(logging.Epoch, a.Epoch).Msg("dropped a copy of a deleted stream of the same name")
	return nil
}

// bringOntoHistory cuts the copy back to the history of target before the
// role change (docs/protocol.md, "Copies with a longer tail"). A sealed copy judges by
// the epochs its seal replaced, since the seal advanced them without data.
// It returns the history starts it read (nil if it read none).
func (c *Copy) bringOntoHistory(ctx context.Context, state storage.State, target uint64, rev int64) (cluster.HistoryStarts, error) {
	own := state.LogEpochs
	if state.SealEpoch != 0 {
		own = state.SealedLogEpochs
	}
	if len(own) == 0 && state.RecordTail == 0 && state.CursorEventTail == 0 {
		return nil, nil // an empty copy has no history to leave
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	history, err := c.m.cfg.History(hctx, c.name, rev)
	if err != nil {
		return nil, fmt.Errorf("read history starts: %w", err)
	}
	cut, ok, err := cutPoint(c.m.cfg.Node, own, state.RecordTail, state.CursorEventTail, history, target)
	if err != nil || !ok {
		return history, err
	}
	if cut.RecordTail < state.Head {
		c.m.log.Warn().Str(logging.Stream, c.name).Uint64("cut", cut.RecordTail).Uint64("head", state.Head).
			Msg("history start below the retained head; cutting at the head")
	}
	if err := c.st.Cut(ctx, cut.RecordTail, cut.CursorEventTail); err != nil {
		return nil, fmt.Errorf("cut: %w", err)
	}
	// The cut lowered storage's watermark to the new record tail; the
	// copy's own view must come down with it, or readers would be shown a
	// watermark above the records this copy holds. Records the cut took
	// that were confirmed (an accepted owner loss cuts lower than needed)
	// are shown again once fetched back from the owner.
	c.mu.Lock()
	c.followerWM = min(c.followerWM, c.st.State().ConfirmWatermark)
	c.m.statusChanged()
	c.mu.Unlock()
	c.m.log.Warn().Str(logging.Stream, c.name).Uint64(logging.Epoch, target).
		Uint64("from_record_tail", state.RecordTail).Uint64(logging.RecordTail, cut.RecordTail).
		Uint64(logging.CursorEventTail, cut.CursorEventTail).Str("start_node", cut.Node).
		Msg("copy held records past the new history start; cut them (none was confirmed)")
	return history, nil
}

// awaitApplied returns once the copy has applied an assignment at epoch
// or later, or after wait, whichever is first (the caller then judges
// the copy's role as it finds it), or with ctx's error once ctx ends.
func (c *Copy) awaitApplied(ctx context.Context, epoch uint64, wait time.Duration) error {
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		applied, changed := c.applied.Epoch, c.roleChanged
		c.mu.Unlock()
		if applied >= epoch {
			return nil
		}
		if timeout == nil {
			timer := time.NewTimer(wait)
			defer timer.Stop()
			timeout = timer.C
		}
		select {
		case <-changed:
		case <-timeout:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Copy) startRole(a cluster.Assignment, role string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applied = a
	c.role = role
	c.signalRoleChangeLocked()
	c.suspect = ""
	c.chainMismatch = false
	c.ownerWithheld = false
	c.roleCtx, c.roleCancel = context.WithCancel(c.m.ctx)
	state := c.st.State()
	log := c.m.log.Info().Str(logging.Stream, c.name).Uint64(logging.Epoch, a.Epoch).Str(logging.Owner, a.Owner).
		Uint64(logging.RecordTail, state.RecordTail).Uint64(logging.CursorEventTail, state.CursorEventTail)
	switch role {
	case cluster.RoleOwner:
		rule := cluster.StreamConfirmPolicy(a.Policy, a.Copies())
		tracker := newConfirmTracker(rule, a.Followers, state.RecordTail, state.ConfirmWatermark)
		// Storage persists it lazily, without an fsync: a lower value
		// after a crash only delays retention and reads.
		tracker.onAdvance = func(wm uint64) {
			c.st.SetConfirmWatermark(wm)
			// The heartbeat publishes the owner's watermark (Copy.tails).
			c.m.statusChanged()
		}
		c.tracker = tracker
		// The owner's own copy counts toward W as storage makes records
		// durable, whoever waited for them: a publish whose caller went
		// away before its fsync ended reports nothing, and its records,
		// durable here and maybe on every follower, would stay above the
		// confirm watermark (hidden from readers, never confirmed to a
		// retry) until the next publish.
		c.untrackDurable = c.st.OnDurable(tracker.ownerDurable)
		log.Int("w", rule.W).Msg("owner at its own tails")
	case cluster.RoleFollower:
		c.tracker = nil
		ctx := c.roleCtx
		c.roleWG.Add(1)
		go func() {
			defer c.roleWG.Done()
			c.runFollower(ctx, a.Owner, a.Epoch)
		}()
		log.Msg("following the owner")
	}
}

// endRole stops the current role's workers and wakes its waiters; newRole
// is what the copy is afterwards ("" or sealed).
func (c *Copy) endRole(newRole string) {
	c.mu.Lock()
	c.roleCancel()
	untrack := c.untrackDurable
	c.untrackDurable = nil
	c.mu.Unlock()
	if untrack != nil {
		untrack()
	}
	c.roleWG.Wait()
	c.mu.Lock()
	c.role = newRole
	c.tracker = nil
	c.signalRoleChangeLocked()
	c.mu.Unlock()
}

func (c *Copy) signalRoleChangeLocked() {
	close(c.roleChanged)
	c.roleChanged = make(chan struct{})
	// A role change is what attention and recovery read (a seal ends the
	// role too): published at once, not with the next tails.
	c.m.heartbeatNow(c.name, false)
}

// stop closes the copy as its manager closes (after cancelling the
// manager's context): no reconcile starts, a running one ends, and only
// then the role ends, so no role the run was starting outlives the stop
// and runs on into a closed store.
func (c *Copy) stop() {
	c.mu.Lock()
	c.closed = true
	run := c.runDone
	c.mu.Unlock()
	if run != nil {
		<-run
	}
	c.endRole("")
	c.releaseReaders()
}

// visible returns the watermark below which readers may see records, a
// channel closed when it moves, and one closed when the copy's role changes
// (the first belongs to the role: a reader must re-ask after a change).
func (c *Copy) visible() (uint64, <-chan struct{}, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.role == cluster.RoleOwner && c.tracker != nil {
		wm, ch := c.tracker.get()
		return wm, ch, c.roleChanged
	}
	return c.followerWM, c.followerWMCh, c.roleChanged
}

func (c *Copy) setFollowerWatermark(wm uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if wm > c.followerWM {
		c.followerWM = wm
		c.m.statusChanged()
		close(c.followerWMCh)
		c.followerWMCh = make(chan struct{})
	}
}

func (c *Copy) tails() (cluster.CopyTails, bool) {
	s := c.st.Status()
	c.mu.Lock()
	defer c.mu.Unlock()
	role := c.role
	if s.SealEpoch != 0 {
		role = cluster.RoleSealed
	}
	wm := c.followerWM
	if c.tracker != nil {
		wm, _ = c.tracker.get()
	}
	return cluster.CopyTails{
		Epoch:            s.Epoch,
		Role:             role,
		Head:             s.Head,
		RecordTail:       s.RecordTail,
		CursorEventTail:  s.CursorEventTail,
		ConfirmWatermark: wm,
		SealEpoch:        s.SealEpoch,
		Suspect:          c.suspect,
		ChainMismatch:    c.chainMismatch,
		Incarnation:      cluster.IncarnationTag(s.Incarnation),
	}, true
}

func (c *Copy) applyRetention(ctx context.Context, now time.Time) {
	c.mu.Lock()
	role, r := c.role, c.applied.Retention
	c.mu.Unlock()
	if role != cluster.RoleOwner && role != cluster.RoleFollower {
		return
	}
	if r.MaxRecords == 0 && r.MaxBytes == 0 && r.MaxAge == 0 {
		return
	}
	if _, err := c.st.ApplyRetention(ctx, storage.Retention{MaxRecords: r.MaxRecords, MaxBytes: r.MaxBytes, MaxAge: r.MaxAge}, now); err != nil && !errors.Is(err, storage.ErrClosed) && ctx.Err() == nil {
		c.m.log.Warn().Err(err).Str(logging.Stream, c.name).Msg("retention failed; will retry")
	}
}

// ownerRole returns the owner's state if this copy is the owner.
// everApplied reports whether the copy has taken a role from an assignment
// since it was opened. A copy found on disk at start (or opened for a seal)
// is not read from before: it may hold a deleted stream's records under a
// name created again, or records its next role change cuts, and its stored
// watermark belongs to what it was (docs/protocol.md, "Copies with a longer tail").
func (c *Copy) everApplied() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied.Epoch != 0
}

func (c *Copy) ownerRole() (cluster.Assignment, *confirmTracker, context.Context, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.role != cluster.RoleOwner || c.tracker == nil {
		return cluster.Assignment{}, nil, nil, false
	}
	return c.applied, c.tracker, c.roleCtx, true
}

func (c *Copy) notifyCursor() {
	c.mu.Lock()
	close(c.cursorNotify)
	c.cursorNotify = make(chan struct{})
	c.mu.Unlock()
}

func (c *Copy) cursorChanged() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cursorNotify
}

func (c *Copy) setSuspect(owner string) {
	c.mu.Lock()
	changed := c.suspect != owner
	c.suspect = owner
	c.mu.Unlock()
	if changed {
		c.m.heartbeatNow(c.name, false)
	}
}

func (c *Copy) setChainMismatch() {
	c.mu.Lock()
	changed := !c.chainMismatch
	c.chainMismatch = true
	c.mu.Unlock()
	if changed {
		c.m.heartbeatNow(c.name, false)
	}
}

func isFollowerOf(a cluster.Assignment, node string) bool {
	return slices.Contains(a.Followers, node)
}
