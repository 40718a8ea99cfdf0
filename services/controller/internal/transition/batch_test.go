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
	four := func(n int) []TxnSize { return slices.Repeat([]TxnSize{{Ops: 4, Bytes: 100}}, n) }
	limit := TxnLimit{Ops: 128, Bytes: 1 << 20}
	cases := []struct {
		name  string
		parts []TxnSize
		limit TxnLimit
		want  []int
	}{
		{name: "nothing to write", parts: nil, limit: limit, want: nil},
		{name: "one stream", parts: four(1), limit: limit, want: []int{1}},
		// 2 (the term's guard and nested txn) + 31*4 = 126 <= 128; a 32nd
		// would make 130.
		{name: "31 four-op writes fill a transaction", parts: four(31), limit: limit, want: []int{31}},
		{name: "the 32nd starts the next", parts: four(32), limit: limit, want: []int{31, 32}},
		{name: "many streams", parts: four(100), limit: limit, want: []int{31, 62, 93, 100}},
		{name: "exactly at the op limit", parts: four(3), limit: TxnLimit{Ops: 14, Bytes: 1 << 20}, want: []int{3}},
		{name: "one op over the limit", parts: four(3), limit: TxnLimit{Ops: 13, Bytes: 1 << 20}, want: []int{2, 3}},
		{name: "bytes bound a batch too", parts: four(10), limit: TxnLimit{Ops: 128, Bytes: 350}, want: []int{3, 6, 9, 10}},
		{
			name:  "parts of other sizes",
			parts: []TxnSize{{Ops: 5}, {Ops: 4}, {Ops: 6}, {Ops: 4}},
			limit: TxnLimit{Ops: 13, Bytes: 1 << 20}, want: []int{2, 4},
		},
		{
			name:  "a part over the limit alone goes alone",
			parts: []TxnSize{{Ops: 4}, {Ops: 200}, {Ops: 4}},
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
			ops, bytes := termTxnOps, 0
			for _, p := range c.parts[start:end] {
				ops, bytes = ops+p.Ops, bytes+p.Bytes
			}
			if end-start > 1 && (ops > c.limit.Ops || bytes > c.limit.Bytes) {
				t.Errorf("%s: batch %d:%d carries %d ops, %d bytes over %+v", c.name, start, end, ops, bytes, c.limit)
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
