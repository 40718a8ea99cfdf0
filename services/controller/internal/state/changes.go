package state

import "slices"

// changeSet gathers the streams a run of changes to a snapshot may concern:
// a key named by a stream (its spec, assignment, recovery, history starts,
// refusals), a copy status a heartbeat shard added, changed or dropped, or,
// for a broker key or a full load, every stream (all). A nil changeSet
// takes nothing, which is what Load uses.
//
// Each stream is marked with whether any of its changes was more than a
// copy's progress (cluster.CopyTails.SameStatus): under publish load every
// copy's tails move, and each tails pass of its broker rewrites its
// status, so nearly every stream changes at every heartbeat interval while
// nothing the liveness loop decides on does (Changes.Take's status).
type changeSet struct {
	all bool
	// streams maps each stream changed to whether a change of it was
	// more than progress.
	streams map[string]bool
}

// maxChangedStreams bounds a change set: past it, the set is taken for
// every stream, which a reader passes over anyway at that size.
const maxChangedStreams = 1 << 16

// add adds a change of stream that may be more than progress.
func (cs *changeSet) add(stream string) { cs.note(stream, true) }

// addProgress adds a change of stream that only moved a copy's progress.
func (cs *changeSet) addProgress(stream string) { cs.note(stream, false) }

func (cs *changeSet) note(stream string, status bool) {
	if cs == nil || cs.all {
		return
	}
	if cs.streams == nil {
		cs.streams = map[string]bool{}
	}
	cs.streams[stream] = cs.streams[stream] || status
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
	for s, status := range o.streams {
		cs.note(s, status)
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
//
// status is the part of changed with a change that was more than a copy's
// progress: a key of the stream's own, or a copy status that came, went,
// or changed other than in its progress (cluster.CopyTails.SameStatus). A
// reader whose judgement of a stream reads no copy's progress (the
// liveness loop's) need only look again at those.
func (c *Changes) Take() (snap *Snapshot, changed, status []string, all bool, next <-chan struct{}) {
	v := c.v
	v.mu.Lock()
	defer v.mu.Unlock()
	snap = v.snapshotLocked()
	if snap == nil {
		return nil, nil, nil, true, v.changed
	}
	all = c.pending.all
	if !all {
		changed = make([]string, 0, len(c.pending.streams))
		for s, st := range c.pending.streams {
			changed = append(changed, s)
			if st {
				status = append(status, s)
			}
		}
		slices.Sort(changed)
		slices.Sort(status)
	}
	c.pending = changeSet{}
	return snap, changed, status, all, v.changed
}
