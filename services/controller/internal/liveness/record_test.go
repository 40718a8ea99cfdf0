package liveness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// The recoveries of a lost owner's streams are recorded in batches; a batch
// that fails because one stream moved since it was read is written again
// stream by stream, so every other stream of it is recorded and only the
// one that moved waits for the next read.
func TestRecordRecoveriesKeepsTheRestOfAFailedBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)
	schema := cluster.NewSchema("")
	electionKey := schema.ControllerElection() + "/me"
	put, err := cli.Put(ctx, electionKey, "me")
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{
		cfg:    Config{Schema: schema, Log: zerolog.Nop()},
		commit: transition.Committer{Term: leader.NewTerm(cli, electionKey, put.Header.Revision, make(chan struct{})), Schema: schema},
	}
	majority := cluster.Policy{Name: cluster.MajorityDurable}
	const n, stale = 70, "s05"
	var writes []pendingWrite
	for i := range n {
		stream := fmt.Sprintf("s%02d", i)
		a := cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}
		put, err := cli.Put(ctx, schema.AssignmentKey(stream), cluster.Encode(a))
		if err != nil {
			t.Fatal(err)
		}
		writes = append(writes, pendingWrite{msg: "owner lost; pending recovery recorded", write: transition.RecoveryWrite{
			AsgModRev: put.Header.Revision, Rec: transition.Stamp(cluster.Recovery{
				Stream: stream, FromEpoch: 3, FenceEpoch: 4, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2",
				Policy: majority, Reason: "owner b1 lost: its broker lease ended",
			}, time.Now()),
		}})
	}
	// One stream of the first batch moved after it was read.
	moved := cluster.Assignment{Stream: stale, Epoch: 3, Owner: "b1", Followers: []string{"b2"}, Policy: majority}
	if _, err := cli.Put(ctx, schema.AssignmentKey(stale), cluster.Encode(moved)); err != nil {
		t.Fatal(err)
	}

	l.recordRecoveries(ctx, writes)

	resp, err := cli.Get(ctx, schema.RecoveriesDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, kv := range resp.Kvs {
		rec, err := cluster.Decode[cluster.Recovery](kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		got[rec.Stream] = true
	}
	for _, w := range writes {
		if want := w.write.Rec.Stream != stale; got[w.write.Rec.Stream] != want {
			t.Errorf("recovery of %s recorded: %v, want %v", w.write.Rec.Stream, got[w.write.Rec.Stream], want)
		}
	}
	if len(got) != n-1 {
		t.Errorf("%d recoveries recorded, want %d", len(got), n-1)
	}
}
