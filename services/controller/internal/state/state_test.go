package state

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
)

// startEtcd starts embedded etcd for a test: a client, a context that
// bounds the test's calls, and the schema at the default prefix.
func startEtcd(t *testing.T) (*clientv3.Client, context.Context, cluster.Schema) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return etcdtest.Start(t).Client(t), ctx, cluster.NewSchema("")
}

// streamsInShards returns two stream names that fall in different shards.
func streamsInShards(t *testing.T) (string, string) {
	t.Helper()
	a := "s1"
	for _, b := range []string{"s2", "s3", "s4", "s5", "s6"} {
		if cluster.HeartbeatShard(b) != cluster.HeartbeatShard(a) {
			return a, b
		}
	}
	t.Fatal("no two names in different shards")
	return "", ""
}

// A broker's heartbeat shards load merged into one Heartbeat; HeardSince
// holds for a stream once its shard is written after the revision asked,
// and a key that is not <node>/<shard> is listed corrupt, not guessed at.
func TestLoadMergesHeartbeatShards(t *testing.T) {
	cli, ctx, s := startEtcd(t)
	a, b := streamsInShards(t)
	put := func(node, stream string, tails cluster.CopyTails) int64 {
		t.Helper()
		shard := cluster.HeartbeatShard(stream)
		hb := cluster.Heartbeat{Node: node, Shard: shard, Streams: map[string]cluster.CopyTails{stream: tails}}
		resp, err := cli.Put(ctx, s.HeartbeatKey(node, shard), cluster.Encode(hb))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	revA := put("b1", a, cluster.CopyTails{Epoch: 1, Role: cluster.RoleOwner, RecordTail: 4})
	revB := put("b1", b, cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: 3})
	if _, err := cli.Put(ctx, s.HeartbeatsDir()+"b9", "{}"); err != nil {
		t.Fatal(err)
	}
	snap, err := Load(ctx, cli, s)
	if err != nil {
		t.Fatal(err)
	}
	if ta, ok := snap.Tails("b1", a); !ok || ta.RecordTail != 4 {
		t.Fatalf("%s on b1: %+v %v", a, ta, ok)
	}
	if tb, ok := snap.Tails("b1", b); !ok || tb.RecordTail != 3 {
		t.Fatalf("%s on b1: %+v %v", b, tb, ok)
	}
	for _, c := range []struct {
		node, stream string
		rev          int64
		want         bool
	}{
		{"b1", a, revA - 1, true},
		{"b1", a, revA, false}, // a's shard not written since
		{"b1", b, revA, true},
		{"b1", b, revB, false},
		{"b2", a, 0, false}, // no heartbeat
		{"b1", "other", 0, false},
	} {
		if got := snap.HeardSince(c.node, c.stream, c.rev); got != c.want {
			t.Errorf("HeardSince(%s, %s, %d) = %v, want %v", c.node, c.stream, c.rev, got, c.want)
		}
	}
	if len(snap.Corrupt) != 1 || snap.Corrupt[0] != s.HeartbeatsDir()+"b9" {
		t.Fatalf("corrupt %v, want the unsharded key", snap.Corrupt)
	}
	if _, ok := snap.Heartbeats["b9"]; ok {
		t.Fatal("an unsharded key read as a heartbeat")
	}
}

// A newer value of a shard replaces what the older one put in the merged
// heartbeat: a copy gone from the shard is gone from the snapshot.
func TestDecodeHeartbeatReplacesShard(t *testing.T) {
	s := cluster.NewSchema("")
	a, b := streamsInShards(t)
	snap := Build().Snapshot()
	set := func(streams map[string]cluster.CopyTails, shard int, rev int64) {
		t.Helper()
		v := cluster.Encode(cluster.Heartbeat{Node: "b1", Shard: shard, Streams: streams})
		key := s.HeartbeatKey("b1", shard)
		if err := snap.applyHeartbeat(s, key, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(v), ModRevision: rev}, nil); err != nil {
			t.Fatal(err)
		}
	}
	set(map[string]cluster.CopyTails{a: {Epoch: 1}}, cluster.HeartbeatShard(a), 10)
	set(map[string]cluster.CopyTails{b: {Epoch: 1}}, cluster.HeartbeatShard(b), 11)
	set(map[string]cluster.CopyTails{}, cluster.HeartbeatShard(a), 12)
	if _, ok := snap.Tails("b1", a); ok {
		t.Fatalf("%s outlived its shard's newer value", a)
	}
	if _, ok := snap.Tails("b1", b); !ok {
		t.Fatalf("%s, in another shard, went with it", b)
	}
	if got := snap.Heartbeats["b1"].ShardRev(cluster.HeartbeatShard(a)); got != 12 {
		t.Fatalf("shard revision %d, want 12", got)
	}
	// A deleted shard takes its copies with it; the broker's entry goes
	// with its last shard.
	del := func(shard int) {
		t.Helper()
		if err := snap.applyHeartbeat(s, s.HeartbeatKey("b1", shard), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	del(cluster.HeartbeatShard(b))
	if _, ok := snap.Tails("b1", b); ok {
		t.Fatalf("%s outlived the delete of its shard", b)
	}
	if _, ok := snap.Heartbeats["b1"]; !ok {
		t.Fatal("the broker went with a shard that was not its last")
	}
	del(cluster.HeartbeatShard(a))
	if _, ok := snap.Heartbeats["b1"]; ok {
		t.Fatal("the broker outlived its last shard")
	}
}

// A status of another incarnation than the stream's assignment is of a
// deleted stream of the same name: Tails reads it as no status, so its
// seal epoch or suspect cannot fail the new stream over. A status that
// names no incarnation, or one of a stream with no assignment, is read as
// before.
func TestTailsOfAnotherIncarnationAreNotTheStreams(t *testing.T) {
	cli, ctx, s := startEtcd(t)
	const inc = "0123456789abcdef0123456789abcdef"
	a := cluster.Assignment{Stream: "re", Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Incarnation: inc}
	if _, err := cli.Put(ctx, s.AssignmentKey("re"), cluster.Encode(a)); err != nil {
		t.Fatal(err)
	}
	statuses := map[string]cluster.CopyTails{
		"b1": {Epoch: 1, Role: cluster.RoleOwner, RecordTail: 3, Incarnation: cluster.IncarnationTag(inc)},
		"b2": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 3},
		"b3": {Epoch: 4, Role: cluster.RoleSealed, SealEpoch: 5, RecordTail: 10, Incarnation: "fedcba98"},
	}
	for node, tails := range statuses {
		for _, stream := range []string{"re", "unassigned"} {
			shard := cluster.HeartbeatShard(stream)
			key := s.HeartbeatKey(node, shard)
			hb := cluster.Heartbeat{Node: node, Shard: shard, Streams: map[string]cluster.CopyTails{stream: tails}}
			if cluster.HeartbeatShard("re") == cluster.HeartbeatShard("unassigned") {
				hb.Streams = map[string]cluster.CopyTails{"re": tails, "unassigned": tails}
			}
			if _, err := cli.Put(ctx, key, cluster.Encode(hb)); err != nil {
				t.Fatal(err)
			}
		}
	}
	snap, err := Load(ctx, cli, s)
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range map[string]bool{"b1": true, "b2": true, "b3": false} {
		if got, ok := snap.Tails(node, "re"); ok != want {
			t.Errorf("Tails(%s, re) = %+v, %v; want found %v", node, got, ok, want)
		}
		if _, ok := snap.Tails(node, "unassigned"); !ok {
			t.Errorf("Tails(%s, unassigned): not found; a stream with no assignment has no incarnation to tell statuses apart", node)
		}
		if !snap.Heartbeats[node].Holds("re") {
			t.Errorf("%s holds no copy of re: a copy of another incarnation is still a copy on the broker", node)
		}
	}
}

// A broker not yet upgraded wrote 16 shards under two-digit keys; a
// restarted one may hold both widths at once (its old lease's keys until
// that lease ends). Each key is read apart: a stream is found in the
// older key too, HeardSince follows the key that names it, and the old
// key's delete leaves the new key's statuses in place.
func TestHeartbeatKeysOfAnotherWidth(t *testing.T) {
	cli, ctx, s := startEtcd(t)
	// The view applies the keys' events in the order they were written,
	// where a load reads them in key order: both must hold the same.
	v := NewView(cli, s, zerolog.Nop())
	vctx, stop := context.WithCancel(ctx)
	viewDone := make(chan struct{})
	go func() {
		defer close(viewDone)
		_ = v.Run(vctx)
	}()
	defer func() {
		stop()
		<-viewDone
	}()
	const stream = "orders" // shard 108 of 128, 12 of 16
	old := s.HeartbeatDir("b1") + "12"
	hb := cluster.Heartbeat{Node: "b1", Shard: 12, Streams: map[string]cluster.CopyTails{stream: {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 5}}}
	resp, err := cli.Put(ctx, old, cluster.Encode(hb))
	if err != nil {
		t.Fatal(err)
	}
	revOld := resp.Header.Revision
	// Another stream's write moves the revision past the old key's.
	if _, err := cli.Put(ctx, s.StreamKey("x"), cluster.Encode(cluster.StreamSpec{Name: "x", Copies: 1})); err != nil {
		t.Fatal(err)
	}
	snap, err := Load(ctx, cli, s)
	if err != nil {
		t.Fatal(err)
	}
	if tl, ok := snap.Tails("b1", stream); !ok || tl.RecordTail != 5 {
		t.Fatalf("%s from the two-digit key: %+v %v", stream, tl, ok)
	}
	if !snap.HeardSince("b1", stream, revOld-1) || snap.HeardSince("b1", stream, revOld) {
		t.Fatalf("HeardSince does not follow the key that names %s (written at %d)", stream, revOld)
	}
	// The same broker, restarted on this version: shard 108 under "108",
	// while "12" stays until its lease ends; and shard 12 under "012",
	// which the old key's shard number shares.
	shard := cluster.HeartbeatShard(stream)
	hb = cluster.Heartbeat{Node: "b1", Shard: shard, Streams: map[string]cluster.CopyTails{stream: {Epoch: 2, Role: cluster.RoleOwner, RecordTail: 9}}}
	if _, err := cli.Put(ctx, s.HeartbeatKey("b1", shard), cluster.Encode(hb)); err != nil {
		t.Fatal(err)
	}
	const other = "s1" // shard 73 of 128: any stream not in shard 12
	if _, err := cli.Put(ctx, s.HeartbeatKey("b1", 12), cluster.Encode(cluster.Heartbeat{Node: "b1", Shard: 12,
		Streams: map[string]cluster.CopyTails{other: {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 2}}})); err != nil {
		t.Fatal(err)
	}
	del, err := cli.Delete(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(ctx, cli, s)
	if err != nil {
		t.Fatal(err)
	}
	viewed, err := v.WaitRev(ctx, del.Header.Revision)
	if err != nil {
		t.Fatal(err)
	}
	for how, snap := range map[string]*Snapshot{"load": loaded, "view": viewed} {
		if tl, ok := snap.Tails("b1", stream); !ok || tl.RecordTail != 9 || tl.Epoch != 2 {
			t.Errorf("%s: %s after the old key's delete: %+v %v, want the new key's status", how, stream, tl, ok)
		}
		if tl, ok := snap.Tails("b1", other); !ok || tl.RecordTail != 2 {
			t.Errorf("%s: %s, in \"012\", after \"12\" was deleted: %+v %v", how, other, tl, ok)
		}
	}
}
