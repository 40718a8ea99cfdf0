package transition

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// newCommitter returns a committer whose term holds the controller
// election key "me" in a fresh etcd, and the key.
func newCommitter(t *testing.T, ctx context.Context) (*clientv3.Client, Committer, string) {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	schema := cluster.NewSchema("")
	electionKey := schema.ControllerElection() + "/me"
	put, err := cli.Put(ctx, electionKey, "me")
	if err != nil {
		t.Fatal(err)
	}
	return cli, Committer{Term: leader.NewTerm(cli, electionKey, put.Header.Revision, make(chan struct{})), Schema: schema}, electionKey
}

func TestFastPathCommitIsGuarded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, c, electionKey := newCommitter(t, ctx)
	schema := c.Schema

	old := cluster.Assignment{Stream: "s", Epoch: 5, Owner: "b1", Followers: []string{"b2"}, Policy: majority}
	if _, err := cli.Put(ctx, schema.AssignmentKey("s"), cluster.Encode(old)); err != nil {
		t.Fatal(err)
	}
	read := func() state.Versioned[cluster.Assignment] {
		snap, err := state.Load(ctx, cli, schema)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Assignments["s"]
	}
	v := read()
	next := old
	next.Followers = []string{"b2", "b3"}

	// Not a fast-path change (W' 2 > W 2 - 1 removed): refused before
	// writing.
	swap := old
	swap.Followers = []string{"b3"}
	if err := c.FastPath(ctx, v, swap); !errors.Is(err, ErrNotFastPath) {
		t.Fatalf("replacing a follower: %v, want ErrNotFastPath", err)
	}
	// A stale mod revision loses.
	stale := v
	stale.ModRev--
	if err := c.FastPath(ctx, stale, next); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale revision: %v, want ErrConflict", err)
	}
	// A pending recovery blocks it.
	if _, err := cli.Put(ctx, schema.RecoveryKey("s"), "{}"); err != nil {
		t.Fatal(err)
	}
	if err := c.FastPath(ctx, v, next); !errors.Is(err, ErrConflict) {
		t.Fatalf("pending recovery: %v, want ErrConflict", err)
	}
	if _, err := cli.Delete(ctx, schema.RecoveryKey("s")); err != nil {
		t.Fatal(err)
	}
	if got := read(); got.ModRev != v.ModRev {
		t.Fatalf("refused commits changed the assignment: %+v", got)
	}

	next.Epoch = 99 // the fast path keeps the epoch whatever it is given
	if err := c.FastPath(ctx, v, next); err != nil {
		t.Fatal(err)
	}
	got := read()
	if got.Value.Epoch != 5 || len(got.Value.Followers) != 2 || got.Value.Followers[1] != "b3" {
		t.Fatalf("committed %+v", got.Value)
	}

	// A deposed leader writes nothing.
	if _, err := cli.Delete(ctx, electionKey); err != nil {
		t.Fatal(err)
	}
	again := got.Value
	again.Followers = append(again.Followers, "b4")
	again.Policy = cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}
	if err := c.FastPath(ctx, got, again); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("deposed: %v, want ErrNotLeader", err)
	}
	if final := read(); final.ModRev != got.ModRev {
		t.Fatalf("deposed leader changed the assignment: %+v", final.Value)
	}
}

// Seal refusals describe the recovery pending beside them: every write that
// records or clears a recovery deletes them, so attention never shows a
// refusal of a recovery that is gone.
func TestRecoveryWritesDropSealRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, c, _ := newCommitter(t, ctx)
	schema := c.Schema
	old := cluster.Assignment{Stream: "s", Epoch: 5, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}
	rec := cluster.Recovery{Stream: "s", FromEpoch: 5, FenceEpoch: 6, TransitionID: "t1", OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2"}
	refusals := cluster.SealRefusals{Stream: "s", FenceEpoch: 6, TransitionID: "t0", R: 2,
		Refusals: []cluster.SealRefusal{{Node: "b3", Code: "failed_precondition", Error: "refused"}}}
	for _, kv := range []struct {
		key string
		v   any
	}{{schema.AssignmentKey("s"), old}, {schema.RefusalsKey("s"), refusals}} {
		if _, err := cli.Put(ctx, kv.key, cluster.Encode(kv.v)); err != nil {
			t.Fatal(err)
		}
	}
	load := func() *state.Snapshot {
		t.Helper()
		snap, err := state.Load(ctx, cli, schema)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	putRefusals := func() {
		t.Helper()
		if _, err := cli.Put(ctx, schema.RefusalsKey("s"), cluster.Encode(refusals)); err != nil {
			t.Fatal(err)
		}
		if got := load().Refusals["s"].Value; got.TransitionID != refusals.TransitionID || len(got.Refusals) != 1 {
			t.Fatalf("state read refusals %+v", got)
		}
	}
	wantNone := func(after string) {
		t.Helper()
		if r, ok := load().Refusals["s"]; ok {
			t.Fatalf("refusals %+v left after %s", r.Value, after)
		}
	}

	putRefusals()
	if err := c.WriteRecovery(ctx, load().Assignments["s"].ModRev, rec); err != nil {
		t.Fatal(err)
	}
	wantNone("recording a recovery")

	putRefusals()
	if err := c.WithdrawRecovery(ctx, load(), "s"); err != nil {
		t.Fatal(err)
	}
	wantNone("withdrawing the recovery")

	if err := c.WriteRecovery(ctx, load().Assignments["s"].ModRev, rec); err != nil {
		t.Fatal(err)
	}
	putRefusals()
	next := old
	next.Epoch, next.Owner, next.Followers = 6, "b2", []string{"b3"}
	if err := c.AcceptLoss(ctx, load(), AcceptedLoss{Assignment: next}); err != nil {
		t.Fatal(err)
	}
	wantNone("accepting the owner loss")
}
