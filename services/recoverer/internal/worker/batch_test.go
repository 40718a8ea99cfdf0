package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
)

// batchFixture stores n streams, each with a 3-copy assignment at epoch 3,
// a pending recovery from it and one history start, and reads each
// stream's snapshot as an attempt would.
type batchFixture struct {
	cli     *clientv3.Client
	streams []string
	reqs    []commitReq
}

func newBatchFixture(t testing.TB, cli *clientv3.Client, n int) *batchFixture {
	t.Helper()
	ctx := context.Background()
	f := &batchFixture{cli: cli}
	for i := range n {
		s := fmt.Sprintf("s%02d", i)
		a := cluster.Assignment{Stream: s, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
		r := cluster.Recovery{Stream: s, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t-" + s, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2"}
		h := cluster.HistoryStarts{{Epoch: 1, Node: "b1"}}
		for key, v := range map[string]any{schema.AssignmentKey(s): a, schema.RecoveryKey(s): r, schema.HistoryKey(s): h} {
			if _, err := cli.Put(ctx, key, cluster.Encode(v)); err != nil {
				t.Fatal(err)
			}
		}
		f.streams = append(f.streams, s)
	}
	for _, s := range f.streams {
		snap, err := readSnapshot(ctx, cli, schema, s)
		if err != nil {
			t.Fatal(err)
		}
		next := cluster.Assignment{Stream: s, Epoch: 4, Owner: "b2", Followers: []string{"b3", "b1"}, Policy: snap.assignment.Policy}
		starts := append(snap.history, cluster.HistoryStart{Epoch: 4, RecordTail: 7, Node: "b2"})
		f.reqs = append(f.reqs, commitReq{snap: snap, next: next, starts: starts})
	}
	return f
}

// committed reports whether stream's recovery was committed (the new
// assignment, the recovery gone, the start appended) or left exactly as it
// was, and fails on anything in between.
func (f *batchFixture) committed(t *testing.T, stream string) bool {
	t.Helper()
	snap, err := readSnapshot(context.Background(), f.cli, schema, stream)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case snap.assignment.Epoch == 4 && !snap.hasRecovery() && len(snap.history) == 2 && snap.assignment.Owner == "b2":
		return true
	case snap.assignment.Epoch == 3 && snap.hasRecovery() && len(snap.history) == 1:
		return false
	}
	t.Fatalf("%s half committed: %+v", stream, snap)
	return false
}

// A batch commits every stream whose compares hold, in one transaction.
func TestCommitBatchCommitsEveryStream(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	_, leader := campaign(t, cli)
	f := newBatchFixture(t, cli, maxCommitBatch)
	before, err := cli.Get(context.Background(), "anything")
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range commitBatch(context.Background(), cli, schema, leader, f.reqs) {
		if !res.committed || res.err != nil {
			t.Fatalf("%s: committed %v err %v", f.streams[i], res.committed, res.err)
		}
	}
	for _, s := range f.streams {
		if !f.committed(t, s) {
			t.Fatalf("%s not committed", s)
		}
	}
	after, err := cli.Get(context.Background(), "anything")
	if err != nil {
		t.Fatal(err)
	}
	if d := after.Header.Revision - before.Header.Revision; d != 1 {
		t.Fatalf("%d streams committed in %d revisions, want one transaction", len(f.streams), d)
	}
}

// Each stream's commit in a batch compares every mod revision its attempt
// read (docs/protocol.md, "The guarded commit"): a change to any one of a
// stream's keys since its read refuses that stream's commit, and only
// that stream's: the others of the batch still commit.
func TestCommitBatchRefusesOnlyTheChangedStream(t *testing.T) {
	changes := map[string]func(t *testing.T, cli *clientv3.Client, stream string){
		"assignment": func(t *testing.T, cli *clientv3.Client, s string) {
			a := cluster.Assignment{Stream: s, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
			mustPut(t, cli, schema.AssignmentKey(s), cluster.Encode(a))
		},
		"recovery": func(t *testing.T, cli *clientv3.Client, s string) {
			r := cluster.Recovery{Stream: s, FromEpoch: 3, FenceEpoch: 4, TransitionID: "rewritten", OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b3"}
			mustPut(t, cli, schema.RecoveryKey(s), cluster.Encode(r))
		},
		"history starts": func(t *testing.T, cli *clientv3.Client, s string) {
			mustPut(t, cli, schema.HistoryKey(s), cluster.Encode(cluster.HistoryStarts{{Epoch: 1, Node: "b1"}}))
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			cli := etcdtest.Start(t).Client(t)
			_, leader := campaign(t, cli)
			f := newBatchFixture(t, cli, 5)
			const changed = 2
			change(t, cli, f.streams[changed])
			res := commitBatch(context.Background(), cli, schema, leader, f.reqs)
			for i, s := range f.streams {
				if res[i].err != nil {
					t.Fatalf("%s: %v", s, res[i].err)
				}
				got := f.committed(t, s)
				if want := i != changed; got != want || res[i].committed != want {
					t.Fatalf("%s: committed %v (reported %v), want %v", s, got, res[i].committed, want)
				}
			}
		})
	}
}

// A deposed leader commits none of a batch, and every stream of it hears
// so.
func TestCommitBatchDeposedCommitsNothing(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	session, old := campaign(t, cli)
	f := newBatchFixture(t, cli, 4)
	if err := session.Close(); err != nil {
		t.Fatal(err)
	}
	campaign(t, cli)
	for i, res := range commitBatch(context.Background(), cli, schema, old, f.reqs) {
		if res.committed || !errors.Is(res.err, errDeposed) {
			t.Fatalf("%s: committed %v err %v, want errDeposed", f.streams[i], res.committed, res.err)
		}
		if f.committed(t, f.streams[i]) {
			t.Fatalf("%s committed by a deposed leader", f.streams[i])
		}
	}
}

// A batch etcd refuses whole (here: two requests for one stream, which
// etcd refuses as a duplicate key) is written again stream by stream: each
// stream gets its own answer, and nothing is committed twice.
func TestCommitBatchRefusedWholeFallsBackToEachStream(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	_, leader := campaign(t, cli)
	f := newBatchFixture(t, cli, 3)
	reqs := append(f.reqs, f.reqs[1])
	res := commitBatch(context.Background(), cli, schema, leader, reqs)
	for i := range f.streams {
		if !res[i].committed || res[i].err != nil {
			t.Fatalf("%s: committed %v err %v", f.streams[i], res[i].committed, res[i].err)
		}
		if !f.committed(t, f.streams[i]) {
			t.Fatalf("%s not committed", f.streams[i])
		}
	}
	// The repeat read the state the first commit changed: refused.
	if last := res[len(res)-1]; last.committed || last.err != nil {
		t.Fatalf("repeated request: committed %v err %v, want refused", last.committed, last.err)
	}
}

func mustPut(t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	if _, err := cli.Put(context.Background(), key, value); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCommit measures what committing a mass failover's promotions
// costs on a real etcd: one transaction per stream (batch 1, the commit
// before batching) against batches as runCommits forms them under load.
// Each op commits 256 streams, commitsInFlight transactions at a time;
// ns/stream and revisions/stream are the figures to compare.
func BenchmarkCommit(b *testing.B) {
	for _, size := range []int{1, maxCommitBatch} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			cli := etcdtest.Start(b).Client(b)
			_, leader := campaign(b, cli)
			const streams = 256
			var revs int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				// Clean slate for the fixture's keys (names repeat per op).
				for _, dir := range []string{schema.AssignmentsDir(), schema.RecoveriesDir(), schema.HistoryDir()} {
					if _, err := cli.Delete(context.Background(), dir, clientv3.WithPrefix()); err != nil {
						b.Fatal(err)
					}
				}
				f := newBatchFixture(b, cli, streams)
				start, err := cli.Get(context.Background(), "rev")
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				sem := make(chan struct{}, commitsInFlight)
				var wg sync.WaitGroup
				for lo := 0; lo < streams; lo += size {
					batch := f.reqs[lo:min(lo+size, streams)]
					sem <- struct{}{}
					wg.Go(func() {
						defer func() { <-sem }()
						for _, res := range commitBatch(context.Background(), cli, schema, leader, batch) {
							if !res.committed || res.err != nil {
								b.Errorf("committed %v err %v", res.committed, res.err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				end, err := cli.Get(context.Background(), "rev")
				if err != nil {
					b.Fatal(err)
				}
				revs += end.Header.Revision - start.Header.Revision
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*streams), "ns/stream")
			b.ReportMetric(float64(revs)/float64(b.N*streams), "revisions/stream")
		})
	}
}
