package coord

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/gather"
)

// historyAlone is what the broker's History read before it was gathered:
// one linearizable Get of the stream's key.
func historyAlone(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, stream string) (cluster.HistoryStarts, error) {
	resp, err := cli.Get(ctx, schema.HistoryKey(stream))
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return cluster.Decode[cluster.HistoryStarts](resp.Kvs[0].Value)
}

// storeHistories stores n streams' history starts: every fifth missing,
// every eleventh unreadable, the rest with stream-specific starts.
func storeHistories(t *testing.T, cli *clientv3.Client, schema cluster.Schema, n int) []string {
	t.Helper()
	var streams []string
	for i := range n {
		s := fmt.Sprintf("h%03d", i)
		streams = append(streams, s)
		var v string
		switch {
		case i%5 == 0:
			continue
		case i%11 == 0:
			v = "{not json"
		default:
			v = cluster.Encode(cluster.HistoryStarts{{Epoch: 1, Node: "b1"}, {Epoch: uint64(i + 2), RecordTail: uint64(i), Node: "b2"}})
		}
		if _, err := cli.Put(context.Background(), schema.HistoryKey(s), v); err != nil {
			t.Fatal(err)
		}
	}
	return streams
}

// Many concurrent History calls, more than a batch, some for the same
// stream, each get what the stream's own Get gives: a missing key an
// empty list, an unreadable value an error for that stream alone.
func TestHistoryGatheredAnswersAsEachGet(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("/x")
	r := newHistoryReader(cli, schema)
	streams := storeHistories(t, cli, schema, 3*maxHistoryBatch+7)
	asks := append(append([]string(nil), streams...), streams[:40]...) // some twice, maybe in one batch
	type answer struct {
		h   cluster.HistoryStarts
		err error
	}
	answers := make([]answer, len(asks))
	var wg sync.WaitGroup
	for i, s := range asks {
		wg.Go(func() {
			h, err := r.Do(context.Background(), historyRead{stream: s})
			answers[i] = answer{h, err}
		})
	}
	wg.Wait()
	for i, s := range asks {
		want, wantErr := historyAlone(context.Background(), cli, schema, s)
		got := answers[i]
		if wantErr != nil {
			if !errors.Is(got.err, cluster.ErrCorrupt) || !strings.Contains(got.err.Error(), s) {
				t.Fatalf("%s: err %v, want ErrCorrupt naming the stream (its Get: %v)", s, got.err, wantErr)
			}
			continue
		}
		if got.err != nil || !reflect.DeepEqual(got.h, want) {
			t.Fatalf("%s: %v, %v; its Get: %v", s, got.h, got.err, want)
		}
	}
}

// Each History call sees every write made before it began, although
// other calls' reads, of its stream too, are in flight when it is asked:
// the gatherer never answers it from a read sent before its call. Several
// callers per stream each write the stream's next epoch (writes of one
// stream in order) and then read: the read must show that epoch or a
// later one.
func TestHistoryReadsAfterItsCall(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("")
	r := newHistoryReader(cli, schema)
	writeThenRead(t, cli, schema, func(ctx context.Context, s string, _ int64) (cluster.HistoryStarts, error) {
		return r.Do(ctx, historyRead{stream: s})
	})
}

// writeThenRead has several callers per stream each write the stream's
// next epoch (writes of one stream in order) and then read with read,
// given the write's revision: the read must show that epoch or a later
// one.
func writeThenRead(t *testing.T, cli *clientv3.Client, schema cluster.Schema, read func(ctx context.Context, stream string, rev int64) (cluster.HistoryStarts, error)) {
	t.Helper()
	const streams, perStream, rounds = 8, 4, 20
	var wg sync.WaitGroup
	errs := make(chan error, streams*perStream)
	for i := range streams {
		s := fmt.Sprintf("w%02d", i)
		var mu sync.Mutex
		var epoch uint64
		for range perStream {
			wg.Go(func() {
				for range rounds {
					mu.Lock()
					epoch++
					wrote := epoch
					resp, err := cli.Put(context.Background(), schema.HistoryKey(s), cluster.Encode(cluster.HistoryStarts{{Epoch: wrote, Node: s}}))
					mu.Unlock()
					if err != nil {
						errs <- err
						return
					}
					got, err := read(context.Background(), s, resp.Header.Revision)
					if err != nil || len(got) != 1 || got[0].Epoch < wrote {
						errs <- fmt.Errorf("%s: read %v, %v after writing epoch %d", s, got, err, wrote)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A caller whose ctx has ended gets its error; the others of its batch
// are answered.
func TestHistoryCallerThatLeaves(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("")
	r := newHistoryReader(cli, schema)
	streams := storeHistories(t, cli, schema, 2*maxHistoryBatch)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	errs := make([]error, len(streams))
	var wg sync.WaitGroup
	for i, s := range streams {
		ctx := context.Background()
		if i%3 == 1 {
			ctx = cancelled
		}
		wg.Go(func() { _, errs[i] = r.Do(ctx, historyRead{stream: s}) })
	}
	wg.Wait()
	for i, s := range streams {
		switch {
		case i%3 == 1:
			if !errors.Is(errs[i], context.Canceled) {
				t.Fatalf("%s: cancelled caller got %v", s, errs[i])
			}
		case i%11 == 0 && i%5 != 0:
			if !errors.Is(errs[i], cluster.ErrCorrupt) {
				t.Fatalf("%s: %v, want ErrCorrupt", s, errs[i])
			}
		case errs[i] != nil:
			t.Fatalf("%s: %v", s, errs[i])
		}
	}
}

// A read of maxHistoryBatch streams is within etcd's --max-txn-ops; one
// etcd refuses fails every stream of it with the error, none answered as
// an empty list.
func TestReadHistoriesFailedReadFailsEveryStream(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("")
	streams := storeHistories(t, cli, schema, 129)
	for i, r := range readHistories(context.Background(), cli, schema, reads(streams[:maxHistoryBatch], 0)) {
		if r.Err != nil && !errors.Is(r.Err, cluster.ErrCorrupt) {
			t.Fatalf("%s: %v", streams[i], r.Err)
		}
	}
	for i, r := range readHistories(context.Background(), cli, schema, reads(streams, 0)) {
		if r.Err == nil || !strings.Contains(r.Err.Error(), "too many operations") || r.Value != nil {
			t.Fatalf("%s: %v, %v, want etcd's too many operations", streams[i], r.Value, r.Err)
		}
	}
}

// BenchmarkHistoryReads measures what the copies taking a role after a
// mass failover cost etcd in history reads: each op reads 1,000 streams'
// history starts from 128 callers at once, each a Get of its own (the read
// before gathering) against through newHistoryReader. ns/stream is wall
// time; cpu-ns/stream is the process's CPU time, which here includes the
// embedded etcd's; txns/stream counts the requests sent. Figures for the
// docs, never an assertion.
func BenchmarkHistoryReads(b *testing.B) {
	const streams, callers = 1000, 128
	for _, mode := range []string{"alone", "gathered"} {
		b.Run(mode, func(b *testing.B) {
			cli := etcdtest.Start(b).Client(b)
			schema := cluster.NewSchema("")
			names := make([]string, streams)
			for i := range names {
				names[i] = fmt.Sprintf("s%04d", i)
				v := cluster.Encode(cluster.HistoryStarts{{Epoch: 1, Node: "b1"}, {Epoch: 2, RecordTail: uint64(i), Node: "b2"}})
				if _, err := cli.Put(context.Background(), schema.HistoryKey(names[i]), v); err != nil {
					b.Fatal(err)
				}
			}
			var txns atomic.Int64
			read := func(ctx context.Context, s string) (cluster.HistoryStarts, error) {
				txns.Add(1)
				return historyAlone(ctx, cli, schema, s)
			}
			if mode == "gathered" {
				g := gather.New(maxHistoryBatch, historyReadsInFlight, func(ctx context.Context, batch []string) []gather.Result[cluster.HistoryStarts] {
					txns.Add(1)
					return readHistories(ctx, cli, schema, reads(batch, 0))
				})
				read = g.Do
			}
			clustertest.ReadEach(b, names, callers, &txns, func(ctx context.Context, s string) error {
				if h, err := read(ctx, s); err != nil || len(h) != 2 {
					return fmt.Errorf("%v, %v", h, err)
				}
				return nil
			})
		})
	}
}

// reads is a historyRead of each stream, at or past rev.
func reads(streams []string, rev int64) []historyRead {
	out := make([]historyRead, len(streams))
	for i, s := range streams {
		out[i] = historyRead{stream: s, atLeast: rev}
	}
	return out
}

// A read that names a revision is answered by one serializable read when
// the member has applied that revision, and read again linearizably when
// the answer is older; either way it holds every write up to the
// revision. Several callers per stream each write the stream's next epoch
// and then read at or past that write's revision: the read must show that
// epoch or a later one.
func TestHistoryAtReadsAtOrPastItsRevision(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	kinds := &clustertest.TxnKinds{KV: cli.KV}
	cli.KV = kinds
	schema := cluster.NewSchema("")
	r := newHistoryReader(cli, schema)
	writeThenRead(t, cli, schema, func(ctx context.Context, s string, rev int64) (cluster.HistoryStarts, error) {
		return r.Do(ctx, historyRead{stream: s, atLeast: rev})
	})

	// One member, which has applied every write: one transaction each.
	names := storeHistories(t, cli, schema, 10)
	head, err := cli.Get(context.Background(), "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	kinds.Kinds()
	for i, res := range readHistories(context.Background(), cli, schema, reads(names, head.Header.Revision)) {
		if want, wantErr := historyAlone(context.Background(), cli, schema, names[i]); (wantErr == nil) != (res.Err == nil) || !reflect.DeepEqual(res.Value, want) {
			t.Fatalf("%s: %v, %v; its Get: %v, %v", names[i], res.Value, res.Err, want, wantErr)
		}
	}
	if got := kinds.Kinds(); got != "serializable" {
		t.Fatalf("transactions %q for a read at an applied revision, want one serializable", got)
	}
	// A revision the member has not reached: the serializable answer is
	// older, so the batch is read again, linearizably.
	for i, res := range readHistories(context.Background(), cli, schema, reads(names, head.Header.Revision+1000)) {
		if want, wantErr := historyAlone(context.Background(), cli, schema, names[i]); (wantErr == nil) != (res.Err == nil) || !reflect.DeepEqual(res.Value, want) {
			t.Fatalf("%s: %v, %v; its Get: %v, %v", names[i], res.Value, res.Err, want, wantErr)
		}
	}
	if got := kinds.Kinds(); got != "serializable,linearizable" {
		t.Fatalf("transactions %q for a read past the member's revision, want serializable, then linearizable", got)
	}
}
