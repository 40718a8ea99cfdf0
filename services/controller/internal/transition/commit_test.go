package transition

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

func TestFastPathCommitIsGuarded(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	schema := cluster.NewSchema("")
	electionKey := schema.ControllerElection() + "/me"
	put, err := cli.Put(ctx, electionKey, "me")
	if err != nil {
		t.Fatal(err)
	}
	c := Committer{Term: leader.NewTerm(cli, electionKey, put.Header.Revision, make(chan struct{})), Schema: schema}

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

	// Not a fast-path change: refused before writing.
	drop := old
	drop.Followers = nil
	if err := c.FastPath(ctx, v, drop); !errors.Is(err, ErrNotFastPath) {
		t.Fatalf("dropping a follower: %v, want ErrNotFastPath", err)
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
