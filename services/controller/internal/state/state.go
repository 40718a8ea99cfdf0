// Package state reads the controller's view of the cluster from etcd: every
// key under the schema's prefix at one revision, decoded, with the mod
// revisions guarded writes compare.
package state

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// Versioned is a decoded value with the mod revision it was read at.
type Versioned[T any] struct {
	Value  T
	ModRev int64
}

// Snapshot is the coordination state at one etcd revision.
type Snapshot struct {
	Rev     int64
	Brokers map[string]cluster.BrokerInfo
	// Heartbeats are each broker's heartbeat shards merged into one.
	Heartbeats map[string]cluster.Heartbeat
	// HeartbeatRev is the mod revision of each shard of each broker's
	// heartbeat (HeardSince).
	HeartbeatRev map[string]*[cluster.HeartbeatShards]int64
	Streams      map[string]Versioned[cluster.StreamSpec]
	Assignments  map[string]Versioned[cluster.Assignment]
	Recoveries   map[string]Versioned[cluster.Recovery]
	History      map[string]Versioned[cluster.HistoryStarts]
	// Refusals are the seal refusals the recoverer recorded next to
	// pending recoveries.
	Refusals map[string]Versioned[cluster.SealRefusals]
	// Corrupt lists keys whose values could not be decoded; they are
	// skipped rather than failing every read.
	Corrupt []string
}

// Load reads everything under the schema's prefix in one range request, so
// the snapshot is consistent.
func Load(ctx context.Context, cli *clientv3.Client, s cluster.Schema) (*Snapshot, error) {
	resp, err := cli.Get(ctx, s.Prefix()+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("state: read %s: %w", s.Prefix(), err)
	}
	snap := &Snapshot{
		Rev:         resp.Header.Revision,
		Brokers:     map[string]cluster.BrokerInfo{},
		Heartbeats:  map[string]cluster.Heartbeat{},
		Streams:     map[string]Versioned[cluster.StreamSpec]{},
		Assignments: map[string]Versioned[cluster.Assignment]{},
		Recoveries:  map[string]Versioned[cluster.Recovery]{},
		History:     map[string]Versioned[cluster.HistoryStarts]{},
		Refusals:    map[string]Versioned[cluster.SealRefusals]{},

		HeartbeatRev: map[string]*[cluster.HeartbeatShards]int64{},
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		var derr error
		switch {
		case decodeInto(s.BrokersDir(), kv, snap.Brokers, &derr, func(v cluster.BrokerInfo) cluster.BrokerInfo { return v }):
		case strings.HasPrefix(key, s.HeartbeatsDir()):
			derr = snap.decodeHeartbeat(s, key, kv.Value, kv.ModRevision)
		case decodeInto(s.StreamsDir(), kv, snap.Streams, &derr, versioned[cluster.StreamSpec](kv.ModRevision)):
		case decodeInto(s.AssignmentsDir(), kv, snap.Assignments, &derr, versioned[cluster.Assignment](kv.ModRevision)):
		case decodeInto(s.RecoveriesDir(), kv, snap.Recoveries, &derr, versioned[cluster.Recovery](kv.ModRevision)):
		case decodeInto(s.HistoryDir(), kv, snap.History, &derr, versioned[cluster.HistoryStarts](kv.ModRevision)):
		case decodeInto(s.RefusalsDir(), kv, snap.Refusals, &derr, versioned[cluster.SealRefusals](kv.ModRevision)):
		}
		if derr != nil {
			snap.Corrupt = append(snap.Corrupt, key)
		}
	}
	return snap, nil
}

// decodeHeartbeat sets one heartbeat shard in the snapshot: its statuses
// into the broker's merged Heartbeat, in place of what an earlier value of
// the same shard put there, and its mod revision into the broker's
// HeartbeatRev. It is the one place a heartbeat key and value are read.
func (snap *Snapshot) decodeHeartbeat(s cluster.Schema, key string, value []byte, modRev int64) error {
	node, shard, err := s.ParseHeartbeatKey(key)
	if err != nil {
		return err
	}
	v, err := cluster.Decode[cluster.Heartbeat](value)
	if err != nil {
		return err
	}
	hb, ok := snap.Heartbeats[node]
	if !ok {
		hb = cluster.Heartbeat{Node: node, Time: v.Time, Streams: make(map[string]cluster.CopyTails, len(v.Streams))}
	}
	if revs := snap.HeartbeatRev[node]; revs != nil && revs[shard] != 0 {
		// A newer value of a shard already taken: its copies replace the
		// old value's, which a copy gone since would outlive.
		for stream := range hb.Streams {
			if cluster.HeartbeatShard(stream) == shard {
				delete(hb.Streams, stream)
			}
		}
	}
	for stream, t := range v.Streams {
		// A stream in a shard it does not hash to is not where readers
		// look for it (a broker with another shard count); it is taken
		// all the same, since it is the broker's word on its copy.
		hb.Streams[stream] = t
	}
	if v.Time.After(hb.Time) {
		hb.Time = v.Time
	}
	snap.Heartbeats[node] = hb
	revs := snap.HeartbeatRev[node]
	if revs == nil {
		revs = new([cluster.HeartbeatShards]int64)
		snap.HeartbeatRev[node] = revs
	}
	revs[shard] = modRev
	return nil
}

func versioned[T any](rev int64) func(T) Versioned[T] {
	return func(v T) Versioned[T] { return Versioned[T]{Value: v, ModRev: rev} }
}

// decodeInto decodes kv into m when its key is directly under dir; it
// reports whether the key belonged to dir.
func decodeInto[T, V any](dir string, kv interface {
	GetKey() []byte
	GetValue() []byte
}, m map[string]V, derr *error, wrap func(T) V) bool {
	key := string(kv.GetKey())
	if !strings.HasPrefix(key, dir) {
		return false
	}
	name, err := cluster.NameIn(dir, key)
	if err != nil {
		*derr = err
		return true
	}
	v, err := cluster.Decode[T](kv.GetValue())
	if err != nil {
		*derr = err
		return true
	}
	m[name] = wrap(v)
	return true
}

// Live reports whether node's broker key is present.
func (s *Snapshot) Live(node string) bool {
	_, ok := s.Brokers[node]
	return ok
}

// HeardSince reports whether node wrote the heartbeat shard that carries
// stream after revision rev: the broker was running after rev, and, when
// rev is the mod revision of stream's assignment, it has taken that
// assignment in (applied it, or found its copy left out of it).
//
// Brokers write on change, not on a clock, so a broker's last write can be
// long before any given revision; what ties a write to an assignment is
// that every broker holding a copy of a stream writes the stream's shard
// when its copy takes in a new assignment, even if the copy's status reads
// the same (replica.Manager.TakeTakenIn). A broker that was killed and
// whose lease has not ended yet cannot, so a killed owner is not taken for
// a copy that is back. A broker that holds no copy of stream gives no such
// evidence: HeardSince is false for it.
func (s *Snapshot) HeardSince(node, stream string, rev int64) bool {
	revs := s.HeartbeatRev[node]
	if revs == nil {
		return false
	}
	if _, ok := s.Heartbeats[node].Streams[stream]; !ok {
		return false
	}
	return revs[cluster.HeartbeatShard(stream)] > rev
}

// LiveBrokers returns the live broker ids in order.
func (s *Snapshot) LiveBrokers() []string {
	out := make([]string, 0, len(s.Brokers))
	for n := range s.Brokers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Tails returns the tails node last published for stream, if its heartbeat
// is present and names the stream.
func (s *Snapshot) Tails(node, stream string) (cluster.CopyTails, bool) {
	hb, ok := s.Heartbeats[node]
	if !ok {
		return cluster.CopyTails{}, false
	}
	t, ok := hb.Streams[stream]
	return t, ok
}

// CopyCounts returns how many copies each node holds across assignments,
// and how many streams it owns.
func (s *Snapshot) CopyCounts() (copies, owned map[string]int) {
	copies, owned = map[string]int{}, map[string]int{}
	for _, a := range s.Assignments {
		owned[a.Value.Owner]++
		for _, m := range a.Value.Members() {
			copies[m]++
		}
	}
	return copies, owned
}

// StreamNames returns every stream with a spec or an assignment, in order.
func (s *Snapshot) StreamNames() []string {
	var out []string
	for n := range s.Streams {
		out = append(out, n)
	}
	for n := range s.Assignments {
		if _, ok := s.Streams[n]; !ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
