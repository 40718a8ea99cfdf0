package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
)

// describeCmp spells a compare as "mod(key) = 7" or "create(key) = 0".
func describeCmp(c clientv3.Cmp) string {
	pc := c.GetCompare()
	var what string
	var rev int64
	switch pc.Target {
	case etcdserverpb.Compare_MOD:
		what, rev = "mod", pc.GetModRevision()
	case etcdserverpb.Compare_CREATE:
		what, rev = "create", pc.GetCreateRevision()
	default:
		what = pc.Target.String()
	}
	if pc.Result != etcdserverpb.Compare_EQUAL {
		what += " " + pc.Result.String()
	}
	return fmt.Sprintf("%s(%s) = %d", what, pc.Key, rev)
}

// describeOp spells an operation as "put key value" or "delete key".
func describeOp(o clientv3.Op) string {
	switch {
	case o.IsPut():
		return fmt.Sprintf("put %s %s", o.KeyBytes(), o.ValueBytes())
	case o.IsDelete():
		return fmt.Sprintf("delete %s", o.KeyBytes())
	}
	return fmt.Sprintf("other %s", o.KeyBytes())
}

func TestRecoveryCommitTable(t *testing.T) {
	schema := cluster.NewSchema("/strand")
	next := cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b2", Followers: []string{"b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
	starts := cluster.HistoryStarts{{Epoch: 1, Node: "b1"}, {Epoch: 4, RecordTail: 10, CursorEventTail: 2, Node: "b2"}}
	leaderGuard := clientv3.Compare(clientv3.CreateRevision("/strand/election/recoverer/abc"), "=", 42)
	putAsg := "put /strand/assignments/s " + cluster.Encode(next)
	putHist := "put /strand/history/s " + cluster.Encode(starts)
	cases := []struct {
		name     string
		guards   cluster.RecoveryGuards
		starts   cluster.HistoryStarts
		wantCmps []string
		wantOps  []string
	}{
		{
			name:   "recoverer promotion: every key read, the leader key guards",
			guards: cluster.RecoveryGuards{AssignmentRev: 7, RecoveryRev: 9, HistoryRev: 5, Writer: []clientv3.Cmp{leaderGuard}},
			starts: starts,
			wantCmps: []string{
				"mod(/strand/assignments/s) = 7", "mod(/strand/recoveries/s) = 9", "mod(/strand/history/s) = 5",
				"create(/strand/election/recoverer/abc) = 42",
			},
			wantOps: []string{putAsg, "delete /strand/recoveries/s", "delete /strand/refusals/s", putHist},
		},
		{
			name:     "first history start: the history must still be absent",
			guards:   cluster.RecoveryGuards{AssignmentRev: 7, RecoveryRev: 9, Writer: []clientv3.Cmp{leaderGuard}},
			starts:   starts,
			wantCmps: []string{"mod(/strand/assignments/s) = 7", "mod(/strand/recoveries/s) = 9", "create(/strand/history/s) = 0", "create(/strand/election/recoverer/abc) = 42"},
			wantOps:  []string{putAsg, "delete /strand/recoveries/s", "delete /strand/refusals/s", putHist},
		},
		{
			name:     "accepted loss with no recovery pending and no start: the term guards outside",
			guards:   cluster.RecoveryGuards{AssignmentRev: 7, HistoryRev: 5},
			wantCmps: []string{"mod(/strand/assignments/s) = 7", "create(/strand/recoveries/s) = 0", "mod(/strand/history/s) = 5"},
			wantOps:  []string{putAsg, "delete /strand/recoveries/s", "delete /strand/refusals/s"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmps, ops := cluster.RecoveryCommit(schema, c.guards, next, c.starts)
			var gotCmps, gotOps []string
			for _, cmp := range cmps {
				gotCmps = append(gotCmps, describeCmp(cmp))
			}
			for _, op := range ops {
				gotOps = append(gotOps, describeOp(op))
			}
			if !slices.Equal(gotCmps, c.wantCmps) {
				t.Errorf("compares\n got %q\nwant %q", gotCmps, c.wantCmps)
			}
			if !slices.Equal(gotOps, c.wantOps) {
				t.Errorf("operations\n got %q\nwant %q", gotOps, c.wantOps)
			}
		})
	}
}

// recoveryRead is the mod revisions of a stream's assignment, pending
// recovery and history starts (0 when absent).
func recoveryRead(t *testing.T, cli *clientv3.Client, schema cluster.Schema, stream string) cluster.RecoveryGuards {
	t.Helper()
	rev := func(key string) int64 {
		resp, err := cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].ModRevision
	}
	return cluster.RecoveryGuards{
		AssignmentRev: rev(schema.AssignmentKey(stream)),
		RecoveryRev:   rev(schema.RecoveryKey(stream)),
		HistoryRev:    rev(schema.HistoryKey(stream)),
	}
}

// The commit compares every mod revision it read: any change in between
// makes it fail and write nothing (docs/protocol.md, "Stream failover").
func TestRecoveryCommitGuardedByReadRevisions(t *testing.T) {
	const stream = "orders"
	schema := cluster.NewSchema("/strand")
	assignment := cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
	recovery := cluster.Recovery{Stream: stream, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t1", OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2"}
	history := cluster.HistoryStarts{{Epoch: 1, RecordTail: 0, Node: "b1"}}
	refusals := cluster.SealRefusals{Stream: stream, FenceEpoch: 4, TransitionID: "t1", R: 2,
		Refusals: []cluster.SealRefusal{{Node: "b3", Code: "failed_precondition", Error: "refused"}}}
	cli := etcdtest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(t *testing.T, key string, v any) {
		t.Helper()
		if _, err := cli.Put(ctx, key, cluster.Encode(v)); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	del := func(t *testing.T, key string) {
		t.Helper()
		if _, err := cli.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}

	cases := []struct {
		name        string
		withHistory bool
		change      func(t *testing.T)
		want        bool
	}{
		{"nothing changed", true, func(*testing.T) {}, true},
		{"nothing changed, no history yet", false, func(*testing.T) {}, true},
		{"assignment rewritten", true, func(t *testing.T) { put(t, schema.AssignmentKey(stream), assignment) }, false},
		{"recovery rewritten", true, func(t *testing.T) { put(t, schema.RecoveryKey(stream), recovery) }, false},
		{"history appended", true, func(t *testing.T) {
			put(t, schema.HistoryKey(stream), append(slices.Clone(history), cluster.HistoryStart{Epoch: 3, RecordTail: 5, Node: "b3"}))
		}, false},
		{"history recorded where there was none", false, func(t *testing.T) {
			put(t, schema.HistoryKey(stream), cluster.HistoryStarts{{Epoch: 3, RecordTail: 5, Node: "b3"}})
		}, false},
		{"recovery withdrawn", true, func(t *testing.T) { del(t, schema.RecoveryKey(stream)) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			del(t, schema.HistoryKey(stream))
			put(t, schema.AssignmentKey(stream), assignment)
			put(t, schema.RecoveryKey(stream), recovery)
			put(t, schema.RefusalsKey(stream), refusals)
			var starts cluster.HistoryStarts
			if c.withHistory {
				put(t, schema.HistoryKey(stream), history)
				starts = slices.Clone(history)
			}
			starts = append(starts, cluster.HistoryStart{Epoch: 4, RecordTail: 10, CursorEventTail: 2, Node: "b2"})
			read := recoveryRead(t, cli, schema, stream)
			c.change(t)
			before := recoveryRead(t, cli, schema, stream)

			next := cluster.Assignment{Stream: stream, Epoch: 4, Owner: "b2", Followers: []string{"b3"}, Policy: assignment.Policy}
			cmps, ops := cluster.RecoveryCommit(schema, read, next, starts)
			resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil {
				t.Fatalf("commit: %v", err)
			}
			if resp.Succeeded != c.want {
				t.Fatalf("committed %v, want %v", resp.Succeeded, c.want)
			}
			after := recoveryRead(t, cli, schema, stream)
			if !resp.Succeeded {
				if after.AssignmentRev != before.AssignmentRev || after.RecoveryRev != before.RecoveryRev || after.HistoryRev != before.HistoryRev {
					t.Fatalf("a failed commit wrote something: before %+v after %+v", before, after)
				}
				return
			}
			if after.RecoveryRev != 0 {
				t.Fatal("the recovery is still pending after the commit")
			}
			if got, err := cli.Get(ctx, schema.RefusalsKey(stream)); err != nil || len(got.Kvs) != 0 {
				t.Fatalf("seal refusals left after the commit (%v)", err)
			}
			get := func(key string) []byte {
				resp, err := cli.Get(ctx, key)
				if err != nil || len(resp.Kvs) != 1 {
					t.Fatalf("read %s: %v", key, err)
				}
				return resp.Kvs[0].Value
			}
			gotAsg, err := cluster.Decode[cluster.Assignment](get(schema.AssignmentKey(stream)))
			if err != nil {
				t.Fatal(err)
			}
			gotHist, err := cluster.Decode[cluster.HistoryStarts](get(schema.HistoryKey(stream)))
			if err != nil {
				t.Fatal(err)
			}
			if gotAsg.Epoch != 4 || gotAsg.Owner != "b2" || !slices.Equal(gotAsg.Followers, []string{"b3"}) {
				t.Fatalf("assignment %+v", gotAsg)
			}
			if !slices.Equal(gotHist, starts) {
				t.Fatalf("history %+v, want %+v", gotHist, starts)
			}
			// One transaction: the keys carry the same mod revision.
			if after.AssignmentRev != after.HistoryRev {
				t.Fatalf("assignment at %d, history at %d: not one write", after.AssignmentRev, after.HistoryRev)
			}
		})
	}
}
