package state_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/state"
)

var schema = cluster.NewSchema("/strand")

// startView runs a view over cli until the test ends.
func startView(t *testing.T, cli *clientv3.Client) *state.View {
	t.Helper()
	v := state.NewView(cli, schema, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = v.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return v
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// matchLoad checks that the view, once at revision rev, holds what a Load at
// its revision reads, mod revisions included; it returns both.
func matchLoad(t *testing.T, v *state.View, cli *clientv3.Client, rev int64, step string) (got, want *state.Snapshot) {
	t.Helper()
	ctx := ctxT(t)
	got, err := v.WaitRev(ctx, rev)
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	want, err = state.LoadAt(ctx, cli, schema, got.Rev)
	if err != nil {
		t.Fatalf("%s: load at %d: %v", step, got.Rev, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: the view at revision %d differs from a load at that revision:\nview %+v\nload %+v", step, got.Rev, got, want)
	}
	return got, want
}

// writer makes seeded random changes over every directory of the schema:
// puts of good and undecodable values, deletes, transactions of several,
// brokers and heartbeats bound to leases that are revoked, keys nested too
// deep, and keys outside the state (election keys, keys outside the
// prefix) that move the revision without changing it.
type writer struct {
	t      *testing.T
	cli    *clientv3.Client
	rng    *rand.Rand
	leases map[string]clientv3.LeaseID // node -> lease of its broker and heartbeat keys
}

var (
	nodes   = []string{"b1", "b2", "b3", "b4"}
	streams = []string{"s1", "s2", "s3", "s4", "s5"}
)

func (w *writer) pick(names []string) string { return names[w.rng.IntN(len(names))] }

func (w *writer) n() uint64 { return uint64(w.rng.IntN(50)) }

// streamKey returns a random key of a stream directory and a value for it.
func (w *writer) streamKey() (string, string) {
	s := w.pick(streams)
	switch w.rng.IntN(5) {
	case 0:
		return schema.StreamKey(s), cluster.Encode(cluster.StreamSpec{Name: s, Copies: 1 + w.rng.IntN(3)})
	case 1:
		return schema.AssignmentKey(s), cluster.Encode(cluster.Assignment{Stream: s, Epoch: w.n(), Owner: w.pick(nodes), Followers: []string{w.pick(nodes)}})
	case 2:
		return schema.RecoveryKey(s), cluster.Encode(cluster.Recovery{Stream: s, FromEpoch: w.n(), FenceEpoch: w.n(), OldOwner: w.pick(nodes)})
	case 3:
		return schema.HistoryKey(s), cluster.Encode(cluster.HistoryStarts{{Epoch: w.n(), RecordTail: w.n(), Node: w.pick(nodes)}})
	default:
		return schema.RefusalsKey(s), cluster.Encode(cluster.SealRefusals{Stream: s, FenceEpoch: w.n(), R: 2, Sealed: []string{w.pick(nodes)}})
	}
}

// brokerKey returns a random broker or heartbeat key and a value for it.
func (w *writer) brokerKey() (string, string) {
	n := w.pick(nodes)
	if w.rng.IntN(2) == 0 {
		return schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n, Address: fmt.Sprintf("127.0.0.1:%d", 1000+w.n())})
	}
	// A shard of the broker's heartbeat, carrying a stream that hashes to
	// it, as brokers write them; or, now and then, a stream that hashes to
	// another shard too, as a broker with another shard count writes
	// them, which the view must read as a load does whatever the order
	// the shards were written in.
	st := w.pick(streams)
	shard := cluster.HeartbeatShard(st)
	tails := map[string]cluster.CopyTails{st: {Epoch: w.n(), Role: cluster.RoleFollower, RecordTail: w.n()}}
	if w.rng.IntN(3) == 0 {
		tails[w.pick(streams)] = cluster.CopyTails{Epoch: w.n(), Role: cluster.RoleOwner, RecordTail: w.n()}
	}
	if w.rng.IntN(4) == 0 {
		// A broker not yet upgraded: 16 shards, two-digit keys.
		shard %= 16
		return schema.HeartbeatDir(n) + fmt.Sprintf("%02d", shard), cluster.Encode(cluster.Heartbeat{Node: n, Shard: shard, Streams: tails})
	}
	return schema.HeartbeatKey(n, shard), cluster.Encode(cluster.Heartbeat{Node: n, Shard: shard, Streams: tails})
}

// op returns one random put or delete on a key of the state.
func (w *writer) op() (string, clientv3.Op) {
	var key, val string
	if w.rng.IntN(3) == 0 {
		key, val = w.brokerKey()
	} else {
		key, val = w.streamKey()
	}
	switch w.rng.IntN(6) {
	case 0:
		return key, clientv3.OpDelete(key)
	case 1:
		return key, clientv3.OpPut(key, "{not json")
	default:
		return key, clientv3.OpPut(key, val)
	}
}

// step makes one random change and returns the revision after it.
func (w *writer) step(ctx context.Context) int64 {
	w.t.Helper()
	var rev int64
	var err error
	switch k := w.rng.IntN(20); {
	case k < 11:
		_, op := w.op()
		var resp clientv3.OpResponse
		resp, err = w.cli.Do(ctx, op)
		if err == nil {
			rev = header(resp)
		}
	case k < 14:
		// A transaction of distinct keys: its events share one revision.
		var ops []clientv3.Op
		var keys []string
		for range 2 + w.rng.IntN(4) {
			if key, op := w.op(); !slices.Contains(keys, key) {
				keys, ops = append(keys, key), append(ops, op)
			}
		}
		var resp *clientv3.TxnResponse
		resp, err = w.cli.Txn(ctx).Then(ops...).Commit()
		if err == nil {
			rev = resp.Header.Revision
		}
	case k < 16:
		rev, err = w.lease(ctx)
	case k == 16:
		// A whole directory deleted at once.
		dir := w.pick([]string{schema.HeartbeatsDir(), schema.AssignmentsDir(), schema.RecoveriesDir()})
		var resp *clientv3.DeleteResponse
		resp, err = w.cli.Delete(ctx, dir, clientv3.WithPrefix())
		if err == nil {
			rev = resp.Header.Revision
		}
	default:
		key := w.pick([]string{
			schema.StreamsDir() + "nested/too-deep", schema.HeartbeatsDir() + "b1/extra",
			schema.ControllerElection() + "/7587", "/elsewhere/key",
		})
		var resp *clientv3.PutResponse
		resp, err = w.cli.Put(ctx, key, fmt.Sprint(w.n()))
		if err == nil {
			rev = resp.Header.Revision
		}
	}
	if err != nil {
		w.t.Fatalf("write: %v", err)
	}
	return rev
}

func header(resp clientv3.OpResponse) int64 {
	switch {
	case resp.Put() != nil:
		return resp.Put().Header.Revision
	case resp.Del() != nil:
		return resp.Del().Header.Revision
	}
	return 0
}

// lease registers a node's broker and heartbeat keys on a new lease, or
// revokes the lease it has: both keys go in one revision, as when a
// broker's lease ends.
func (w *writer) lease(ctx context.Context) (int64, error) {
	n := w.pick(nodes)
	if id, ok := w.leases[n]; ok {
		delete(w.leases, n)
		resp, err := w.cli.Revoke(ctx, id)
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	l, err := w.cli.Grant(ctx, 60)
	if err != nil {
		return 0, err
	}
	w.leases[n] = l.ID
	resp, err := w.cli.Txn(ctx).Then(
		clientv3.OpPut(schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n, Address: "127.0.0.1:1"}), clientv3.WithLease(l.ID)),
		clientv3.OpPut(schema.HeartbeatKey(n, 0), cluster.Encode(cluster.Heartbeat{Node: n}), clientv3.WithLease(l.ID)),
	).Commit()
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// The view kept from watch events is, after every change, the snapshot a
// Load at the same revision reads, through a seeded random sequence of
// changes over every directory, a lease that expires, and a gap in which
// the view is cut off and its revision compacted away, so its watch
// reports ErrCompacted and it loads again. Snapshots handed out earlier
// never change afterwards.
func TestViewMatchesLoad(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	fwd := srv.Forward(t)
	ctx := ctxT(t)

	// A broker whose lease is left to expire, as a killed broker's does.
	expiring, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, schema.BrokerKey("gone"), cluster.Encode(cluster.BrokerInfo{Node: "gone"}), clientv3.WithLease(expiring.ID)); err != nil {
		t.Fatal(err)
	}

	v := startView(t, fwd.Client(t))
	for seed := uint64(1); seed <= 3; seed++ {
		w := &writer{t: t, cli: cli, rng: rand.New(rand.NewPCG(seed, seed)), leases: map[string]clientv3.LeaseID{}}
		var handed [][2]*state.Snapshot
		const steps = 120
		for i := range steps {
			step := fmt.Sprintf("seed %d step %d", seed, i)
			if i == steps/2 && seed == 2 {
				// The gap: cut off, written to, compacted past.
				fwd.Cut()
				var rev int64
				for range 20 {
					rev = w.step(ctx)
				}
				if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
					t.Fatal(err)
				}
				fwd.Resume()
				matchLoad(t, v, cli, rev, step+" (after the compacted gap)")
				continue
			}
			got, want := matchLoad(t, v, cli, w.step(ctx), step)
			handed = append(handed, [2]*state.Snapshot{got, want})
		}
		for i, h := range handed {
			if !reflect.DeepEqual(h[0], h[1]) {
				t.Fatalf("seed %d: the snapshot handed out at step %d (revision %d) changed afterwards", seed, i, h[0].Rev)
			}
		}
	}
	if n := v.Loads(); n != 2 {
		t.Fatalf("the view loaded %d times, want 2: once at the start, once after its watch was compacted", n)
	}

	// The expired lease took its broker key away; the view saw the delete.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := cli.Get(ctx, schema.BrokerKey("gone"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			snap, _ := matchLoad(t, v, cli, resp.Header.Revision, "after the lease expired")
			if snap.Live("gone") {
				t.Fatal("the view still lists a broker whose lease expired")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease did not expire")
		}
		if _, err := v.WaitRev(ctx, resp.Header.Revision+1); err != nil {
			t.Fatal(err)
		}
	}
}

// A view cut off from etcd while a broker's key is deleted sees the delete
// once it is back: first when its watch resumes from the last revision it
// held (no load), then when the revision was compacted in the gap (a load,
// in which the broker is simply absent).
func TestViewSeesBrokerLostWhileCutOff(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	fwd := srv.Forward(t)
	ctx := ctxT(t)

	leases := map[string]clientv3.LeaseID{}
	var rev int64
	for _, n := range []string{"b1", "b2", "b3"} {
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		leases[n] = l.ID
		resp, err := cli.Put(ctx, schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n}), clientv3.WithLease(l.ID))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	v := startView(t, fwd.Client(t))
	snap, err := v.WaitRev(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.LiveBrokers(); !slices.Equal(got, []string{"b1", "b2", "b3"}) {
		t.Fatalf("live brokers %v", got)
	}

	lose := func(node string, compact bool) *state.Snapshot {
		t.Helper()
		fwd.Cut()
		resp, err := cli.Revoke(ctx, leases[node])
		if err != nil {
			t.Fatal(err)
		}
		if compact {
			// Compacted past the delete: a watch from the revision the
			// view holds can no longer deliver it.
			after, err := cli.Put(ctx, "/elsewhere", "x")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Compact(ctx, after.Header.Revision); err != nil {
				t.Fatal(err)
			}
		}
		fwd.Resume()
		snap, _ := matchLoad(t, v, cli, resp.Header.Revision, "after losing "+node)
		return snap
	}
	if snap := lose("b1", false); snap.Live("b1") || !snap.Live("b2") {
		t.Fatalf("after the gap: live brokers %v, want b1 gone", snap.LiveBrokers())
	}
	if n := v.Loads(); n != 1 {
		t.Fatalf("the view loaded %d times to resume its watch; want it resumed from its revision", n)
	}
	if snap := lose("b2", true); snap.Live("b2") || !snap.Live("b3") {
		t.Fatalf("after the compacted gap: live brokers %v, want b2 gone", snap.LiveBrokers())
	}
	if n := v.Loads(); n != 2 {
		t.Fatalf("the view loaded %d times; want a load after its revision was compacted", n)
	}
}

// A tracker of the view's changes is told the streams each change
// concerns: a key named by a stream, a copy status a heartbeat shard
// changes (not one it rewrites as it was), and every stream for a broker
// coming or going; its first Take reports every stream, and also names
// those of them with a change other than a copy's progress (status).
func TestViewChangesNameTheStreams(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	ctx := ctxT(t)
	v := startView(t, cli)
	c := v.Track()
	put := func(key, val string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, key, val)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	take := func(rev int64, step string) ([]string, bool) {
		t.Helper()
		if _, err := v.WaitRev(ctx, rev); err != nil {
			t.Fatal(err)
		}
		snap, changed, _, all, _ := c.Take()
		if snap == nil || snap.Rev < rev {
			t.Fatalf("%s: snapshot %v, want one at revision %d or later", step, snap, rev)
		}
		return changed, all
	}
	rev := put(schema.StreamKey("a"), cluster.Encode(cluster.StreamSpec{Name: "a", Copies: 1}))
	if _, all := take(rev, "first take"); !all {
		t.Fatal("first take: not every stream")
	}
	put(schema.AssignmentKey("b"), cluster.Encode(cluster.Assignment{Stream: "b", Epoch: 1, Owner: "b1"}))
	put(schema.StreamKey("c"), cluster.Encode(cluster.StreamSpec{Name: "c", Copies: 1}))
	rev = put(schema.RecoveryKey("d"), cluster.Encode(cluster.Recovery{Stream: "d"}))
	if changed, all := take(rev, "keys"); all || !slices.Equal(changed, []string{"b", "c", "d"}) {
		t.Fatalf("keys of b, c, d changed: got %v (all %v)", changed, all)
	}
	hb := func(tails map[string]cluster.CopyTails) string {
		return cluster.Encode(cluster.Heartbeat{Node: "b1", Shard: 0, Streams: tails})
	}
	// Streams hashing to one shard, whatever their names.
	var names []string
	for i := 0; len(names) < 3; i++ {
		if n := fmt.Sprintf("h%d", i); cluster.HeartbeatShard(n) == 0 {
			names = append(names, n)
		}
	}
	key := schema.HeartbeatKey("b1", 0)
	rev = put(key, hb(map[string]cluster.CopyTails{names[0]: {Epoch: 1}, names[1]: {Epoch: 1}}))
	if changed, all := take(rev, "heartbeat"); all || !slices.Equal(changed, slices.Sorted(slices.Values(names[:2]))) {
		t.Fatalf("heartbeat of %v: got %v (all %v)", names[:2], changed, all)
	}
	// names[0] the same, names[1] gone, names[2] new.
	rev = put(key, hb(map[string]cluster.CopyTails{names[0]: {Epoch: 1}, names[2]: {Epoch: 1}}))
	if changed, all := take(rev, "heartbeat again"); all || !slices.Equal(changed, slices.Sorted(slices.Values(names[1:]))) {
		t.Fatalf("heartbeat rewritten: got %v (all %v), want %v", changed, all, names[1:])
	}
	rev = put(key, hb(map[string]cluster.CopyTails{names[0]: {Epoch: 1}, names[2]: {Epoch: 1}}))
	if changed, all := take(rev, "heartbeat as it was"); all || len(changed) != 0 {
		t.Fatalf("heartbeat rewritten as it was: got %v (all %v), want nothing", changed, all)
	}
	// Progress alone (names[0]'s tails and watermark) is a change, but no
	// status change; names[2] suspecting its owner is both. Take tells
	// them apart, and one status change among progress counts.
	takeSplit := func(rev int64, step string) (changed, status []string) {
		t.Helper()
		if _, err := v.WaitRev(ctx, rev); err != nil {
			t.Fatal(err)
		}
		snap, changed, status, all, _ := c.Take()
		if snap == nil || snap.Rev < rev || all {
			t.Fatalf("%s: snapshot %v (all %v), want one at revision %d or later", step, snap, all, rev)
		}
		return changed, status
	}
	rev = put(key, hb(map[string]cluster.CopyTails{names[0]: {Epoch: 1, Head: 2, RecordTail: 9, CursorEventTail: 1, ConfirmWatermark: 7}, names[2]: {Epoch: 1, Suspect: "b2"}}))
	if changed, status := takeSplit(rev, "progress"); !slices.Equal(changed, slices.Sorted(slices.Values([]string{names[0], names[2]}))) || !slices.Equal(status, names[2:3]) {
		t.Fatalf("progress of %s, suspicion of %s: changed %v, status %v", names[0], names[2], changed, status)
	}
	put(key, hb(map[string]cluster.CopyTails{names[0]: {Epoch: 1, RecordTail: 10}, names[2]: {Epoch: 1, Suspect: "b2", RecordTail: 1}}))
	rev = put(key, hb(map[string]cluster.CopyTails{names[0]: {Epoch: 2, RecordTail: 10}, names[2]: {Epoch: 1, Suspect: "b2", RecordTail: 2}}))
	if changed, status := takeSplit(rev, "progress, then an epoch"); !slices.Equal(changed, slices.Sorted(slices.Values([]string{names[0], names[2]}))) || !slices.Equal(status, names[:1]) {
		t.Fatalf("%s progressed then changed epoch, %s progressed twice: changed %v, status %v", names[0], names[2], changed, status)
	}
	rev = put(schema.BrokerKey("b9"), cluster.Encode(cluster.BrokerInfo{Node: "b9"}))
	if _, all := take(rev, "broker"); !all {
		t.Fatal("a broker registered: not every stream")
	}
}
