package state

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// What one heartbeat shard write costs the view at 10,000 streams, every
// one of three brokers holding a copy of each, with a snapshot handed out
// before each event (as the liveness loop and admin calls take them
// while streams are created): the event applied and whatever the
// snapshot handed out makes the view copy.
func BenchmarkApplyHeartbeat10k(b *testing.B) {
	s := cluster.NewSchema("/strand")
	nodes := []string{"b1", "b2", "b3"}
	shards := make([]map[string]cluster.CopyTails, cluster.HeartbeatShards)
	for i := range shards {
		shards[i] = map[string]cluster.CopyTails{}
	}
	for i := range 10_000 {
		name := fmt.Sprintf("s%05d", i)
		shards[cluster.HeartbeatShard(name)][name] = cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: uint64(i)}
	}
	snap := empty()
	rev := int64(1)
	kv := func(node string, shard int, tail uint64) *mvccpb.KeyValue {
		rev++
		streams := map[string]cluster.CopyTails{}
		for name, t := range shards[shard] {
			t.RecordTail += tail
			streams[name] = t
		}
		return &mvccpb.KeyValue{Key: []byte(s.HeartbeatKey(node, shard)), ModRevision: rev,
			Value: []byte(cluster.Encode(cluster.Heartbeat{Node: node, Shard: shard, Streams: streams}))}
	}
	for _, n := range nodes {
		for shard := range shards {
			k := kv(n, shard, 0)
			snap.apply(s, string(k.Key), k, ownAll, nil)
		}
	}
	snap.Rev = rev
	v := &View{schema: s, cur: snap, changed: make(chan struct{})}
	// Two values of one shard written in turn.
	events := [2]*clientv3.Event{{Type: clientv3.EventTypePut, Kv: kv("b1", 0, 1)}, {Type: clientv3.EventTypePut, Kv: kv("b1", 0, 2)}}
	b.ReportAllocs()
	stop := clustertest.CPUPerOp(b)
	i := 0
	for b.Loop() {
		i++
		v.mu.Lock()
		v.snapshotLocked()
		v.mu.Unlock()
		ev := events[i%2]
		ev.Kv.ModRevision = rev + int64(i)
		v.applyResponse(clientv3.WatchResponse{Events: []*clientv3.Event{ev}})
	}
	stop()
	if _, ok := v.cur.Tails("b1", fmt.Sprintf("s%05d", 0)); !ok {
		b.Fatal("s00000 gone from b1's heartbeat")
	}
}
