package cluster_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
)

// ReadAtLeast answers at or past the revision it is given: serializable
// when the member has applied it, read again linearizably when the
// serializable answer is older, linearizable alone without a revision, and
// a failed serializable read is not sent again.
func TestReadAtLeast(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	kinds := &clustertest.TxnKinds{KV: cli.KV}
	cli.KV = kinds
	ctx := context.Background()
	put, err := cli.Put(ctx, "/k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	gets := func(opts ...clientv3.OpOption) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet("/k", opts...), clientv3.OpGet("/missing", opts...)}
	}
	kinds.Kinds()
	for _, tc := range []struct {
		name    string
		atLeast int64
		want    string
	}{
		{"applied revision", put.Header.Revision, "serializable"},
		{"no revision", 0, "linearizable"},
		{"revision not reached", put.Header.Revision + 1000, "serializable,linearizable"},
	} {
		resp, err := cluster.ReadAtLeast(ctx, cli, tc.atLeast, gets)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := kinds.Kinds(); got != tc.want {
			t.Errorf("%s: transactions %q, want %q", tc.name, got, tc.want)
		}
		if len(resp.Responses) != 2 || resp.Header.Revision < put.Header.Revision {
			t.Fatalf("%s: %d responses at revision %d, want 2 at or past %d", tc.name, len(resp.Responses), resp.Header.Revision, put.Header.Revision)
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) != 1 || string(kvs[0].Value) != "v1" || len(resp.Responses[1].GetResponseRange().GetKvs()) != 0 {
			t.Fatalf("%s: read %v, want /k=v1 and nothing else", tc.name, resp.Responses)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := cluster.ReadAtLeast(cancelled, cli, put.Header.Revision, gets); err == nil {
		t.Fatal("a read with an ended context succeeded")
	}
	if got := kinds.Kinds(); got != "serializable" {
		t.Errorf("a failed serializable read: transactions %q, want %q (not sent again)", got, "serializable")
	}
}

func TestAtLeastAll(t *testing.T) {
	id := func(r int64) int64 { return r }
	for _, tc := range []struct {
		revs []int64
		want int64
	}{
		{nil, 0},
		{[]int64{7}, 7},
		{[]int64{3, 9, 4}, 9},
		{[]int64{3, 0, 9}, 0},
		{[]int64{9, 3, -1}, 0},
	} {
		if got := cluster.AtLeastAll(tc.revs, id); got != tc.want {
			t.Errorf("AtLeastAll(%v) = %d, want %d", tc.revs, got, tc.want)
		}
	}
}
