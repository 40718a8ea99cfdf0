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
	Rev        int64
	Brokers    map[string]cluster.BrokerInfo
	Heartbeats map[string]cluster.Heartbeat
	// HeartbeatRev is the mod revision of each broker's heartbeat: a broker
	// heard since a revision has written after it, so it is running; a
	// killed broker's key and heartbeat outlive it until its lease ends.
	HeartbeatRev map[string]int64
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

		HeartbeatRev: map[string]int64{},
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if node, err := cluster.NameIn(s.HeartbeatsDir(), key); err == nil {
			snap.HeartbeatRev[node] = kv.ModRevision
		}
		var derr error
		switch {
		case decodeInto(s.BrokersDir(), kv, snap.Brokers, &derr, func(v cluster.BrokerInfo) cluster.BrokerInfo { return v }):
		case decodeInto(s.HeartbeatsDir(), kv, snap.Heartbeats, &derr, func(v cluster.Heartbeat) cluster.Heartbeat { return v }):
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

// HeardSince reports whether node wrote a heartbeat after revision rev.
func (s *Snapshot) HeardSince(node string, rev int64) bool {
	return s.HeartbeatRev[node] > rev
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
