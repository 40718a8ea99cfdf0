package coord

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
)

// statuses is a broker's copy statuses as a test sets them.
type statuses struct {
	mu sync.Mutex
	m  map[string]cluster.CopyTails
	// read counts the statuses all yielded.
	read int
	// gen moves with every set (heartbeats.gen).
	gen uint64
}

func (s *statuses) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// reads is how many statuses all has yielded.
func (s *statuses) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.read
}

func (s *statuses) all(want func(string) bool) iter.Seq2[string, cluster.CopyTails] {
	return func(yield func(string, cluster.CopyTails) bool) {
		for stream, t := range s.get() {
			if want != nil && !want(stream) {
				continue
			}
			s.mu.Lock()
			s.read++
			s.mu.Unlock()
			if !yield(stream, t) {
				return
			}
		}
	}
}

func (s *statuses) get() map[string]cluster.CopyTails {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.m)
}

func (s *statuses) set(stream string, t cluster.CopyTails) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[stream] = t
	s.gen++
}

// setUncounted changes a status without moving the generation: a change
// some path failed to count.
func (s *statuses) setUncounted(stream string, t cluster.CopyTails) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[stream] = t
}

type hbFixture struct {
	t     *testing.T
	cli   *clientv3.Client
	hb    *heartbeats
	st    *statuses
	lease clientv3.LeaseID
}

// newHBFixture is a heartbeat publisher for node b1 on embedded etcd with
// n streams following at epoch 1, and a lease to write under.
func newHBFixture(t *testing.T, n int) *hbFixture {
	t.Helper()
	e := etcdtest.Start(t)
	cli := e.Client(t)
	st := &statuses{m: map[string]cluster.CopyTails{}}
	for i := range n {
		st.m[fmt.Sprintf("s%04d", i)] = cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: uint64(i)}
	}
	f := &hbFixture{t: t, cli: cli, st: st, hb: newHeartbeats(cli, cluster.NewSchema(""), "b1", zerolog.Nop(), st.all, st.generation)}
	f.lease = f.grant()
	return f
}

func (f *hbFixture) grant() clientv3.LeaseID {
	f.t.Helper()
	l, err := f.cli.Grant(context.Background(), 60)
	if err != nil {
		f.t.Fatal(err)
	}
	return l.ID
}

// publish runs one pass and returns how many transactions it wrote and
// how far etcd's revision moved meanwhile.
func (f *hbFixture) publish(mode publishMode) (txns int, revs int64) {
	f.t.Helper()
	before := f.rev()
	txns, err := f.hb.publish(context.Background(), f.lease, mode)
	if err != nil {
		f.t.Fatal(err)
	}
	return txns, f.rev() - before
}

func (f *hbFixture) rev() int64 {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), "/nothing")
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Header.Revision
}

// shardsHolding is how many shards a pass under a new lease writes for
// statuses: those holding a copy, and shard 0.
func shardsHolding(statuses map[string]cluster.CopyTails) int {
	held := map[int]bool{0: true}
	for stream := range statuses {
		held[cluster.HeartbeatShard(stream)] = true
	}
	return len(held)
}

// txnsFor is how many transactions of at most maxOps puts n shards take.
func txnsFor(n, maxOps int) int { return (n + maxOps - 1) / maxOps }

// shardKV is one heartbeat shard as stored.
type shardKV struct {
	hb     cluster.Heartbeat
	modRev int64
	lease  int64
	size   int
}

// shards reads b1's heartbeat shards.
func (f *hbFixture) shards() map[string]shardKV {
	f.t.Helper()
	schema := cluster.NewSchema("")
	resp, err := f.cli.Get(context.Background(), schema.HeartbeatDir("b1"), clientv3.WithPrefix())
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]shardKV{}
	for _, kv := range resp.Kvs {
		hb, err := cluster.Decode[cluster.Heartbeat](kv.Value)
		if err != nil {
			f.t.Fatal(err)
		}
		out[string(kv.Key)] = shardKV{hb: hb, modRev: kv.ModRevision, lease: kv.Lease, size: len(kv.Value)}
	}
	return out
}

// The first pass under a lease writes every shard holding a copy, and
// shard 0, in one transaction (100 copies fit in one); a
// pass with nothing changed writes nothing, whatever its mode; tails that
// moved wait for the interval's pass, which writes only their shard.
func TestHeartbeatWritesOnlyWhatChanged(t *testing.T) {
	f := newHBFixture(t, 100)
	if txns, revs := f.publish(publishPrompt); txns != 1 || revs != 1 {
		t.Fatalf("first pass: %d transactions, revision moved %d; want 1 and 1", txns, revs)
	}
	if got, want := len(f.shards()), shardsHolding(f.st.get()); got != want {
		t.Fatalf("%d shards written, want %d (those holding a copy, and shard 0)", got, want)
	}
	for _, mode := range []publishMode{publishPrompt, publishTails} {
		if txns, revs := f.publish(mode); txns != 0 || revs != 0 {
			t.Fatalf("unchanged, mode %d: %d transactions, revision moved %d; want none", mode, txns, revs)
		}
	}
	f.st.set("s0007", cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: 7 + tailStep})
	if txns, _ := f.publish(publishPrompt); txns != 0 {
		t.Fatalf("a tails-only change written by a prompt pass (%d transactions)", txns)
	}
	before := f.shards()
	if txns, revs := f.publish(publishTails); txns != 1 || revs != 1 {
		t.Fatalf("tails pass: %d transactions, revision moved %d; want 1 and 1", txns, revs)
	}
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0007"))
	for k, s := range f.shards() {
		moved := s.modRev != before[k].modRev
		if moved != (k == key) {
			t.Errorf("shard %s moved %v; only %s should", k, moved, key)
		}
	}
	if got := f.shards()[key].hb.Streams["s0007"].RecordTail; got != 7+tailStep {
		t.Fatalf("published record tail %d, want %d", got, 7+tailStep)
	}
}

// Under load a copy's tails move on every interval; a tails pass writes a
// move only when the in-sync judgement could tell it (tailStep, half of
// cluster.InSyncSlack) or once the copy went quiet, while a role change is
// written by the next pass of either mode, in one revision.
func TestHeartbeatTailsWithinSlackWriteNothing(t *testing.T) {
	f := newHBFixture(t, 100)
	f.st.set("s0010", cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: 10, ConfirmWatermark: 10})
	f.publish(publishTails)
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0010"))
	// Moving on every interval, by less than tailStep in all: nothing.
	for i, tail := range []uint64{10 + 100, 10 + 200, 10 + tailStep - 1} {
		f.st.set("s0010", cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: tail, ConfirmWatermark: tail})
		if txns, revs := f.publish(publishTails); txns != 0 || revs != 0 {
			t.Fatalf("move %d within the slack: %d transactions, revision moved %d; want none", i, txns, revs)
		}
	}
	if got := f.shards()[key].hb.Streams["s0010"].RecordTail; got != 10 {
		t.Fatalf("published record tail %d after moves within the slack, want the first 10", got)
	}
	// Quiet for an interval: its exact tails go out, once.
	if txns, revs := f.publish(publishTails); txns != 1 || revs != 1 {
		t.Fatalf("quiet copy: %d transactions, revision moved %d; want 1 and 1", txns, revs)
	}
	if got := f.shards()[key].hb.Streams["s0010"].RecordTail; got != 10+tailStep-1 {
		t.Fatalf("published record tail %d once quiet, want %d", got, 10+tailStep-1)
	}
	if txns, _ := f.publish(publishTails); txns != 0 {
		t.Fatalf("quiet and published: %d transactions, want none", txns)
	}
	// A role change (a small tail move with it) is written at once by a
	// prompt pass, and carries the tails.
	f.st.set("s0010", cluster.CopyTails{Epoch: 2, Role: cluster.RoleOwner, RecordTail: 10 + tailStep})
	f.hb.signal([]string{"s0010"}) // as the copy does (Manager.heartbeatNow)
	if txns, revs := f.publish(publishPrompt); txns != 1 || revs != 1 {
		t.Fatalf("role change: %d transactions, revision moved %d; want 1 and 1", txns, revs)
	}
	got := f.shards()[key].hb.Streams["s0010"]
	if got.Role != cluster.RoleOwner || got.Epoch != 2 || got.RecordTail != 10+tailStep {
		t.Fatalf("published %+v after the role change", got)
	}
}

// A sealed copy's tails are what a pending recovery waits on: every move
// of them is written by the next tails pass, however small.
func TestHeartbeatSealedTailsExact(t *testing.T) {
	f := newHBFixture(t, 20)
	f.st.set("s0004", cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, SealEpoch: 2, RecordTail: 4})
	f.publish(publishTails)
	f.st.set("s0004", cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, SealEpoch: 2, RecordTail: 5})
	if txns, _ := f.publish(publishTails); txns != 1 {
		t.Fatalf("sealed copy's tail moved by 1: %d transactions, want 1", txns)
	}
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0004"))
	if got := f.shards()[key].hb.Streams["s0004"].RecordTail; got != 5 {
		t.Fatalf("published record tail %d, want 5", got)
	}
}

// Many shards with tails past the step on one interval are one revision,
// not one per shard: what a loaded broker writes per interval is bounded
// by the transaction count, not by its streams.
func TestHeartbeatTailsPassOneRevision(t *testing.T) {
	f := newHBFixture(t, 300)
	f.publish(publishTails)
	for name, st := range f.st.get() {
		st.RecordTail += 3 * tailStep
		f.st.set(name, st)
	}
	if txns, revs := f.publish(publishTails); txns != 1 || revs != 1 {
		t.Fatalf("300 copies past the step: %d transactions, revision moved %d; want 1 and 1", txns, revs)
	}
	rev := f.rev()
	for k, s := range f.shards() {
		// (A shard no stream hashes to did not change: it stays as the
		// new lease wrote it.)
		if len(s.hb.Streams) > 0 && s.modRev != rev {
			t.Errorf("shard %s at revision %d, want %d", k, s.modRev, rev)
		}
	}
}

// Many copies changing role at once (an assignment listing applied) are
// written in one transaction: one revision, not one per copy or shard.
func TestHeartbeatBatchesChangesIntoOneRevision(t *testing.T) {
	f := newHBFixture(t, 300)
	f.publish(publishTails)
	for name := range f.st.get() {
		f.st.set(name, cluster.CopyTails{Epoch: 2, Role: cluster.RoleOwner})
		f.hb.signal([]string{name})
	}
	if txns, revs := f.publish(publishPrompt); txns != 1 || revs != 1 {
		t.Fatalf("300 role changes: %d transactions, revision moved %d; want 1 and 1", txns, revs)
	}
	rev := f.rev()
	for k, s := range f.shards() {
		// (A shard no stream hashes to did not change: it stays as the
		// new lease wrote it.)
		if len(s.hb.Streams) > 0 && s.modRev != rev {
			t.Errorf("shard %s at revision %d, want %d", k, s.modRev, rev)
		}
		for name, tails := range s.hb.Streams {
			if tails.Role != cluster.RoleOwner || tails.Epoch != 2 {
				t.Errorf("%s published %+v", name, tails)
			}
		}
	}
}

// A pass never puts more than etcd's --max-txn-ops in one transaction:
// with a bound below the shards it writes it splits, every shard written.
func TestHeartbeatTxnOpsBound(t *testing.T) {
	f := newHBFixture(t, 100)
	f.hb.maxOps = 5
	n := shardsHolding(f.st.get())
	want := txnsFor(n, 5)
	if txns, revs := f.publish(publishTails); txns != want || revs != int64(want) {
		t.Fatalf("%d transactions, revision moved %d; want %d of at most 5 puts", txns, revs, want)
	}
	if got := len(f.shards()); got != n {
		t.Fatalf("%d shards written, want %d", got, n)
	}
}

// A shard with no copy is not written under a new lease (absent reads as
// empty), except shard 0, so a broker holding nothing still has a
// heartbeat; a shard that held copies and lost them is written empty.
func TestHeartbeatSkipsEmptyShards(t *testing.T) {
	f := newHBFixture(t, 0)
	if txns, _ := f.publish(publishTails); txns != 1 {
		t.Fatalf("%d transactions for a broker holding nothing, want 1 (shard 0)", txns)
	}
	key0 := cluster.NewSchema("").HeartbeatKey("b1", 0)
	got := f.shards()
	if _, ok := got[key0]; !ok || len(got) != 1 {
		t.Fatalf("shards %v, want shard 0 alone", slices.Collect(maps.Keys(got)))
	}
	f.st.set("s0001", cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower})
	f.hb.signal([]string{"s0001"})
	if txns, _ := f.publish(publishPrompt); txns != 1 {
		t.Fatalf("%d transactions for a new copy, want 1", txns)
	}
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0001"))
	if s, ok := f.shards()[key]; !ok || len(s.hb.Streams) != 1 {
		t.Fatalf("the new copy's shard %s: %+v (present %v)", key, s, ok)
	}
	f.st.mu.Lock()
	delete(f.st.m, "s0001")
	f.st.mu.Unlock()
	f.hb.signal([]string{"s0001"})
	if txns, _ := f.publish(publishPrompt); txns != 1 {
		t.Fatalf("%d transactions for a copy gone, want 1", txns)
	}
	if s, ok := f.shards()[key]; !ok || len(s.hb.Streams) != 0 {
		t.Fatalf("the gone copy's shard %s: %+v (present %v), want written empty", key, s, ok)
	}
}

// A stream whose copy took in an assignment has its shard written even
// when its status reads the same: the controller learns from it that the
// broker saw the assignment (state.Snapshot.HeardSince).
func TestHeartbeatWritesTakenInShard(t *testing.T) {
	f := newHBFixture(t, 50)
	f.publish(publishTails)
	before := f.shards()
	f.hb.tookIn([]string{"s0003"})
	if txns, _ := f.publish(publishPrompt); txns != 1 {
		t.Fatalf("%d transactions, want 1", txns)
	}
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0003"))
	for k, s := range f.shards() {
		if moved := s.modRev != before[k].modRev; moved != (k == key) {
			t.Errorf("shard %s moved %v; only %s should", k, moved, key)
		}
	}
	if txns, _ := f.publish(publishPrompt); txns != 0 {
		t.Fatalf("taken in twice: %d transactions on the next pass", txns)
	}
}

// A new lease (a new session) has none of the old lease's keys: the first
// pass under it writes every shard holding a copy again, bound to it,
// even with nothing changed.
func TestHeartbeatNewLeaseRewritesEveryShard(t *testing.T) {
	f := newHBFixture(t, 40)
	f.publish(publishTails)
	old := f.lease
	f.lease = f.grant()
	if txns, _ := f.publish(publishPrompt); txns != 1 {
		t.Fatalf("%d transactions under the new lease, want 1", txns)
	}
	got := f.shards()
	if want := shardsHolding(f.st.get()); len(got) != want {
		t.Fatalf("%d shards, want %d", len(got), want)
	}
	for k, s := range got {
		if clientv3.LeaseID(s.lease) != f.lease {
			t.Errorf("shard %s on lease %x, want the new %x (old %x)", k, s.lease, f.lease, old)
		}
	}
}

// A shard whose value would pass its bound is never sent whole: it keeps
// the copies that fit, counts the rest in Omitted, and etcd takes it; the
// values of one pass are split over transactions at their bound.
func TestHeartbeatShardSizeBound(t *testing.T) {
	const streams = 16 * cluster.HeartbeatShards
	f := newHBFixture(t, streams)
	// About 16 copies of ~110 B fall in each shard; a bound of 512 B keeps
	// about four of them.
	f.hb.maxValue, f.hb.maxTxn = 512, 4<<10
	txns, revs := f.publish(publishTails)
	if int64(txns) != revs || txns < 12 {
		t.Fatalf("%d transactions, revision moved %d; want one revision each, and at least 12 for %d values of up to 512 B in 4 KiB", txns, revs, cluster.HeartbeatShards)
	}
	kept, omitted := 0, 0
	for k, s := range f.shards() {
		if s.size > f.hb.maxValue {
			t.Errorf("shard %s holds %d bytes, over the bound %d", k, s.size, f.hb.maxValue)
		}
		if s.hb.Omitted == 0 {
			t.Errorf("shard %s omits nothing: %d copies fit in %d bytes?", k, len(s.hb.Streams), s.size)
		}
		kept += len(s.hb.Streams)
		omitted += s.hb.Omitted
	}
	if kept+omitted != streams {
		t.Fatalf("kept %d + omitted %d != %d copies", kept, omitted, streams)
	}
	if got := f.hb.omittedTotal.Load(); got != int64(omitted) {
		t.Fatalf("omitted gauge %d, want %d", got, omitted)
	}
	// The full statuses were what this pass meant to write: the next one,
	// with nothing changed, writes nothing rather than trying again.
	if txns, _ := f.publish(publishTails); txns != 0 {
		t.Fatalf("%d transactions on an unchanged pass after an over-bound one", txns)
	}
}

// A new session (here: the lease revoked under a running broker, as when
// it expires during a partition) writes its heartbeat again under its new
// lease.
func TestNewSessionRewritesEveryShard(t *testing.T) {
	c, _ := newTestCoord(t)
	// The session learns its lease is gone from a keep-alive, sent every
	// third of the TTL.
	c.cfg.LeaseTTL = 2 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := runCoord(c, ctx)
	defer func() {
		cancel()
		waitRun(t, done)
	}()
	select {
	case <-c.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("not registered")
	}
	leaseOf := func() (map[int64]int, error) {
		resp, err := c.cfg.Client.Get(context.Background(), c.cfg.Schema.HeartbeatDir("b1"), clientv3.WithPrefix())
		if err != nil {
			return nil, err
		}
		out := map[int64]int{}
		for _, kv := range resp.Kvs {
			out[kv.Lease]++
		}
		return out, nil
	}
	first, err := leaseOf()
	if err != nil || len(first) != 1 {
		t.Fatalf("shards on leases %v (%v), want one lease", first, err)
	}
	// The broker holds no copy: shard 0 alone.
	var old int64
	for l, n := range first {
		old = l
		if n != 1 {
			t.Fatalf("%d shards, want 1 (shard 0)", n)
		}
	}
	if _, err := c.cfg.Client.Revoke(context.Background(), clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 15*time.Second, "every shard written again under a new lease", func() error {
		got, err := leaseOf()
		if err != nil {
			return err
		}
		for l, n := range got {
			if l != old && n == 1 && len(got) == 1 {
				return nil
			}
		}
		return fmt.Errorf("shards on leases %v (old %x); want shard 0 on one new lease", got, old)
	})
}

// A prompt pass reads only the shards where a copy signalled a change
// (or took in an assignment): during a mass failover the signals come
// every promptDelay, and re-reading every copy of the broker for each was
// most of its heartbeat's work. A change that no signal named waits for
// the next tails pass, which reads every shard.
func TestPromptPassReadsOnlySignalledShards(t *testing.T) {
	const n = 2000
	f := newHBFixture(t, n)
	f.publish(publishTails)
	readBy := func(mode publishMode) (read, txns int) {
		t.Helper()
		f.st.mu.Lock()
		f.st.read = 0
		f.st.mu.Unlock()
		txns, _ = f.publish(mode)
		f.st.mu.Lock()
		defer f.st.mu.Unlock()
		return f.st.read, txns
	}
	inShard := 0
	for name := range f.st.get() {
		if cluster.HeartbeatShard(name) == cluster.HeartbeatShard("s0042") {
			inShard++
		}
	}
	f.st.set("s0042", cluster.CopyTails{Epoch: 2, Role: cluster.RoleOwner, RecordTail: 42})
	f.hb.signal([]string{"s0042"})
	if read, txns := readBy(publishPrompt); read != inShard || txns != 1 {
		t.Fatalf("prompt pass after one signal read %d statuses and wrote %d transactions; want its shard's %d and 1", read, txns, inShard)
	}
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0042"))
	if got := f.shards()[key].hb.Streams["s0042"]; got.Epoch != 2 || got.Role != cluster.RoleOwner {
		t.Fatalf("published %+v, want the owner at epoch 2", got)
	}
	if read, txns := readBy(publishPrompt); read != 0 || txns != 0 {
		t.Fatalf("prompt pass with nothing signalled read %d statuses, wrote %d transactions; want none", read, txns)
	}
	// A change no signal named: the prompt pass misses it, the tails pass
	// writes it.
	f.st.set("s0077", cluster.CopyTails{Epoch: 2, Role: cluster.RoleOwner, RecordTail: 77})
	if _, txns := readBy(publishPrompt); txns != 0 {
		t.Fatalf("prompt pass wrote %d transactions for an unsignalled change", txns)
	}
	if read, txns := readBy(publishTails); read != n || txns != 1 {
		t.Fatalf("tails pass read %d statuses, wrote %d transactions; want %d and 1", read, txns, n)
	}
	key = cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0077"))
	if got := f.shards()[key].hb.Streams["s0077"]; got.Epoch != 2 {
		t.Fatalf("published %+v after the tails pass, want epoch 2", got)
	}
}

// An idle broker's tails pass reads no status while nothing changed since
// everything read was published (heartbeats.gen), yet reads every status
// once per maxTailsSkips+1 intervals all the same, so a change no path
// counted is still published; a counted change, a copy moving within the
// slack, and a shard asked for are read and written at once.
func TestHeartbeatIdleTailsPassReadsNothing(t *testing.T) {
	const n = 50
	f := newHBFixture(t, n)
	f.publish(publishTails) // everything, under the new lease
	readsAfter := func(mode publishMode) (reads, txns int) {
		t.Helper()
		before := f.st.reads()
		txns, _ = f.publish(mode)
		return f.st.reads() - before, txns
	}
	// The pass after the first reads (the first ended settled), then
	// maxTailsSkips passes read nothing, then one reads every status.
	for i := range maxTailsSkips {
		if reads, txns := readsAfter(publishTails); reads != 0 || txns != 0 {
			t.Fatalf("idle pass %d: %d statuses read, %d transactions; want none", i, reads, txns)
		}
	}
	if reads, txns := readsAfter(publishTails); reads != n || txns != 0 {
		t.Fatalf("pass after %d skipped: %d statuses read, %d transactions; want %d and none", maxTailsSkips, reads, txns, n)
	}

	// A change no path counted: published within maxTailsSkips+1 passes.
	key := cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0003"))
	f.st.setUncounted("s0003", cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, SealEpoch: 2, RecordTail: 3})
	for range maxTailsSkips + 1 {
		f.publish(publishTails)
	}
	if got := f.shards()[key].hb.Streams["s0003"]; got.Role != cluster.RoleSealed {
		t.Fatalf("uncounted change not published within %d passes: %+v", maxTailsSkips+1, got)
	}

	// A counted change is read by the very next pass, and written.
	if reads, _ := readsAfter(publishTails); reads != 0 {
		t.Fatalf("settled: %d statuses read, want none", reads)
	}
	f.st.set("s0003", cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, SealEpoch: 2, RecordTail: 4})
	if reads, txns := readsAfter(publishTails); reads != n || txns != 1 {
		t.Fatalf("counted change: %d statuses read, %d transactions; want %d and 1", reads, txns, n)
	}

	// A copy moving by less than tailStep is not written; the pass after
	// it, with nothing changed since, still reads and writes its exact
	// tails (it went quiet), and only then do passes read nothing.
	key = cluster.NewSchema("").HeartbeatKey("b1", cluster.HeartbeatShard("s0007"))
	f.st.set("s0007", cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: 7 + 1})
	if reads, txns := readsAfter(publishTails); reads != n || txns != 0 {
		t.Fatalf("move within the slack: %d statuses read, %d transactions; want %d and none", reads, txns, n)
	}
	if reads, txns := readsAfter(publishTails); reads != n || txns != 1 {
		t.Fatalf("quiet after a move: %d statuses read, %d transactions; want %d and 1", reads, txns, n)
	}
	if got := f.shards()[key].hb.Streams["s0007"].RecordTail; got != 8 {
		t.Fatalf("published record tail %d once quiet, want 8", got)
	}
	if reads, _ := readsAfter(publishTails); reads != 0 {
		t.Fatalf("quiet and published: %d statuses read, want none", reads)
	}

	// A shard asked for (a copy took in an assignment) is written though
	// nothing counted changed.
	f.hb.tookIn([]string{"s0001"})
	if reads, txns := readsAfter(publishTails); reads != n || txns != 1 {
		t.Fatalf("shard taken in: %d statuses read, %d transactions; want %d and 1", reads, txns, n)
	}

	// A new lease writes every shard again, whatever the generation.
	f.lease = f.grant()
	if _, txns := readsAfter(publishTails); txns != 1 {
		t.Fatalf("new lease: %d transactions, want 1", txns)
	}
	if n := f.hb.skips.Load(); n == 0 {
		t.Fatal("skips counter never moved")
	}
}
