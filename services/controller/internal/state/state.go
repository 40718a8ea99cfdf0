// Package state reads the controller's view of the cluster from etcd: every
// key under the schema's prefix at one revision, decoded, with the mod
// revisions guarded writes compare. Load reads it whole; a View keeps it
// from one load and the watch after it.
package state

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
	// Heartbeats are each broker's heartbeat shards, with their mod
	// revisions (HeardSince).
	Heartbeats  map[string]*Heartbeat
	Streams     map[string]Versioned[cluster.StreamSpec]
	Assignments map[string]Versioned[cluster.Assignment]
	Recoveries  map[string]Versioned[cluster.Recovery]
	History     map[string]Versioned[cluster.HistoryStarts]
	// Refusals are the seal refusals the recoverer recorded next to
	// pending recoveries.
	Refusals map[string]Versioned[cluster.SealRefusals]
	// Draining are the brokers an operator drains, by node.
	Draining map[string]Versioned[cluster.Drain]
	// Corrupt lists keys whose values could not be decoded; they are
	// skipped rather than failing every read.
	Corrupt []string
}

// Load reads everything under the schema's prefix in one range request, so
// the snapshot is consistent.
func Load(ctx context.Context, cli *clientv3.Client, s cluster.Schema) (*Snapshot, error) {
	return LoadAt(ctx, cli, s, 0)
}

// LoadAt reads everything under the schema's prefix as of revision rev (the
// current revision when rev is 0).
func LoadAt(ctx context.Context, cli *clientv3.Client, s cluster.Schema, rev int64) (*Snapshot, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := cli.Get(ctx, s.Prefix()+"/", opts...)
	if err != nil {
		return nil, fmt.Errorf("state: read %s: %w", s.Prefix(), err)
	}
	snap := empty()
	// A read at an older revision answers with the current revision in
	// its header; the snapshot is of the revision asked for.
	snap.Rev = resp.Header.Revision
	if rev > 0 {
		snap.Rev = rev
	}
	for _, kv := range resp.Kvs {
		snap.apply(s, string(kv.Key), kv, ownAll, nil)
	}
	return snap, nil
}

// ownAll is apply's own for a snapshot nothing else shares.
func ownAll(part) {}

func empty() *Snapshot {
	return &Snapshot{
		Brokers:     map[string]cluster.BrokerInfo{},
		Heartbeats:  map[string]*Heartbeat{},
		Streams:     map[string]Versioned[cluster.StreamSpec]{},
		Assignments: map[string]Versioned[cluster.Assignment]{},
		Recoveries:  map[string]Versioned[cluster.Recovery]{},
		History:     map[string]Versioned[cluster.HistoryStarts]{},
		Refusals:    map[string]Versioned[cluster.SealRefusals]{},
		Draining:    map[string]Versioned[cluster.Drain]{},
	}
}

// part names the pieces of a Snapshot one key can change: the view copies
// only the pieces an event changes, and only once after it handed out a
// snapshot sharing them.
type part uint16

const (
	partBrokers part = 1 << iota
	partHeartbeats
	partStreams
	partAssignments
	partRecoveries
	partHistory
	partRefusals
	partDraining
	partCorrupt

	partNone part = 0
	partAll       = partCorrupt<<1 - 1
)

// apply sets key to kv's value in snap, or removes it when kv is nil (a
// delete). It is the one decoding of a stored key-value, shared by Load and
// the view's watch, so the snapshot the view keeps from events is the one a
// Load at the same revision reads. own is called with the parts apply is
// about to change before it changes them (the view copies a part it shares
// with a published snapshot then). Values are replaced, never changed in
// place: published snapshots share them. cs, when not nil, is told which
// streams the change may concern (changeSet).
func (snap *Snapshot) apply(s cluster.Schema, key string, kv *mvccpb.KeyValue, own func(part), cs *changeSet) {
	p, dir := partOf(s, key)
	if p == partNone {
		// Election keys and anything else under the prefix are not state.
		return
	}
	own(p)
	if p != partHeartbeats && p != partBrokers {
		// Every other directory's keys are named by their stream.
		if name, err := cluster.NameIn(dir, key); err == nil {
			cs.add(name)
		}
	}
	var err error
	switch p {
	case partHeartbeats:
		err = snap.applyHeartbeat(s, key, kv, cs)
	case partBrokers:
		// A broker coming or going concerns every stream it holds a copy
		// of and every one short of copies: all of them.
		cs.addAll()
		err = applyIn(snap.Brokers, dir, key, kv, plain[cluster.BrokerInfo])
	case partStreams:
		err = applyIn(snap.Streams, dir, key, kv, versioned[cluster.StreamSpec])
	case partAssignments:
		err = applyIn(snap.Assignments, dir, key, kv, versioned[cluster.Assignment])
	case partRecoveries:
		err = applyIn(snap.Recoveries, dir, key, kv, versioned[cluster.Recovery])
	case partHistory:
		err = applyIn(snap.History, dir, key, kv, versioned[cluster.HistoryStarts])
	case partRefusals:
		err = applyIn(snap.Refusals, dir, key, kv, versioned[cluster.SealRefusals])
	case partDraining:
		err = applyIn(snap.Draining, dir, key, kv, versioned[cluster.Drain])
	}
	// A delete takes a key off Corrupt whatever its name: a Load would not
	// list it.
	snap.markCorrupt(key, kv != nil && err != nil, own)
}

// partOf returns the part key belongs to and its directory.
func partOf(s cluster.Schema, key string) (part, string) {
	for _, d := range [...]struct {
		dir string
		p   part
	}{
		{s.HeartbeatsDir(), partHeartbeats},
		{s.BrokersDir(), partBrokers},
		{s.StreamsDir(), partStreams},
		{s.AssignmentsDir(), partAssignments},
		{s.RecoveriesDir(), partRecoveries},
		{s.HistoryDir(), partHistory},
		{s.RefusalsDir(), partRefusals},
		{s.DrainingDir(), partDraining},
	} {
		if strings.HasPrefix(key, d.dir) {
			return d.p, d.dir
		}
	}
	return partNone, ""
}

func plain[T any](v T, _ int64) T { return v }

func versioned[T any](v T, rev int64) Versioned[T] { return Versioned[T]{Value: v, ModRev: rev} }

// applyIn sets or removes the entry of m that key, directly under dir,
// names. A value that cannot be decoded removes the entry (a Load would not
// have it) and is reported.
func applyIn[T, V any](m map[string]V, dir, key string, kv *mvccpb.KeyValue, wrap func(T, int64) V) error {
	name, err := cluster.NameIn(dir, key)
	if err != nil {
		return err
	}
	if kv == nil {
		delete(m, name)
		return nil
	}
	v, err := cluster.Decode[T](kv.Value)
	if err != nil {
		delete(m, name)
		return err
	}
	m[name] = wrap(v, kv.ModRevision)
	return nil
}

// markCorrupt lists key in Corrupt or takes it off, keeping Corrupt sorted
// (the order a range read lists keys in) and nil when empty, as Load
// leaves it.
func (snap *Snapshot) markCorrupt(key string, corrupt bool, own func(part)) {
	i, found := slices.BinarySearch(snap.Corrupt, key)
	if corrupt == found {
		return
	}
	own(partCorrupt)
	if corrupt {
		snap.Corrupt = slices.Insert(snap.Corrupt, i, key)
		return
	}
	snap.Corrupt = slices.Delete(snap.Corrupt, i, i+1)
	if len(snap.Corrupt) == 0 {
		snap.Corrupt = nil
	}
}

// unshare replaces the parts p of snap with copies, so changing them does
// not change a snapshot published earlier that shares them.
func (snap *Snapshot) unshare(p part) {
	if p&partBrokers != 0 {
		snap.Brokers = maps.Clone(snap.Brokers)
	}
	if p&partHeartbeats != 0 {
		snap.Heartbeats = maps.Clone(snap.Heartbeats)
	}
	if p&partStreams != 0 {
		snap.Streams = maps.Clone(snap.Streams)
	}
	if p&partAssignments != 0 {
		snap.Assignments = maps.Clone(snap.Assignments)
	}
	if p&partRecoveries != 0 {
		snap.Recoveries = maps.Clone(snap.Recoveries)
	}
	if p&partHistory != 0 {
		snap.History = maps.Clone(snap.History)
	}
	if p&partRefusals != 0 {
		snap.Refusals = maps.Clone(snap.Refusals)
	}
	if p&partDraining != 0 {
		snap.Draining = maps.Clone(snap.Draining)
	}
	if p&partCorrupt != 0 {
		snap.Corrupt = slices.Clone(snap.Corrupt)
	}
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
	return s.Heartbeats[node].heardSince(stream, rev)
}

// Zones returns each live broker's zone, nil when no broker has one (a
// cluster without zones is placed by load alone).
func (s *Snapshot) Zones() map[string]string {
	var out map[string]string
	for n, info := range s.Brokers {
		if info.Zone == "" {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(s.Brokers))
		}
		out[n] = info.Zone
	}
	return out
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

// IsDraining reports whether an operator drains node.
func (s *Snapshot) IsDraining(node string) bool {
	_, ok := s.Draining[node]
	return ok
}

// Tails returns the tails node last published for stream, if its heartbeat
// is present and names the stream.
//
// A status of another incarnation than the stream's assignment is not the
// stream's: it is of a deleted stream of the same name, whose copy the
// broker held when it wrote the value (cluster.CopyTails.Incarnation). Read
// as the new stream's, its epoch, seal or suspect could fail the new
// stream over, or its tails could pass for a copy the new stream has.
func (s *Snapshot) Tails(node, stream string) (cluster.CopyTails, bool) {
	t, ok := s.Heartbeats[node].Tails(stream)
	if !ok {
		return cluster.CopyTails{}, false
	}
	if a, assigned := s.Assignments[stream]; assigned && !t.OfIncarnation(a.Value.Incarnation) {
		return cluster.CopyTails{}, false
	}
	return t, true
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
