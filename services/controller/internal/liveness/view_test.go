package liveness

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// An owner whose broker key goes while the controller's view is cut off
// from etcd, in a gap compacted before the view is back, is lost all the
// same: the view loads again, the broker is absent from the load, and the
// loop records the pending recovery it would have recorded for the delete
// event.
func TestOwnerLostInACompactedGap(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	fwd := srv.Forward(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	schema := cluster.NewSchema("/strand")

	leases := map[string]clientv3.LeaseID{}
	for _, n := range []string{"b1", "b2", "b3"} {
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		leases[n] = l.ID
		if _, err := cli.Put(ctx, schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n, Address: n + ":1"}), clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
	}
	pol := cluster.Policy{Name: cluster.MajorityDurable}
	if _, err := cli.Put(ctx, schema.StreamKey("s"), cluster.Encode(cluster.StreamSpec{Name: "s", Copies: 3, Policy: pol})); err != nil {
		t.Fatal(err)
	}
	asg, err := cli.Put(ctx, schema.AssignmentKey("s"), cluster.Encode(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: pol}))
	if err != nil {
		t.Fatal(err)
	}
	el, err := cli.Put(ctx, schema.ControllerElection()+"/term", "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	term := leader.NewTerm(cli, schema.ControllerElection()+"/term", el.Header.Revision, make(chan struct{}))

	view := state.NewView(fwd.Client(t), schema, zerolog.Nop())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = view.Run(runCtx); done <- struct{}{} }()
	defer func() { stop(); <-done; <-done }()
	if _, err := view.WaitRev(ctx, asg.Header.Revision); err != nil {
		t.Fatal(err)
	}

	fwd.Cut()
	go func() {
		_ = Run(runCtx, Config{View: view, Schema: schema, Log: zerolog.Nop(), ProbeGrace: time.Second,
			Probe: func(context.Context, string) error { return nil }}, term)
		done <- struct{}{}
	}()
	if _, err := cli.Revoke(ctx, leases["b1"]); err != nil {
		t.Fatal(err)
	}
	// Compacted past the delete: the view's watch cannot deliver it.
	after, err := cli.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, after.Header.Revision); err != nil {
		t.Fatal(err)
	}
	// Nothing is recorded while the view cannot see the loss.
	rec, err := cli.Get(ctx, schema.RecoveryKey("s"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Kvs) != 0 {
		t.Fatalf("a recovery was recorded before the view saw the loss: %s", rec.Kvs[0].Value)
	}
	wch := cli.Watch(ctx, schema.RecoveryKey("s"), clientv3.WithRev(rec.Header.Revision+1))
	fwd.Resume()

	select {
	case resp := <-wch:
		if err := resp.Err(); err != nil || len(resp.Events) == 0 {
			t.Fatalf("watching for the recovery: %v", err)
		}
		r, err := cluster.Decode[cluster.Recovery](resp.Events[0].Kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		if r.OldOwner != "b1" || r.FenceEpoch != 2 || r.ProposedOwner == "b1" {
			t.Fatalf("recovery %+v, want b1 replaced at fence epoch 2", r)
		}
	case <-ctx.Done():
		t.Fatal("no pending recovery recorded for an owner lost in a compacted gap")
	}
	if n := view.Loads(); n != 2 {
		t.Fatalf("the view loaded %d times, want once more after the compacted gap", n)
	}
}
