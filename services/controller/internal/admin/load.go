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
	// placed are the placements creations chose that base does not hold
	// yet, counted on top of it: concurrent creations would otherwise all
	// see the same counts and put their owners on the same broker, and the
	// owner balancing would then hand streams over a minute later, on a
	// cluster with nothing to do (docs/operating.md, "Balanced owners").
	placed map[*placed]struct{}
}

// placed is one creation's placement, counted until a snapshot holds it.
type placed struct {
	stream    string
	owner     string
	followers []string
	// committed is the revision of the creation's transaction (0 until
	// it committed).
	committed int64
}

// place chooses a new stream's owner and followers (placement.Place) on
// snap's load with the placements of creations still in flight counted,
// and counts this one too until done is called, all under one lock so two
// creations never choose on the same counts. done takes the revision the
// creation committed at: the placement is then counted until a snapshot
// at or past it holds it (or its deletion); 0 (the transaction failed or
// lost its compare) forgets it at once.
func (l *loads) place(snap *state.Snapshot, stream string, copies int) (owner string, followers []string, done func(committed int64), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	owner, followers, err = placement.Place(l.ofLocked(snap), copies)
	if err != nil {
		return "", nil, nil, err
	}
	p := &placed{stream: stream, owner: owner, followers: followers}
	if l.placed == nil {
		l.placed = map[*placed]struct{}{}
	}
	l.placed[p] = struct{}{}
	return owner, followers, func(committed int64) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if committed == 0 || l.base.Rev >= committed {
			delete(l.placed, p)
			return
		}
		p.committed = committed
	}, nil
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
	return l.ofLocked(snap)
}

// ofLocked is of with l.mu held, with the placements of creations in
// flight (place) counted on top.
func (l *loads) ofLocked(snap *state.Snapshot) placement.Load {
	switch {
	case l.base == nil:
		l.count(snap)
	case snap.Rev > l.base.Rev:
		if !l.advance(snap) {
			l.count(snap)
		}
	}
	copies, owned := maps.Clone(l.copies), maps.Clone(l.owned)
	for p := range l.placed {
		if p.committed != 0 && l.base.Rev >= p.committed {
			delete(l.placed, p) // the snapshot holds it now
			continue
		}
		if _, held := l.base.Assignments[p.stream]; held {
			// The creation committed and the snapshot holds it before its
			// call learned its revision (or another creation of the name
			// won, and this one will fail): counted by the snapshot, so
			// not again. Counted twice, it skewed the next choice, and
			// concurrent creations ended two apart.
			continue
		}
		tally(copies, owned, cluster.Assignment{Owner: p.owner, Followers: p.followers}, 1)
	}
	return placement.Load{Live: snap.LiveBrokers(), Copies: copies, Owned: owned, Zone: snap.Zones(), Draining: transition.DrainingOf(snap)}
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
