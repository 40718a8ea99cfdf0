package state

import (
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strandhq/strand/internal/cluster"
)

// Heartbeat is one broker's heartbeat as its shard keys hold it
// (docs/etcd-schema.md): the copy status each shard's value names, and the
// mod revision of each shard key.
//
// It is kept shard by shard rather than merged into one map of every
// stream, so a shard's new value replaces that shard's part alone: with
// every broker holding a copy of each of 10,000 streams, a merged map
// copied on each shard write cost a copy of 10,000 entries per event, and
// the view fell behind etcd while streams were created
// (docs/architecture.md, "Coordination only through etcd"). A Heartbeat a snapshot
// holds is never changed: a change makes a new one, copying the slots
// array (some 3.4 KB) and sharing every unchanged slot's map.
type Heartbeat struct {
	// slots holds each heartbeat key of the broker, by its slot
	// (cluster.HeartbeatSlots: the shards, and the keys brokers with the
	// older shard count wrote).
	slots [cluster.HeartbeatSlots]heartbeatShard
	// present counts the slots whose key is present (rev not 0).
	present int
	// anyForeign counts the streams the slots name that hash to another
	// shard (a broker with another shard count); looking a stream up
	// searches the other slots only while some are.
	anyForeign int
}

// heartbeatShard is one heartbeat key of a broker.
type heartbeatShard struct {
	// streams is what the key holds (nil: absent, or a value that could
	// not be decoded).
	streams map[string]cluster.CopyTails
	// rev is the key's mod revision (0: absent).
	rev int64
	// foreign counts the streams it names that hash to another shard.
	foreign int32
}

// setShard replaces slot i, keeping the counts. h is a copy no snapshot
// holds yet (applyHeartbeat, Builder).
func (h *Heartbeat) setShard(i int, sh heartbeatShard) {
	old := h.slots[i]
	if (old.rev != 0) != (sh.rev != 0) {
		if sh.rev != 0 {
			h.present++
		} else {
			h.present--
		}
	}
	h.anyForeign += int(sh.foreign - old.foreign)
	h.slots[i] = sh
}

// Tails returns the copy status the heartbeat names for stream. A stream is
// looked for in the shard it hashes to; one named by another shard's
// value (a broker with another shard count) is taken all the same, as the
// broker's word on its copy, from the lowest such shard: the answer
// depends on what the shards hold, not on the order they were read in, so
// the view and a full load agree.
func (h *Heartbeat) Tails(stream string) (cluster.CopyTails, bool) {
	t, _, ok := h.find(stream)
	return t, ok
}

// find is Tails, with the slot the status was found in.
func (h *Heartbeat) find(stream string) (cluster.CopyTails, int, bool) {
	if h == nil {
		return cluster.CopyTails{}, 0, false
	}
	shard := cluster.HeartbeatShard(stream)
	if t, ok := h.slots[shard].streams[stream]; ok {
		return t, shard, true
	}
	if h.anyForeign > 0 {
		for i, sh := range h.slots {
			if i == shard || sh.foreign == 0 {
				continue
			}
			if t, ok := sh.streams[stream]; ok {
				return t, i, true
			}
		}
	}
	return cluster.CopyTails{}, 0, false
}

// Holds reports whether the heartbeat names stream.
func (h *Heartbeat) Holds(stream string) bool {
	_, ok := h.Tails(stream)
	return ok
}

// ShardRev returns the mod revision of the heartbeat's shard key shard (0
// when it is absent).
func (h *Heartbeat) ShardRev(shard int) int64 {
	if h == nil {
		return 0
	}
	return h.slots[shard].rev
}

// heardSince reports whether the shard that names stream was written
// after rev: the shard stream hashes to, or, for a broker with another
// shard count, the one that holds it.
func (h *Heartbeat) heardSince(stream string, rev int64) bool {
	_, shard, ok := h.find(stream)
	return ok && h.slots[shard].rev > rev
}

// applyHeartbeat is the heartbeat part of apply, and the one place a
// heartbeat key and value are read: one shard of a broker's heartbeat
// replaces what that shard held, and its mod revision the shard's
// (HeardSince). A delete takes the shard's copies away; the broker's entry
// goes with its last shard. The revision is kept even for a value that
// cannot be decoded, since the broker did write it. A published snapshot
// shares the Heartbeat, so a new one is made.
//
// The streams whose copy status on node the value changes (added, gone or
// different) go to cs, those whose copy only progressed as such.
func (snap *Snapshot) applyHeartbeat(s cluster.Schema, key string, kv *mvccpb.KeyValue, cs *changeSet) error {
	node, slot, err := s.ParseHeartbeatKey(key)
	if err != nil {
		return err
	}
	hb := new(Heartbeat)
	if old := snap.Heartbeats[node]; old != nil {
		*hb = *old
	}
	old := hb.slots[slot].streams
	var streams map[string]cluster.CopyTails
	var derr error
	var rev int64
	if kv != nil {
		rev = kv.ModRevision
		v, err := cluster.DecodeHeartbeat(kv.Value)
		if err != nil {
			derr = err
		} else if len(v.Streams) > 0 {
			// The decoded map is this value's own: kept as it is.
			streams = v.Streams
		}
	}
	var foreign int32
	for stream, t := range streams {
		if cluster.HeartbeatShard(stream) != slot {
			foreign++
		}
		if cs != nil {
			switch w, ok := old[stream]; {
			case !ok || !w.SameStatus(t):
				cs.add(stream)
			case w != t:
				cs.addProgress(stream)
			}
		}
	}
	if cs != nil {
		for stream := range old {
			if _, ok := streams[stream]; !ok {
				cs.add(stream) // gone from the shard
			}
		}
	}
	hb.setShard(slot, heartbeatShard{streams: streams, rev: rev, foreign: foreign})
	if hb.present == 0 {
		delete(snap.Heartbeats, node)
		return derr
	}
	snap.Heartbeats[node] = hb
	return derr
}
