package admin

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/controller/internal/rebalance"
)

// Handovers waiting for their recovery to be committed hold no admission
// slot: with as many of them waiting as the controller serves calls at
// once, a CreateStream is still admitted (it would wait its queue wait and
// be refused busy if the waits held their slots), and the handovers then
// answer the assignment committed once it is.
func TestHandoverWaitsHoldNoAdmissionSlot(t *testing.T) {
	const calls = 3
	mover := &rebalance.Mover{Log: zerolog.Nop(), Call: func(context.Context, string, *strandv1.HandoverRequest) (*strandv1.HandoverResponse, error) {
		return &strandv1.HandoverResponse{CaughtUp: true}, nil
	}}
	// The queue wait is far below commitWait: a CreateStream behind the
	// waits, were they holding their slots, is refused long before any
	// of them ends.
	f := startFlood(t, Config{MaxCalls: calls, QueueWait: 2 * time.Second, Mover: mover}, "b1", "b2")
	mover.Schema = f.schema
	ctx, cancel := context.WithTimeout(context.Background(), floodDeadline)
	defer cancel()

	names := make([]string, calls)
	asgs := make(map[string]cluster.Assignment, calls)
	for i := range names {
		names[i] = fmt.Sprintf("moved-%d", i)
	}
	for name, err := range createAll(ctx, f.admin, names, 2, 1) {
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	for name, a := range f.stored(t) {
		asgs[name] = a
	}
	// Both copies heartbeat at the assignment's epoch, level: the
	// follower is in sync, so a handover to it is made.
	for _, node := range []string{"b1", "b2"} {
		shards := map[int]map[string]cluster.CopyTails{}
		for name, a := range asgs {
			role := cluster.RoleFollower
			if a.Owner == node {
				role = cluster.RoleOwner
			}
			sh := cluster.HeartbeatShard(name)
			if shards[sh] == nil {
				shards[sh] = map[string]cluster.CopyTails{}
			}
			shards[sh][name] = cluster.CopyTails{Epoch: a.Epoch, Role: role}
		}
		for sh, streams := range shards {
			hb := cluster.Heartbeat{Node: node, Shard: sh, Time: time.Now().UTC(), Streams: streams}
			if _, err := f.cli.Put(ctx, f.schema.HeartbeatKey(node, sh), cluster.Encode(hb)); err != nil {
				t.Fatal(err)
			}
		}
	}

	type answer struct {
		res *connect.Response[strandv1.FailoverResponse]
		err error
	}
	answers := make(map[string]answer, calls)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, a := range asgs {
		wg.Go(func() {
			res, err := f.admin.Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: name, To: a.Followers[0], Who: "test", Why: "fill the admission with waits"}))
			mu.Lock()
			answers[name] = answer{res, err}
			mu.Unlock()
		})
	}
	// Every handover has recorded its recovery: each call is in its wait
	// for the commit now, which nothing makes yet.
	clustertest.Eventually(t, 30*time.Second, "every handover recorded its recovery", func() error {
		resp, err := f.cli.Get(ctx, f.schema.RecoveriesDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count != calls {
			return fmt.Errorf("%d recoveries of %d", resp.Count, calls)
		}
		return nil
	})
	if _, err := f.admin.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "admitted", Copies: 2})); err != nil {
		t.Fatalf("CreateStream while %d handovers wait for their commit: %v, want it admitted", calls, err)
	}
	// Commit each move as the recoverer would (the target promoted at the
	// fence epoch): every handover answers with that assignment.
	for name, a := range asgs {
		next := a
		next.Epoch, next.Owner, next.Followers = a.Epoch+1, a.Followers[0], []string{a.Owner}
		if _, err := f.cli.Txn(ctx).Then(clientv3.OpPut(f.schema.AssignmentKey(name), cluster.Encode(next)), clientv3.OpDelete(f.schema.RecoveryKey(name))).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	for name, a := range asgs {
		ans := answers[name]
		if ans.err != nil {
			t.Fatalf("handover of %s: %v", name, ans.err)
		}
		got := ans.res.Msg.GetAssignment()
		if got.GetEpoch() != a.Epoch+1 || got.GetOwner() != a.Followers[0] {
			t.Fatalf("handover of %s answered assignment %v, want epoch %d owned by %s", name, got, a.Epoch+1, a.Followers[0])
		}
	}
}
