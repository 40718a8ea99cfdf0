package liveness

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// countingKV counts the transactions sent to the real etcd behind it.
type countingKV struct {
	clientv3.KV
	txns *atomic.Int64
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn {
	k.txns.Add(1)
	return k.KV.Txn(ctx)
}

// After a pass records the pending recoveries of a lost owner's streams, a
// pass on a snapshot older than that write (a view lagging behind the
// controller's own writes, as after a mass failover) neither proposes them
// again nor writes anything: each proposal's compare would fail, and in a
// batch fail the whole batch, which is then written a transaction per
// stream. A snapshot at or past the write judges the streams afresh: a
// recovery withdrawn since is recorded again.
func TestPassOnViewOlderThanItsWritesSkipsRecordedStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli := etcdtest.Start(t).Client(t)
	var txns atomic.Int64
	cli.KV = countingKV{KV: cli.KV, txns: &txns}
	schema := cluster.NewSchema("/strand")
	for _, n := range []string{"b2", "b3"} {
		if _, err := cli.Put(ctx, schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n, Address: n + ":1"})); err != nil {
			t.Fatal(err)
		}
	}
	pol := cluster.Policy{Name: cluster.MajorityDurable}
	// More streams than one batch holds (transition.Batches).
	const n = 60
	var streams []string
	for i := range n {
		s := fmt.Sprintf("s%02d", i)
		a := cluster.Assignment{Stream: s, Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: pol}
		if _, err := cli.Put(ctx, schema.AssignmentKey(s), cluster.Encode(a)); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	el, err := cli.Put(ctx, schema.ControllerElection()+"/term", "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	term := leader.NewTerm(cli, schema.ControllerElection()+"/term", el.Header.Revision, make(chan struct{}))
	l := newLoop(Config{Schema: schema, Log: zerolog.Nop()}, term)
	recorded := func() map[string]int64 {
		t.Helper()
		resp, err := cli.Get(ctx, schema.RecoveriesDir(), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, kv := range resp.Kvs {
			rec, err := cluster.Decode[cluster.Recovery](kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			out[rec.Stream] = kv.ModRevision
		}
		return out
	}

	stale, err := state.Load(ctx, cli, schema)
	if err != nil {
		t.Fatal(err)
	}
	if !l.reconcile(ctx, stale, streams) {
		t.Fatal("the first pass wrote nothing")
	}
	first := recorded()
	if len(first) != n {
		t.Fatalf("%d recoveries recorded, want %d", len(first), n)
	}

	before := txns.Load()
	if l.reconcile(ctx, stale, streams) {
		t.Fatal("a pass on a snapshot older than its own writes wrote")
	}
	if sent := txns.Load() - before; sent != 0 {
		t.Fatalf("a pass on a snapshot older than its own writes sent %d transactions, want none", sent)
	}
	if again := recorded(); fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("recoveries changed: %v, were %v", again, first)
	}

	// An operator withdraws one recovery; a snapshot past the write (and
	// the withdrawal) records it again, and leaves the others alone.
	if _, err := cli.Delete(ctx, schema.RecoveryKey("s07")); err != nil {
		t.Fatal(err)
	}
	fresh, err := state.Load(ctx, cli, schema)
	if err != nil {
		t.Fatal(err)
	}
	if !l.reconcile(ctx, fresh, streams) {
		t.Fatal("the withdrawn recovery was not recorded again")
	}
	after := recorded()
	for s, rev := range first {
		if s == "s07" {
			if after[s] <= rev {
				t.Fatalf("recovery of s07 at revision %d, want one recorded after %d", after[s], rev)
			}
		} else if after[s] != rev {
			t.Fatalf("recovery of %s rewritten: revision %d, was %d", s, after[s], rev)
		}
	}

	// A pass that looks at no stream (as an incremental pass on a change
	// elsewhere) on a snapshot past every write forgets them all: a
	// recorded stream no pass looks at again (deleted meanwhile) does not
	// stay remembered for the life of the term.
	latest, err := state.Load(ctx, cli, schema)
	if err != nil {
		t.Fatal(err)
	}
	l.reconcile(ctx, latest, nil)
	l.recordedMu.Lock()
	remembered := len(l.recordedAt)
	l.recordedMu.Unlock()
	if remembered != 0 {
		t.Fatalf("%d recorded writes remembered after a pass on a snapshot past them, want 0", remembered)
	}
}
