package state

import "slices"

// changeSet gathers the streams a run of changes to a snapshot may concern:
// a key named by a stream (its spec, assignment, recovery, history starts,
// refusals), a copy status a heartbeat shard added, changed or dropped, or,
// for a broker key or a full load, every stream (all). A nil changeSet
// takes nothing, which is what Load uses.
type changeSet struct {
	all     bool
	streams map[string]struct{}
}

// maxChangedStreams bounds a change set: past it, the set is taken for
// every stream, which a reader passes over anyway at that size.
const maxChangedStreams = 1 << 16

func (cs *changeSet) add(stream string) {
	if cs == nil || cs.all {
		return
	}
	if cs.streams == nil {
		cs.streams = map[string]struct{}{}
	}
	cs.streams[stream] = struct{}{}
	if len(cs.streams) > maxChangedStreams {
		cs.addAll()
	}
}

// merge adds what o holds to cs.
func (cs *changeSet) merge(o *changeSet) {
	if o.all {
		cs.addAll()
		return
	}
	for s := range o.streams {
		cs.add(s)
	}
}

func (cs *changeSet) addAll() {
	if cs == nil {
		return
	}
	cs.all, cs.streams = true, nil
}

// Changes follows what changed in a View between the snapshots its reader
// takes (View.Track): a reader that acts on each stream of a snapshot, as
// the liveness loop does, need only look again at the streams whose keys
// changed since its last one, not at every stream of the cluster.
type Changes struct {
	v *View
	// pending is guarded by v.mu: the view adds to it with every change it
	// applies, under the same lock that changes its snapshot.
	pending changeSet
}

// Track returns a follower of the view's changes. Its first Take reports
// every stream.
func (v *View) Track() *Changes {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := &Changes{v: v, pending: changeSet{all: true}}
	v.trackers = append(v.trackers, c)
	return c
}

// Take returns the view's snapshot (nil before the first load), the
// streams that may have changed since the previous Take, in order, or all
// when that cannot be told (a broker came or went, the view loaded again,
// or this is the first Take), and a channel closed once the view holds a
// newer snapshot. The snapshot and the changes are taken together: every
// change the snapshot holds and no earlier Take reported is in changed.
func (c *Changes) Take() (snap *Snapshot, changed []string, all bool, next <-chan struct{}) {
	v := c.v
	v.mu.Lock()
	defer v.mu.Unlock()
	snap = v.snapshotLocked()
	if snap == nil {
		return nil, nil, true, v.changed
	}
	all = c.pending.all
	if !all {
		changed = make([]string, 0, len(c.pending.streams))
		for s := range c.pending.streams {
			changed = append(changed, s)
		}
		slices.Sort(changed)
	}
	c.pending = changeSet{}
	return snap, changed, all, v.changed
}
