package state_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// benchCluster writes streams streams of three copies over three brokers,
// each broker's heartbeat naming every stream, and returns the heartbeat a
// benchmark writes again and again.
func benchCluster(b *testing.B, streams int) (*clientv3.Client, func(ctx context.Context) int64) {
	b.Helper()
	srv := etcdtest.Start(b)
	cli := srv.Client(b)
	ctx := context.Background()
	nodes := []string{"b1", "b2", "b3"}
	tails := map[string]cluster.CopyTails{}
	var ops []clientv3.Op
	for i := range streams {
		name := fmt.Sprintf("s%05d", i)
		a := cluster.Assignment{Stream: name, Epoch: 1, Owner: nodes[i%3], Followers: []string{nodes[(i+1)%3], nodes[(i+2)%3]}}
		ops = append(ops,
			clientv3.OpPut(schema.StreamKey(name), cluster.Encode(cluster.StreamSpec{Name: name, Copies: 3})),
			clientv3.OpPut(schema.AssignmentKey(name), cluster.Encode(a)))
		// Written 50 streams a transaction, within etcd's 128 operations.
		if len(ops) == 100 || i == streams-1 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
		tails[name] = cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: uint64(i)}
	}
	shards := make([]map[string]cluster.CopyTails, cluster.HeartbeatShards)
	for i := range shards {
		shards[i] = map[string]cluster.CopyTails{}
	}
	for name, t := range tails {
		shards[cluster.HeartbeatShard(name)][name] = t
	}
	for _, n := range nodes {
		if _, err := cli.Put(ctx, schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n})); err != nil {
			b.Fatal(err)
		}
		for shard, streams := range shards {
			if _, err := cli.Put(ctx, schema.HeartbeatKey(n, shard), cluster.Encode(cluster.Heartbeat{Node: n, Shard: shard, Streams: streams})); err != nil {
				b.Fatal(err)
			}
		}
	}
	// A heartbeat write is one shard's: tails changing in the streams that
	// hash to it.
	hb := cluster.Encode(cluster.Heartbeat{Node: "b1", Shard: 0, Time: time.Now().UTC(), Streams: shards[0]})
	return cli, func(ctx context.Context) int64 {
		resp, err := cli.Put(ctx, schema.HeartbeatKey("b1", 0), hb)
		if err != nil {
			b.Fatal(err)
		}
		return resp.Header.Revision
	}
}

// What a heartbeat costs the controller at 1,000 streams: a snapshot read
// and decoded whole (as before the view), or one event applied to the view.
func BenchmarkHeartbeatLoad(b *testing.B) {
	cli, heartbeat := benchCluster(b, 1000)
	ctx := context.Background()
	for b.Loop() {
		heartbeat(ctx)
		if _, err := state.Load(ctx, cli, schema); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHeartbeatView(b *testing.B) {
	benchHeartbeatView(b, 1000)
}

// The same at 10,000 streams, every broker holding a copy of each: a
// heartbeat shard write replaces that shard's part of the broker's
// heartbeat, not a map of every stream the broker holds, and a snapshot
// taken after each (as the liveness loop and admin calls take them) makes
// the next event copy only what it changes.
func BenchmarkHeartbeatView10k(b *testing.B) {
	benchHeartbeatView(b, 10_000)
}

func benchHeartbeatView(b *testing.B, streams int) {
	cli, heartbeat := benchCluster(b, streams)
	ctx, cancel := context.WithCancel(context.Background())
	v := state.NewView(cli, schema, zerolog.Nop())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	defer func() { cancel(); <-done }()
	b.ReportAllocs()
	stop := clustertest.CPUPerOp(b)
	for b.Loop() {
		if _, err := v.WaitRev(ctx, heartbeat(ctx)); err != nil {
			b.Fatal(err)
		}
	}
	stop()
}
