package attention

import (
	"slices"
	"sync"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// maxLeft bounds the left-out copies Memory keeps per stream: more than a
// stream can have copies missing.
const maxLeft = 8

// Memory is what the controller remembers between snapshots, which hold
// the cluster only as it is now: since when each copy has been out of
// sync, since when each member has been missing (its broker not live: the
// clock of its replacement), and which members a change of assignment left
// out. A recovery that
// drops a dead owner writes an assignment without it, and nothing in etcd
// names it afterwards; the copy it leaves missing is named from here.
//
// The leader's liveness pass keeps it (Observe); the admin service reads
// it. It lives in memory only: a controller that takes over starts afresh,
// so its "since" reads from its first pass, and a copy left out before it
// led is counted as missing without a name. Safe for concurrent use; a nil
// *Memory remembers nothing.
type Memory struct {
	mu      sync.RWMutex
	streams map[string]*memo
	// last is the snapshot last observed and sum what it counted: the
	// view hands out the same snapshot while nothing changed, and a pass
	// on a resync tick then costs nothing here.
	last *state.Snapshot
	sum  Summary
	// under counts the streams whose memo is under.
	under int
	// replaceAfter is the controller's --replace-after, for attention to
	// say when a missing member is replaced.
	replaceAfter time.Duration
}

// memo is what Memory keeps of one stream (one incarnation of its name).
type memo struct {
	incarnation string
	// owner and followers are the membership last observed ("" before
	// the first).
	owner     string
	followers []string
	// since is when each member was first seen out of sync.
	since map[string]time.Time
	// missing is when each member was first seen missing, its broker not
	// live: the clock of its replacement (--replace-after).
	missing map[string]time.Time
	// left lists members a change of assignment left out, oldest first.
	left []Left
	// under is set when the stream had fewer live, in-sync copies than
	// its copies E when last judged.
	under bool
}

// Left is a member a change of assignment left out.
type Left struct {
	Node string
	// Role is the one it had in the assignment that left it out.
	Role string
	// Epoch is the epoch of the assignment that left it out.
	Epoch uint64
	// Since is when it was first seen out of sync: before it was left out
	// when it was seen down as a member, else when it was left out.
	Since time.Time
}

// NewMemory returns an empty memory.
func NewMemory() *Memory { return &Memory{streams: map[string]*memo{}} }

// Reset forgets everything: a controller that leads again did not watch
// the cluster meanwhile.
func (m *Memory) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.streams)
	m.last, m.under = nil, 0
}

// Summary is what one Observe counted.
type Summary struct {
	Streams           int
	UnderReplicated   int
	PendingRecoveries int
}

// Observe takes in a snapshot seen at now: members gone from a stream's
// assignment since the last snapshot are remembered as left out (until an
// assignment includes them again), and each member out of sync gets the
// time it was first seen so. It costs a walk over every copy of every
// assignment, and returns the counts the controller's metrics show.
func (m *Memory) Observe(s *state.Snapshot, now time.Time) Summary {
	return m.ObserveChanged(s, nil, true, now)
}

// ObserveChanged is Observe told which streams may have changed since the
// snapshot observed before (state.Changes.Take): only those are judged
// again, or every stream when all is set or nothing was observed before.
// What Observe remembers of a stream depends on the stream's own keys and
// on which brokers are live alone (a broker coming or going makes all
// set), so this takes in the same as a walk over every stream, for the
// cost of the streams changed: at 10,000 streams a walk per liveness pass
// was most of the controller's work while streams were created
// (docs/architecture.md, "Coordination only through etcd"). The snapshots observed
// must be the ones the changes were taken with, in order.
func (m *Memory) ObserveChanged(s *state.Snapshot, changed []string, all bool, now time.Time) Summary {
	if m == nil {
		return Summary{Streams: len(s.Assignments), PendingRecoveries: len(s.Recoveries)}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s == m.last {
		return m.sum
	}
	if all || m.last == nil {
		for name := range m.streams {
			if _, ok := s.Assignments[name]; !ok {
				m.observe(s, name, now)
			}
		}
		for name := range s.Assignments {
			m.observe(s, name, now)
		}
	} else {
		for _, name := range changed {
			m.observe(s, name, now)
		}
	}
	m.last = s
	m.sum = Summary{Streams: len(s.Assignments), UnderReplicated: m.under, PendingRecoveries: len(s.Recoveries)}
	return m.sum
}

// observe judges stream in s again, keeping the count of under-replicated
// streams (m.under) in step; a stream without an assignment is forgotten.
func (m *Memory) observe(s *state.Snapshot, name string, now time.Time) {
	mo := m.streams[name]
	if mo != nil && mo.under {
		m.under--
	}
	av, ok := s.Assignments[name]
	if !ok {
		delete(m.streams, name)
		return
	}
	a := av.Value
	if mo == nil || mo.incarnation != a.Incarnation {
		mo = &memo{incarnation: a.Incarnation}
		m.streams[name] = mo
	}
	if mo.owner != a.Owner || !slices.Equal(mo.followers, a.Followers) {
		mo.changed(a, now)
	}
	// Judged member by member, as JudgeReplication does, without
	// building its lists: this runs over every copy of every stream
	// changed.
	owner, ownerOK := s.Tails(a.Owner, name)
	inSync := 0
	for i := range a.Copies() {
		node := a.Owner
		if i > 0 {
			node = a.Followers[i-1]
		}
		if s.Live(node) {
			delete(mo.missing, node)
		} else if _, ok := mo.missing[node]; !ok {
			if mo.missing == nil {
				mo.missing = map[string]time.Time{}
			}
			mo.missing[node] = now
		}
		if judgeMember(s, a, node, owner, ownerOK).State == InSync {
			inSync++
			delete(mo.since, node)
			continue
		}
		if _, ok := mo.since[node]; !ok {
			if mo.since == nil {
				mo.since = map[string]time.Time{}
			}
			mo.since[node] = now
		}
	}
	copies := a.Copies()
	if spec, ok := s.Streams[name]; ok {
		copies = spec.Value.Copies
	}
	mo.under = (Replication{Copies: copies, InSync: inSync}).Under()
	if mo.under {
		m.under++
	}
}

// changed takes in a new membership of the stream: members gone from it
// are remembered as left out (replacing an earlier record of the same
// node), members back in it are no longer.
func (mo *memo) changed(a cluster.Assignment, now time.Time) {
	gone := func(node string) {
		if a.Includes(node) {
			return
		}
		l := Left{Node: node, Role: roleIn(mo.owner, node), Epoch: a.Epoch, Since: mo.since[node]}
		if l.Since.IsZero() {
			l.Since = now
		}
		mo.left = append(slices.DeleteFunc(mo.left, func(x Left) bool { return x.Node == node }), l)
		delete(mo.since, node)
		delete(mo.missing, node)
	}
	if mo.owner != "" {
		gone(mo.owner)
		for _, f := range mo.followers {
			gone(f)
		}
	}
	mo.left = slices.DeleteFunc(mo.left, func(x Left) bool { return a.Includes(x.Node) })
	if len(mo.left) > maxLeft {
		mo.left = slices.Delete(mo.left, 0, len(mo.left)-maxLeft)
	}
	mo.owner, mo.followers = a.Owner, slices.Clone(a.Followers)
}

func roleIn(owner, node string) string {
	if node == owner {
		return cluster.RoleOwner
	}
	return cluster.RoleFollower
}

// since returns when node was first seen out of sync in stream, zero when
// not known.
func (m *Memory) since(stream, incarnation, node string) time.Time {
	if m == nil {
		return time.Time{}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	mo := m.streams[stream]
	if mo == nil || mo.incarnation != incarnation {
		return time.Time{}
	}
	return mo.since[node]
}

// MissingSince returns when node, a member of stream's assignment of
// incarnation, was first seen missing (its broker not live) and has been
// since; zero when it is not missing or the controller has not seen it so.
// It is the clock of the member's replacement (--replace-after). It starts
// at this controller's first pass that saw it: a controller that takes
// over starts it again, which only delays a replacement, never hastens one.
func (m *Memory) MissingSince(stream, incarnation, node string) time.Time {
	if m == nil {
		return time.Time{}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	mo := m.streams[stream]
	if mo == nil || mo.incarnation != incarnation {
		return time.Time{}
	}
	return mo.missing[node]
}

// SetReplaceAfter sets the replace-after window attention reports
// replacements by (default transition.DefaultReplaceAfter).
func (m *Memory) SetReplaceAfter(d time.Duration) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.replaceAfter = d
}

func (m *Memory) replaceWindow() time.Duration {
	if m == nil {
		return 0
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.replaceAfter
}

// left returns the copies a change of a's stream's assignment left out and
// a does not include, oldest first.
func (m *Memory) left(stream string, a cluster.Assignment) []Left {
	if m == nil {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	mo := m.streams[stream]
	if mo == nil || mo.incarnation != a.Incarnation {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(mo.left), func(x Left) bool { return a.Includes(x.Node) })
}
