package transition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

func TestBatches(t *testing.T) {
	// A recovery write: two compares, two operations.
	rec := func(n int) []TxnSize { return slices.Repeat([]TxnSize{{Cmps: 2, Ops: 2, Bytes: 100}}, n) }
	limit := TxnLimit{Ops: 128, Bytes: 1 << 20}
	cases := []struct {
		name  string
		parts []TxnSize
		limit TxnLimit
		want  []int
	}{
		{name: "nothing to write", parts: nil, limit: limit, want: nil},
		{name: "one stream", parts: rec(1), limit: limit, want: []int{1}},
		// 1 (the term's guard and nested txn) + 63*2 = 127 <= 128; a 64th
		// would make 129.
		{name: "63 two-compare writes fill a transaction", parts: rec(63), limit: limit, want: []int{63}},
		{name: "the 64th starts the next", parts: rec(64), limit: limit, want: []int{63, 64}},
		{name: "many streams", parts: rec(150), limit: limit, want: []int{63, 126, 150}},
		{name: "exactly at the op limit", parts: rec(3), limit: TxnLimit{Ops: 7, Bytes: 1 << 20}, want: []int{3}},
		{name: "one op over the limit", parts: rec(3), limit: TxnLimit{Ops: 6, Bytes: 1 << 20}, want: []int{2, 3}},
		{name: "bytes bound a batch too", parts: rec(10), limit: TxnLimit{Ops: 128, Bytes: 350}, want: []int{3, 6, 9, 10}},
		{
			// Compares and operations are bounded each, not together:
			// 1+max(2+6, 5+1) = 9 fits 9, then 1+max(8+1, 6+4) = 11 does not.
			name:  "the larger of compares and operations counts",
			parts: []TxnSize{{Cmps: 2, Ops: 5}, {Cmps: 6, Ops: 1}, {Cmps: 1, Ops: 4}, {Cmps: 3}},
			limit: TxnLimit{Ops: 9, Bytes: 1 << 20}, want: []int{2, 4},
		},
		{
			name:  "a part over the limit alone goes alone",
			parts: []TxnSize{{Cmps: 2, Ops: 2}, {Cmps: 200, Ops: 2}, {Cmps: 2, Ops: 2}},
			limit: limit, want: []int{1, 2, 3},
		},
	}
	for _, c := range cases {
		got := Batches(c.parts, c.limit)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: ends %v, want %v", c.name, got, c.want)
			continue
		}
		start := 0
		for _, end := range got {
			cmps, ops, bytes := 0, 0, 0
			for _, p := range c.parts[start:end] {
				cmps, ops, bytes = cmps+p.Cmps, ops+p.Ops, bytes+p.Bytes
			}
			if end-start > 1 && (termTxnOps+max(cmps, ops) > c.limit.Ops || bytes > c.limit.Bytes) {
				t.Errorf("%s: batch %d:%d carries %d compares, %d ops, %d bytes over %+v", c.name, start, end, cmps, ops, bytes, c.limit)
			}
			start = end
		}
	}
}

// A batch of recovery writes as Batches cuts them commits in one
// transaction on a real etcd; one stream's failed compare fails the whole
// batch and records nothing; a batch past etcd's op limit is refused, which
// is why the batches are cut.
func TestWriteRecoveriesBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, c, _ := newCommitter(t, ctx)
	schema := c.Schema
	const n = 80
	writes := make([]RecoveryWrite, n)
	for i := range writes {
		stream := fmt.Sprintf("s%02d", i)
		a := cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}
		put, err := cli.Put(ctx, schema.AssignmentKey(stream), cluster.Encode(a))
		if err != nil {
			t.Fatal(err)
		}
		writes[i] = RecoveryWrite{AsgModRev: put.Header.Revision, Rec: Stamp(cluster.Recovery{
			Stream: stream, FromEpoch: 3, FenceEpoch: 4, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2",
			Reason: "owner b1 lost: its broker lease ended", Policy: majority,
		}, time.Now())}
	}
	recorded := func() int {
		t.Helper()
		resp, err := cli.Get(ctx, schema.RecoveriesDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return int(resp.Count)
	}

	if _, err := c.WriteRecoveries(ctx, writes); err == nil || errors.Is(err, ErrConflict) {
		t.Fatalf("%d streams in one transaction: %v, want etcd's refusal of too many operations", n, err)
	}
	sizes := make([]TxnSize, n)
	for i, w := range writes {
		sizes[i] = c.RecoverySize(w)
	}
	ends := Batches(sizes, DefaultTxnLimit)
	if len(ends) < 2 {
		t.Fatalf("batches %v: %d streams in one", ends, n)
	}
	// The batches are as large as etcd takes: one stream more than the
	// first is refused for too many operations.
	if _, err := c.WriteRecoveries(ctx, writes[:ends[0]+1]); err == nil || errors.Is(err, ErrConflict) {
		t.Fatalf("%d streams, one past the first batch: %v, want etcd's refusal of too many operations", ends[0]+1, err)
	}

	// The first batch, with one stream's assignment moved since it was read.
	first := slices.Clone(writes[:ends[0]])
	first[len(first)/2].AsgModRev--
	if _, err := c.WriteRecoveries(ctx, first); !errors.Is(err, ErrConflict) {
		t.Fatalf("a batch with one stale stream: %v, want ErrConflict", err)
	}
	if got := recorded(); got != 0 {
		t.Fatalf("a failed batch recorded %d recoveries", got)
	}

	start := 0
	revs := map[string]int64{}
	for _, end := range ends {
		rev, err := c.WriteRecoveries(ctx, writes[start:end])
		if err != nil {
			t.Fatalf("batch %d:%d: %v", start, end, err)
		}
		for _, w := range writes[start:end] {
			revs[w.Rec.Stream] = rev
		}
		start = end
	}
	if got := recorded(); got != n {
		t.Fatalf("%d recoveries recorded, want %d", got, n)
	}
	for _, w := range writes {
		resp, err := cli.Get(ctx, schema.RecoveryKey(w.Rec.Stream))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("recovery of %s: %v %v", w.Rec.Stream, resp, err)
		}
		// The revision reported is the write's: a snapshot at it or
		// later shows the recovery (liveness skips streams whose
		// recorded recovery its snapshot is too old to show).
		if resp.Kvs[0].ModRevision != revs[w.Rec.Stream] {
			t.Fatalf("recovery of %s written at revision %d, reported %d", w.Rec.Stream, resp.Kvs[0].ModRevision, revs[w.Rec.Stream])
		}
		got, err := cluster.Decode[cluster.Recovery](resp.Kvs[0].Value)
		if err != nil || got.TransitionID != w.Rec.TransitionID || got.FenceEpoch != 4 {
			t.Fatalf("recovery of %s: %+v (%v), want %+v", w.Rec.Stream, got, err, w.Rec)
		}
	}
	// One pending recovery per stream: the same batch again conflicts.
	if _, err := c.WriteRecoveries(ctx, writes[:ends[0]]); !errors.Is(err, ErrConflict) {
		t.Fatalf("recording recoveries already pending: %v, want ErrConflict", err)
	}
}
