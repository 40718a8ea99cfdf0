package replica

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
)

// DefaultOrphanGrace is how long a copy no assignment includes is kept
// before it is deleted (--orphan-grace).
const DefaultOrphanGrace = 10 * time.Minute

// StreamKeys is a stream's assignment and pending recovery as etcd holds
// them, read at one revision; nil where there is none.
type StreamKeys struct {
	Assignment *cluster.Assignment
	Recovery   *cluster.Recovery
}

// OrphanStats counts this broker's orphan copies: copies of streams that
// exist but whose assignment leaves this broker out (docs/operating.md,
// "Orphan copies").
type OrphanStats struct {
	// Waiting is how many copies are left out of their stream's
	// assignment, kept while the orphan grace runs.
	Waiting int64
	// Held counts checks past the grace that kept the copy after all: a
	// pending recovery names this broker, etcd's assignment includes it,
	// or etcd could not be read.
	Held int64
	// Deleted counts orphan copies deleted, and Bytes the retained bytes
	// they held.
	Deleted int64
	Bytes   int64
}

// orphans is the Manager's orphan bookkeeping.
type orphans struct {
	// since is when each copy was first seen left out while the
	// assignments mirrored etcd; guarded by Manager.mu. A spell in which
	// they did not (AssignmentsStale) clears it: what was assigned then is
	// not known, so the grace starts again.
	since                          map[string]time.Time
	waiting, held, deleted, nbytes atomic.Int64
}

// OrphanStats reports the orphan counts.
func (m *Manager) OrphanStats() OrphanStats {
	return OrphanStats{Waiting: m.orphans.waiting.Load(), Held: m.orphans.held.Load(), Deleted: m.orphans.deleted.Load(), Bytes: m.orphans.nbytes.Load()}
}

// orphanVerdict is what an orphan check decides about one copy.
type orphanVerdict int

const (
	// orphanIncluded: an assignment includes the copy; it is no orphan.
	orphanIncluded orphanVerdict = iota
	// orphanNotMine: the stream has no assignment; deletion of a stream
	// goes by the assignment's removal (DeleteAssignment,
	// SyncAssignments), not by the orphan grace.
	orphanNotMine
	// orphanWait: left out, but the grace has not run out, or the
	// broker's view of the assignments does not mirror etcd.
	orphanWait
	// orphanHeld: left out, but a pending recovery names this broker: the
	// recovery may seal the copy, and its records may be the ones that
	// carry confirmed records into the next epoch (docs/protocol.md,
	// "Stream failover").
	orphanHeld
	// orphanDelete: the copy is an orphan; its data goes.
	orphanDelete
)

// orphanFacts is what an orphan check knows about one copy.
type orphanFacts struct {
	node string
	// incarnation is the copy's ("" when it never recorded one).
	incarnation string
	// mirrored: the broker's assignments mirror etcd (a full listing
	// done and the watch running), as for NotFound (unknown).
	mirrored bool
	// view is the broker's view of the stream's assignment; current and
	// recovery are etcd's, read at the check (nil: none, or not read).
	view, current *cluster.Assignment
	recovery      *cluster.Recovery
	// since is when the copy was first seen left out (zero: not yet).
	since time.Time
	now   time.Time
	grace time.Duration
}

// includes reports whether a includes node's copy of incarnation inc: a
// copy of an earlier stream of the same name (deleted and created again
// while the broker was away) is not the new stream's copy, whatever the
// new assignment names.
func includes(a *cluster.Assignment, node, inc string) bool {
	if a == nil || !a.Includes(node) {
		return false
	}
	return a.Incarnation == "" || inc == "" || a.Incarnation == inc
}

// names reports whether a pending recovery names node: among the old
// members it may seal, or the members it adds.
func names(r *cluster.Recovery, node string) bool {
	return r != nil && (slices.Contains(r.OldMembers(), node) || slices.Contains(r.AddedMembers, node))
}

// verdict decides. Every doubt keeps the copy: deleting one a recovery
// still needs could lose confirmed records, keeping one costs disk.
func (f orphanFacts) verdict() orphanVerdict {
	if f.view == nil && f.current == nil {
		return orphanNotMine
	}
	if includes(f.view, f.node, f.incarnation) || includes(f.current, f.node, f.incarnation) {
		return orphanIncluded
	}
	if !f.mirrored || f.since.IsZero() || f.now.Sub(f.since) < f.grace {
		return orphanWait
	}
	if f.current == nil {
		// Deleted in etcd, the watch not there yet: the deletion drops it.
		return orphanNotMine
	}
	otherIncarnation := f.current.Incarnation != "" && f.incarnation != "" && f.current.Incarnation != f.incarnation
	if names(f.recovery, f.node) && !otherIncarnation {
		// A recovery of another incarnation seals that incarnation's
		// copies only (Seal refuses this one).
		return orphanHeld
	}
	return orphanDelete
}

// orphanSweepInterval is how often copies are looked over for a grace of
// g: often enough that an orphan goes about a quarter grace late at most.
func orphanSweepInterval(g time.Duration) time.Duration {
	return min(max(g/4, 10*time.Millisecond), 30*time.Second)
}

// orphanLoop looks over the copies on a clock (sweepOrphans).
func (m *Manager) orphanLoop() {
	defer m.wg.Done()
	t := time.NewTicker(orphanSweepInterval(m.cfg.OrphanGrace))
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		m.sweepOrphans(time.Now())
	}
}

// sweepOrphans starts the grace of copies the broker's view leaves out,
// forgets it for copies included again, and asks each copy whose grace has
// run out to check itself against etcd (Copy.dropIfOrphan). It reads the
// view alone; only those checks read etcd.
func (m *Manager) sweepOrphans(now time.Time) {
	type entry struct {
		c *Copy
		a *cluster.Assignment
	}
	m.mu.RLock()
	mirrored := m.assignmentsCurrent
	entries := make([]entry, 0, len(m.copies))
	for name, c := range m.copies {
		e := entry{c: c}
		if a, ok := m.assignments[name]; ok {
			e.a = &a
		}
		entries = append(entries, e)
	}
	m.mu.RUnlock()
	if !mirrored {
		m.mu.Lock()
		clear(m.orphans.since)
		m.mu.Unlock()
		m.orphans.waiting.Store(0)
		return
	}
	// Incarnations are read without m.mu: storage takes its own locks.
	left := make(map[*Copy]bool, len(entries))
	for _, e := range entries {
		left[e.c] = e.a != nil && !includes(e.a, m.cfg.Node, e.c.st.State().Incarnation)
	}
	var due []*Copy
	m.mu.Lock()
	if m.assignmentsCurrent {
		for name := range m.orphans.since {
			if c, ok := m.copies[name]; !ok || !left[c] {
				delete(m.orphans.since, name)
			}
		}
		for c, out := range left {
			if !out || m.copies[c.name] != c {
				continue
			}
			since, ok := m.orphans.since[c.name]
			if !ok {
				m.orphans.since[c.name] = now
				continue
			}
			if now.Sub(since) >= m.cfg.OrphanGrace {
				due = append(due, c)
			}
		}
	}
	m.orphans.waiting.Store(int64(len(m.orphans.since)))
	m.mu.Unlock()
	for _, c := range due {
		c.askOrphanCheck()
	}
}

// askOrphanCheck has the copy's reconcile run check it against etcd.
func (c *Copy) askOrphanCheck() {
	c.mu.Lock()
	c.orphanAsked = true
	c.wakeLocked()
	c.mu.Unlock()
}

// orphanReadTimeout bounds an orphan check's read of etcd.
const orphanReadTimeout = 5 * time.Second

// dropIfOrphan deletes the copy if it is an orphan, reporting whether it
// did (the copy is then gone: its run ends). It runs in the copy's run,
// so no assignment is applied to the copy meanwhile, and holds dropMu, so
// no seal runs on it meanwhile (Seal).
//
// The check reads the stream's assignment and pending recovery from etcd
// at one revision, besides the broker's own view: a recovery is recorded
// before any of its seals is sent, so a seal this copy answered before
// dropMu was taken is one whose recovery the read sees, unless that
// recovery is over. A recovery recorded after the read starts from an
// assignment that included this broker after the read; if that assignment
// reaches the view after the verdict, dropCopy applies it to an empty
// copy, which acknowledged nothing under it: a fresh copy, as placement
// adds (docs/protocol.md, "Safety argument").
func (c *Copy) dropIfOrphan(ctx context.Context) bool {
	m := c.m
	c.dropMu.Lock()
	defer c.dropMu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, orphanReadTimeout)
	keys, err := m.cfg.ReadStream(rctx, c.name)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.orphans.held.Add(1)
			m.log.Warn().Err(err).Str(logging.Stream, c.name).Msg("orphan check could not read etcd; copy kept, checked again later")
		}
		return false
	}
	state := c.st.State()
	m.mu.RLock()
	f := orphanFacts{
		node: m.cfg.Node, incarnation: state.Incarnation, mirrored: m.assignmentsCurrent,
		current: keys.Assignment, recovery: keys.Recovery,
		since: m.orphans.since[c.name], now: time.Now(), grace: m.cfg.OrphanGrace,
	}
	if a, ok := m.assignments[c.name]; ok {
		f.view = &a
	}
	m.mu.RUnlock()
	switch f.verdict() {
	case orphanDelete:
	case orphanHeld:
		m.orphans.held.Add(1)
		if c.orphanHeldFor != f.recovery.TransitionID {
			// Once per recovery: the check repeats until it is over.
			c.orphanHeldFor = f.recovery.TransitionID
			m.log.Info().Str(logging.Stream, c.name).Uint64(logging.FenceEpoch, f.recovery.FenceEpoch).Str(logging.Transition, f.recovery.TransitionID).
				Msg("copy left out of the assignment kept past the orphan grace: a pending recovery names this broker")
		}
		return false
	case orphanIncluded:
		// etcd's assignment includes the copy and the view has not caught
		// up: the sweep forgets its grace once it has.
		m.orphans.held.Add(1)
		return false
	default:
		return false
	}
	c.dropped = true
	c.endRole("")
	err = m.dropCopy(c)
	m.mu.Lock()
	delete(m.orphans.since, c.name)
	m.mu.Unlock()
	epoch := uint64(0)
	if f.current != nil {
		epoch = f.current.Epoch
	}
	if err != nil {
		m.log.Error().Err(err).Str(logging.Stream, c.name).Msg("delete of an orphan copy failed; data stays on disk until the stream's next change or the broker's restart")
		return true
	}
	m.orphans.deleted.Add(1)
	m.orphans.nbytes.Add(int64(state.Bytes))
	m.cfg.Metrics.OrphanDeleted(state.Bytes)
	m.log.Warn().Str(logging.Stream, c.name).Uint64(logging.Epoch, state.Epoch).Uint64("assignment_epoch", epoch).
		Uint64(logging.RecordTail, state.RecordTail).Uint64("bytes", state.Bytes).Str("incarnation", state.Incarnation).
		Time("orphaned_since", f.since).Dur("grace", f.grace).
		Msg("deleted an orphan copy: no assignment has included it for the orphan grace")
	return true
}

// errDropped is why a seal finds no copy: it was deleted as an orphan.
var errDropped = fmt.Errorf("%w: the copy was deleted as an orphan", ErrUnavailable)
