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
// holds is never changed: a change makes a new one that shares the
// unchanged shards.
type Heartbeat struct {
	// shards is what each shard key holds (nil: absent, or a value that
	// could not be decoded).
	shards [cluster.HeartbeatShards]map[string]cluster.CopyTails
	// revs is the mod revision of each shard key (0: absent).
	revs [cluster.HeartbeatShards]int64
	// foreign counts, per shard, the streams its value names that hash to
	// another shard (a broker with another shard count); looking a stream
	// up searches the other shards only while some are.
	foreign    [cluster.HeartbeatShards]int32
	anyForeign int
}

// Tails returns the copy status the heartbeat names for stream. A stream is
// looked for in the shard it hashes to; one named by another shard's
// value (a broker with another shard count) is taken all the same, as the
// broker's word on its copy, from the lowest such shard: the answer
// depends on what the shards hold, not on the order they were read in, so
// the view and a full load agree.
func (h *Heartbeat) Tails(stream string) (cluster.CopyTails, bool) {
	if h == nil {
		return cluster.CopyTails{}, false
	}
	shard := cluster.HeartbeatShard(stream)
	if t, ok := h.shards[shard][stream]; ok {
		return t, true
	}
	if h.anyForeign > 0 {
		for i, m := range h.shards {
			if i == shard || h.foreign[i] == 0 {
				continue
			}
			if t, ok := m[stream]; ok {
				return t, true
			}
		}
	}
	return cluster.CopyTails{}, false
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
	return h.revs[shard]
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
// different) go to cs.
func (snap *Snapshot) applyHeartbeat(s cluster.Schema, key string, kv *mvccpb.KeyValue, cs *changeSet) error {
	node, shard, err := s.ParseHeartbeatKey(key)
	if err != nil {
		return err
	}
	hb := new(Heartbeat)
	if old := snap.Heartbeats[node]; old != nil {
		*hb = *old
	}
	old := hb.shards[shard]
	var streams map[string]cluster.CopyTails
	var derr error
	if kv == nil {
		hb.revs[shard] = 0
	} else {
		hb.revs[shard] = kv.ModRevision
		v, err := cluster.Decode[cluster.Heartbeat](kv.Value)
		if err != nil {
			derr = err
		} else if len(v.Streams) > 0 {
			// The decoded map is this value's own: kept as it is.
			streams = v.Streams
		}
	}
	var foreign int32
	for stream, t := range streams {
		if cluster.HeartbeatShard(stream) != shard {
			foreign++
		}
		if cs != nil {
			if w, ok := old[stream]; !ok || w != t {
				cs.add(stream)
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
	hb.shards[shard] = streams
	hb.anyForeign += int(foreign - hb.foreign[shard])
	hb.foreign[shard] = foreign
	if hb.revs == ([cluster.HeartbeatShards]int64{}) {
		delete(snap.Heartbeats, node)
		return derr
	}
	snap.Heartbeats[node] = hb
	return derr
}
