package admin

import (
	"maps"
	"sync"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// loads keeps the placement load (transition.LoadOf) of the newest snapshot
// a call placed copies on, and moves it on to a newer snapshot by the
// assignments changed since, instead of counting every member of every
// assignment again: a flood of creations would otherwise count the whole
// cluster once per creation, and creating N streams would cost N² (10000
// streams took 40 s so, most of it counting).
type loads struct {
	mu sync.Mutex
	// base is the snapshot counted (nil before the first call); copies
	// and owned are its counts, owned by loads alone.
	base          *state.Snapshot
	copies, owned map[string]int
}

// of returns a placement load for snap: exactly transition.LoadOf(snap) for
// a snapshot at least as new as any asked for before. A call holding an
// older snapshot than another's (concurrent calls) gets the newer counts
// with its own live brokers: placement only spreads copies by them, and
// what a placement commits is guarded by the brokers' keys, not by the
// counts.
func (l *loads) of(snap *state.Snapshot) placement.Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.base == nil:
		l.count(snap)
	case snap.Rev > l.base.Rev:
		if !l.advance(snap) {
			l.count(snap)
		}
	}
	return placement.Load{Live: snap.LiveBrokers(), Copies: maps.Clone(l.copies), Owned: maps.Clone(l.owned), Zone: snap.Zones(), Draining: transition.DrainingOf(snap)}
}

// count counts snap whole.
func (l *loads) count(snap *state.Snapshot) {
	load := transition.LoadOf(snap)
	l.base, l.copies, l.owned = snap, load.Copies, load.Owned
}

// advance moves the counts from base to snap, a newer snapshot of the same
// etcd: an assignment whose mod revision is at most base's revision is the
// one base holds, so only those past it are counted (the value base held
// taken off first). It reports false when an assignment of base is gone
// from snap (deleted): finding which would take a walk over base, and a
// recount is as cheap.
func (l *loads) advance(snap *state.Snapshot) bool {
	base := l.base
	kept := 0
	for name, a := range snap.Assignments {
		if a.ModRev <= base.Rev {
			kept++
			continue
		}
		if old, ok := base.Assignments[name]; ok {
			kept++
			tally(l.copies, l.owned, old.Value, -1)
		}
		tally(l.copies, l.owned, a.Value, 1)
	}
	if kept != len(base.Assignments) {
		return false
	}
	// A count that went to zero is dropped, as LoadOf never lists one.
	maps.DeleteFunc(l.copies, func(_ string, n int) bool { return n == 0 })
	maps.DeleteFunc(l.owned, func(_ string, n int) bool { return n == 0 })
	l.base = snap
	return true
}

// tally adds d to the counts of a's members, as Snapshot.CopyCounts counts
// them.
func tally(copies, owned map[string]int, a cluster.Assignment, d int) {
	owned[a.Owner] += d
	copies[a.Owner] += d
	for _, f := range a.Followers {
		copies[f] += d
	}
}
