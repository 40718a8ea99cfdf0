package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/gather"
)

// snapshotCases are the states a stream's keys can be in, each stored by
// its function.
var snapshotCases = map[string]func(s string) map[string]string{
	"complete": func(s string) map[string]string {
		return map[string]string{
			schema.AssignmentKey(s): cluster.Encode(cluster.Assignment{Stream: s, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}}),
			schema.RecoveryKey(s):   cluster.Encode(cluster.Recovery{Stream: s, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t-" + s, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2"}),
			schema.HistoryKey(s):    cluster.Encode(cluster.HistoryStarts{{Epoch: 1, Node: "b1"}, {Epoch: 2, RecordTail: 9, CursorEventTail: 1, Node: "b2"}}),
			schema.RefusalsKey(s): cluster.Encode(cluster.SealRefusals{Stream: s, FenceEpoch: 4, TransitionID: "t-" + s, R: 2, Sealed: []string{"b2"},
				Refusals: []cluster.SealRefusal{{Node: "b3", Code: "unavailable", Error: "busy", Since: time.Unix(1700000000, 0).UTC()}}}),
		}
	},
	"no recovery": func(s string) map[string]string {
		return map[string]string{
			schema.AssignmentKey(s): cluster.Encode(cluster.Assignment{Stream: s, Epoch: 5, Owner: "b2", Policy: cluster.Policy{Name: cluster.MajorityDurable}}),
			schema.HistoryKey(s):    cluster.Encode(cluster.HistoryStarts{{Epoch: 5, Node: "b2"}}),
		}
	},
	"no assignment": func(s string) map[string]string {
		return map[string]string{
			schema.RecoveryKey(s): cluster.Encode(cluster.Recovery{Stream: s, FromEpoch: 1, FenceEpoch: 2, TransitionID: "t", OldOwner: "b1"}),
		}
	},
	"no history starts": func(s string) map[string]string {
		return map[string]string{
			schema.AssignmentKey(s): cluster.Encode(cluster.Assignment{Stream: s, Epoch: 1, Owner: "b1", Followers: []string{"b2"}}),
			schema.RecoveryKey(s):   cluster.Encode(cluster.Recovery{Stream: s, FromEpoch: 1, FenceEpoch: 2, TransitionID: "t", OldOwner: "b1", OldFollowers: []string{"b2"}}),
		}
	},
	"nothing": func(string) map[string]string { return nil },
	"unreadable assignment": func(s string) map[string]string {
		return map[string]string{schema.AssignmentKey(s): "{", schema.RecoveryKey(s): cluster.Encode(cluster.Recovery{Stream: s, TransitionID: "t"})}
	},
	"unreadable recovery": func(s string) map[string]string {
		return map[string]string{schema.AssignmentKey(s): cluster.Encode(cluster.Assignment{Stream: s, Epoch: 1}), schema.RecoveryKey(s): "not json"}
	},
	"unreadable history starts": func(s string) map[string]string {
		return map[string]string{
			schema.AssignmentKey(s): cluster.Encode(cluster.Assignment{Stream: s, Epoch: 1, Owner: "b1"}),
			schema.RecoveryKey(s):   cluster.Encode(cluster.Recovery{Stream: s, FromEpoch: 1, FenceEpoch: 2, TransitionID: "t"}),
			schema.HistoryKey(s):    "{not json",
		}
	},
	// Only attention reads refusals: unreadable counts as absent, never
	// as a failed read.
	"unreadable refusals": func(s string) map[string]string {
		return map[string]string{
			schema.AssignmentKey(s): cluster.Encode(cluster.Assignment{Stream: s, Epoch: 1, Owner: "b1"}),
			schema.RecoveryKey(s):   cluster.Encode(cluster.Recovery{Stream: s, FromEpoch: 1, FenceEpoch: 2, TransitionID: "t"}),
			schema.RefusalsKey(s):   "][",
		}
	},
}

// storeSnapshotStreams stores n streams, each in a state of snapshotCases
// picked at random (every state at least once when n allows), and some
// registrations (one without an address, one key naming no broker). It
// returns the streams and the state each is in.
func storeSnapshotStreams(t testing.TB, cli *clientv3.Client, n int, rng *rand.Rand) (streams []string, states map[string]string) {
	t.Helper()
	names := make([]string, 0, len(snapshotCases))
	for name := range snapshotCases {
		names = append(names, name)
	}
	// Map order is random: a fixed order, so the seed alone decides.
	slices.Sort(names)
	states = map[string]string{}
	ctx := context.Background()
	for i := range n {
		s := fmt.Sprintf("r%04d", i)
		state := names[i%len(names)]
		if i >= len(names) {
			state = names[rng.IntN(len(names))]
		}
		for key, v := range snapshotCases[state](s) {
			if _, err := cli.Put(ctx, key, v); err != nil {
				t.Fatal(err)
			}
		}
		streams = append(streams, s)
		states[s] = state
	}
	for key, v := range map[string]string{
		schema.BrokerKey("b1"): cluster.Encode(cluster.BrokerInfo{Node: "b1", Address: "127.0.0.1:1"}),
		schema.BrokerKey("b2"): cluster.Encode(cluster.BrokerInfo{Node: "b2", Address: "127.0.0.1:2"}),
		schema.BrokerKey("b3"): cluster.Encode(cluster.BrokerInfo{Node: "b3"}),
		schema.BrokerKey("b4"): "unreadable",
	} {
		if _, err := cli.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	rng.Shuffle(len(streams), func(i, j int) { streams[i], streams[j] = streams[j], streams[i] })
	return streams, states
}

// sameAsAlone fails unless got (a gathered read of stream) is what
// readSnapshot reads of it alone now: the same snapshot, or the same error.
// Nothing is written meanwhile, so both are at the same revision.
func sameAsAlone(t *testing.T, cli *clientv3.Client, stream, state string, got snapshot, gotErr error) {
	t.Helper()
	want, wantErr := readSnapshot(context.Background(), cli, schema, stream)
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
		t.Fatalf("%s (%s): gathered err %v, alone %v", stream, state, gotErr, wantErr)
	}
	if wantErr != nil {
		if !errors.Is(gotErr, cluster.ErrCorrupt) {
			t.Fatalf("%s (%s): err %v, want ErrCorrupt", stream, state, gotErr)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s (%s): gathered\n%+v\nalone\n%+v", stream, state, got, want)
	}
}

// One gathered read answers every stream of it as readSnapshot reads that
// stream alone, an undecodable value failing its own stream only, and
// every snapshot of it is of the read's one revision.
func TestReadSnapshotsAnswersEachStreamAsAlone(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	rng := rand.New(rand.NewPCG(1, 2))
	streams, states := storeSnapshotStreams(t, cli, 3*maxSnapshotBatch, rng)
	for lo := 0; lo < len(streams); lo += maxSnapshotBatch {
		batch := streams[lo:min(lo+maxSnapshotBatch, len(streams))]
		res := readSnapshots(context.Background(), cli, schema, linearizably(batch))
		if len(res) != len(batch) {
			t.Fatalf("%d answers for %d streams", len(res), len(batch))
		}
		var rev int64
		for i, s := range batch {
			sameAsAlone(t, cli, s, states[s], res[i].Value, res[i].Err)
			if res[i].Err != nil {
				continue
			}
			snap := res[i].Value
			if rev == 0 {
				rev = snap.rev
			}
			if snap.rev != rev {
				t.Fatalf("%s read at revision %d, another stream of its read at %d", s, snap.rev, rev)
			}
			if snap.stream != s {
				t.Fatalf("answer for %s names %s", s, snap.stream)
			}
		}
	}
	for state := range snapshotCases {
		found := false
		for _, st := range states {
			found = found || st == state
		}
		if !found {
			t.Fatalf("no stream in state %q", state)
		}
	}
}

// A gathered read is one revision even while the streams are written: each
// stream's mod revisions are those its keys had at the read's revision.
func TestReadSnapshotsIsOneRevisionUnderWrites(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	f := newBatchFixture(t, cli, maxSnapshotBatch)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the writer is waited for
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			s := f.streams[i%len(f.streams)]
			a := cluster.Assignment{Stream: s, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
			_, _ = cli.Put(ctx, schema.AssignmentKey(s), cluster.Encode(a))
		}
	})
	for range 20 {
		res := readSnapshots(context.Background(), cli, schema, linearizably(f.streams))
		rev := res[0].Value.rev
		for i, s := range f.streams {
			snap := res[i].Value
			if res[i].Err != nil || snap.rev != rev {
				t.Fatalf("%s: err %v, revision %d, want %d", s, res[i].Err, snap.rev, rev)
			}
			at, err := cli.Get(context.Background(), schema.AssignmentKey(s), clientv3.WithRev(rev))
			if err != nil {
				t.Fatal(err)
			}
			if len(at.Kvs) != 1 || at.Kvs[0].ModRevision != snap.assignmentRev {
				t.Fatalf("%s: assignment mod revision %d, at revision %d it was %v", s, snap.assignmentRev, rev, at.Kvs)
			}
			for _, mod := range []int64{snap.assignmentRev, snap.recoveryRev, snap.historyRev} {
				if mod > rev {
					t.Fatalf("%s: mod revision %d after the read's revision %d", s, mod, rev)
				}
			}
		}
	}
}

// etcd refuses a transaction of more than --max-txn-ops operations: a
// batch of maxSnapshotBatch streams is read, one more stream would be
// refused, and a refused read fails every stream of it with the error,
// none answered as "no recovery".
func TestReadSnapshotsBoundAndFailedRead(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	f := newBatchFixture(t, cli, maxSnapshotBatch+1)
	for i, r := range readSnapshots(context.Background(), cli, schema, linearizably(f.streams[:maxSnapshotBatch])) {
		if r.Err != nil || !r.Value.hasRecovery() {
			t.Fatalf("%s: err %v, recovery %v", f.streams[i], r.Err, r.Value.hasRecovery())
		}
	}
	for i, r := range readSnapshots(context.Background(), cli, schema, linearizably(f.streams)) {
		if r.Err == nil || !strings.Contains(r.Err.Error(), "too many operations") {
			t.Fatalf("%s: err %v, want etcd's too many operations", f.streams[i], r.Err)
		}
	}
}

// The term's gatherer answers many concurrent attempts, more than one
// batch's worth, each as its own read alone; an attempt whose ctx has
// ended gets its error and no snapshot; no transaction carries more than
// maxSnapshotBatch streams.
func TestSnapshotReaderConcurrentAttempts(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	rng := rand.New(rand.NewPCG(3, 4))
	streams, states := storeSnapshotStreams(t, cli, 4*maxSnapshotBatch+5, rng)
	var mu sync.Mutex
	var sizes []int
	reads := gather.New(maxSnapshotBatch, snapshotReadsInFlight, func(ctx context.Context, batch []snapshotRead) []gather.Result[snapshot] {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
		return readSnapshots(ctx, cli, schema, batch)
	})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	type answer struct {
		snap snapshot
		err  error
	}
	answers := make([]answer, len(streams))
	var wg sync.WaitGroup
	for i, s := range streams {
		ctx := context.Background()
		if i%7 == 3 {
			ctx = cancelled
		}
		wg.Go(func() {
			snap, err := reads.Do(ctx, snapshotRead{stream: s})
			answers[i] = answer{snap, err}
		})
	}
	wg.Wait()
	reads.Wait()
	for i, s := range streams {
		if i%7 == 3 {
			if !errors.Is(answers[i].err, context.Canceled) || answers[i].snap.stream != "" {
				t.Fatalf("%s: cancelled attempt got %+v, %v", s, answers[i].snap, answers[i].err)
			}
			continue
		}
		sameAsAlone(t, cli, s, states[s], answers[i].snap, answers[i].err)
	}
	total := 0
	for _, n := range sizes {
		if n > maxSnapshotBatch {
			t.Fatalf("a read of %d streams, bound %d", n, maxSnapshotBatch)
		}
		total += n
	}
	t.Logf("%d streams read in %d transactions: %v", total, len(sizes), sizes)
}

// BenchmarkSnapshotReads measures what a mass failover's snapshot reads
// cost on a real etcd: each op reads 1,000 streams' snapshots from
// DefaultMaxInFlight attempts at once, each stream read alone
// (readSnapshot, the read before gathering) against through the term's
// gatherer. ns/stream is wall time; cpu-ns/stream is the process's CPU
// time, which here includes the embedded etcd's; txns/stream counts the
// transactions sent. Figures for the docs, never an assertion.
func BenchmarkSnapshotReads(b *testing.B) {
	const streams, attempts = 1000, DefaultMaxInFlight
	for _, mode := range []string{"alone", "gathered"} {
		b.Run(mode, func(b *testing.B) {
			cli := etcdtest.Start(b).Client(b)
			f := newBatchFixture(b, cli, streams)
			var txns atomic.Int64
			read := func(ctx context.Context, s string) (snapshot, error) {
				txns.Add(1)
				return readSnapshot(ctx, cli, schema, s)
			}
			if mode == "gathered" {
				g := gather.New(maxSnapshotBatch, snapshotReadsInFlight, func(ctx context.Context, batch []snapshotRead) []gather.Result[snapshot] {
					txns.Add(1)
					return readSnapshots(ctx, cli, schema, batch)
				})
				read = func(ctx context.Context, s string) (snapshot, error) { return g.Do(ctx, snapshotRead{stream: s}) }
			}
			clustertest.ReadEach(b, f.streams, attempts, &txns, func(ctx context.Context, s string) error {
				if snap, err := read(ctx, s); err != nil || !snap.hasRecovery() {
					return fmt.Errorf("no recovery read: %v", err)
				}
				return nil
			})
		})
	}
}

// readSnapshot reads one stream's recovery state alone, in a transaction of
// its own: the read before gathering, which the gathered read
// (readSnapshots) must answer exactly as, and the tests' way to look at a
// stream's state.
func readSnapshot(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, stream string) (snapshot, error) {
	resp, err := cli.Txn(ctx).Then(append(snapshotOps(schema, stream),
		clientv3.OpGet(schema.BrokersDir(), clientv3.WithPrefix()))...,
	).Commit()
	if err != nil {
		return snapshot{}, fmt.Errorf("worker: read %s: %w", stream, err)
	}
	brokers := brokersOf(schema, resp.Responses[snapshotOpsPerStream].GetResponseRange().GetKvs())
	return snapshotOf(stream, resp.Header.Revision, brokers, resp.Responses[:snapshotOpsPerStream])
}

// linearizably are linearizable reads of streams.
func linearizably(streams []string) []snapshotRead {
	reads := make([]snapshotRead, len(streams))
	for i, s := range streams {
		reads[i] = snapshotRead{stream: s}
	}
	return reads
}

// Reads that name a revision (that of the watch event that woke their
// attempt) are answered by one serializable transaction when the member
// has applied the newest of them, and read again linearizably when the
// answer is older; a batch with a read naming none is linearizable. Each
// stream's snapshot is what it reads alone.
func TestReadSnapshotsAtOrPastTheirRevision(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	rng := rand.New(rand.NewPCG(5, 6))
	streams, states := storeSnapshotStreams(t, cli, maxSnapshotBatch, rng)
	head, err := cli.Get(context.Background(), "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	kinds := &clustertest.TxnKinds{KV: cli.KV}
	cli.KV = kinds
	at := func(rev int64) []snapshotRead {
		reads := linearizably(streams)
		for i := range reads {
			reads[i].atLeast = rev - int64(i%3) // the batch reads at or past the newest
		}
		return reads
	}
	oneUnnamed := at(head.Header.Revision)
	oneUnnamed[len(oneUnnamed)/2].atLeast = 0
	for _, tc := range []struct {
		name  string
		reads []snapshotRead
		want  string
	}{
		{"at an applied revision", at(head.Header.Revision), "serializable"},
		{"past the member's revision", at(head.Header.Revision + 1000), "serializable,linearizable"},
		{"one read naming no revision", oneUnnamed, "linearizable"},
	} {
		res := readSnapshots(context.Background(), cli, schema, tc.reads)
		if got := kinds.Kinds(); got != tc.want {
			t.Errorf("%s: transactions %q, want %q", tc.name, got, tc.want)
		}
		for i, s := range streams {
			if res[i].Err == nil && res[i].Value.rev < head.Header.Revision {
				t.Fatalf("%s: %s read at %d, before %d", tc.name, s, res[i].Value.rev, head.Header.Revision)
			}
			sameAsAlone(t, cli, s, states[s], res[i].Value, res[i].Err)
		}
		kinds.Kinds() // sameAsAlone's own reads
	}
}
