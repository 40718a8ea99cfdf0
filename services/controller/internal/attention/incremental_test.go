package attention

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// A memory told only the streams that changed (ObserveChanged, fed from
// the view's changes as the liveness loop feeds it) remembers, after every
// change, what a memory that judges every stream of every snapshot
// (Observe) does, and counts the same: through a seeded random sequence of
// assignments, specs, brokers coming and going and heartbeat shards over
// real etcd and the controller's view.
func TestObserveChangedMatchesObserve(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := cluster.NewSchema("/strand")
	v := state.NewView(cli, schema, zerolog.Nop())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	changes := v.Track()

	nodes := []string{"b1", "b2", "b3", "b4"}
	streams := make([]string, 12)
	for i := range streams {
		streams[i] = fmt.Sprintf("s%02d", i)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	pick := func(from []string) string { return from[rng.IntN(len(from))] }
	members := func() (string, []string) {
		perm := rng.Perm(len(nodes))
		followers := make([]string, rng.IntN(3))
		for i := range followers {
			followers[i] = nodes[perm[i+1]]
		}
		return nodes[perm[0]], followers
	}
	write := func() int64 {
		t.Helper()
		var op clientv3.Op
		switch k := rng.IntN(10); {
		case k < 3:
			s := pick(streams)
			owner, followers := members()
			a := cluster.Assignment{Stream: s, Epoch: uint64(1 + rng.IntN(4)), Owner: owner, Followers: followers,
				Policy: cluster.DefaultPolicy, Incarnation: fmt.Sprint(rng.IntN(2))}
			op = clientv3.OpPut(schema.AssignmentKey(s), cluster.Encode(a))
		case k == 3:
			op = clientv3.OpDelete(schema.AssignmentKey(pick(streams)))
		case k == 4:
			s := pick(streams)
			op = clientv3.OpPut(schema.StreamKey(s), cluster.Encode(cluster.StreamSpec{Name: s, Copies: 1 + rng.IntN(3)}))
		case k == 5:
			n := pick(nodes)
			if rng.IntN(2) == 0 {
				op = clientv3.OpDelete(schema.BrokerKey(n))
			} else {
				op = clientv3.OpPut(schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n, Address: n + ":1"}))
			}
		default:
			// One shard of a broker's heartbeat: the streams hashing to it,
			// each with tails near the others' or behind them.
			n, s := pick(nodes), pick(streams)
			shard := cluster.HeartbeatShard(s)
			tails := map[string]cluster.CopyTails{}
			for _, o := range streams {
				if cluster.HeartbeatShard(o) == shard && rng.IntN(3) > 0 {
					role := cluster.RoleFollower
					if rng.IntN(3) == 0 {
						role = cluster.RoleOwner
					}
					tails[o] = cluster.CopyTails{Epoch: uint64(1 + rng.IntN(4)), Role: role,
						RecordTail: uint64(rng.IntN(40)), ConfirmWatermark: uint64(rng.IntN(40))}
				}
			}
			op = clientv3.OpPut(schema.HeartbeatKey(n, shard), cluster.Encode(cluster.Heartbeat{Node: n, Shard: shard, Streams: tails}))
		}
		resp, err := cli.Do(ctx, op)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Put() != nil {
			return resp.Put().Header.Revision
		}
		return resp.Del().Header.Revision
	}

	inc, full := NewMemory(), NewMemory()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	incrementals := 0
	for i := range 300 {
		// Several writes between takes, as the liveness loop takes the
		// view at its own pace.
		var rev int64
		for range 1 + rng.IntN(3) {
			rev = write()
		}
		if _, err := v.WaitRev(ctx, rev); err != nil {
			t.Fatal(err)
		}
		snap, changed, _, all, _ := changes.Take()
		if !all {
			incrementals++
		}
		now := t0.Add(time.Duration(i) * time.Second)
		got, want := inc.ObserveChanged(snap, changed, all, now), full.Observe(snap, now)
		if got != want {
			t.Fatalf("step %d: counted %+v, want %+v", i, got, want)
		}
		if !reflect.DeepEqual(inc.streams, full.streams) {
			t.Fatalf("step %d (changed %v, all %v): remembered\n%v\nwant\n%v", i, changed, all, dump(inc), dump(full))
		}
	}
	if incrementals < 100 {
		t.Fatalf("only %d of 300 takes were incremental: the test did not exercise ObserveChanged", incrementals)
	}
}

func dump(m *Memory) string {
	out := ""
	for name, mo := range m.streams {
		out += fmt.Sprintf("%s: %+v\n", name, *mo)
	}
	return out
}
