package api

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/internal/replica"
)

// sealBroker is a real broker (a replica manager over Badger in a temp
// dir, its ReplicationService served over loopback as the broker serves it)
// owning sealStreams at epoch 1 of incarnation "inc-1", each holding two
// confirmed records.
type sealBroker struct {
	m  *replica.Manager
	rc strandv1connect.ReplicationServiceClient
}

var sealStreams = []string{"s0", "s1", "s2", "s3", "s4", "s5"}

func startSealBroker(t *testing.T) *sealBroker {
	t.Helper()
	m, baseURL := serveTestBroker(t)
	assignments := map[string]cluster.Assignment{}
	for _, s := range sealStreams {
		assignments[s] = cluster.Assignment{Stream: s, Epoch: 1, Owner: fuzzNode, Followers: []string{fuzzFollower},
			Policy: cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}, Incarnation: "inc-1"}
	}
	m.SyncAssignments(assignments, nil)
	sc := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), baseURL)
	for _, s := range sealStreams {
		clustertest.Eventually(t, 10*time.Second, "the broker confirms a publish to "+s, func() error {
			_, err := sc.Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: s,
				Records: []*strandv1.Record{{Payload: []byte("r0")}, {Payload: []byte("r1")}}}))
			return err
		})
	}
	return &sealBroker{m: m, rc: strandv1connect.NewReplicationServiceClient(rpcserver.HTTPClient(), baseURL)}
}

// sealMany sends seals as one SealMany and returns each entry's result at
// its index, checking every entry has exactly one.
func sealMany(ctx context.Context, rc strandv1connect.ReplicationServiceClient, seals []*strandv1.SealRequest) ([]*strandv1.SealResult, error) {
	stream, err := rc.SealMany(ctx, connect.NewRequest(&strandv1.SealManyRequest{Seals: seals}))
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.Close() }()
	out := make([]*strandv1.SealResult, len(seals))
	for stream.Receive() {
		for _, r := range stream.Msg().GetResults() {
			i := int(r.GetEntry())
			if i >= len(seals) || out[i] != nil {
				return nil, fmt.Errorf("entry %d answered twice or out of range (%d entries)", i, len(seals))
			}
			out[i] = r
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	for i, r := range out {
		if r == nil {
			return nil, fmt.Errorf("entry %d not answered", i)
		}
	}
	return out, nil
}

// sealOutcome is what a seal answered, comparable across two brokers: the
// response without its chain (a record's chain covers its publish time),
// or the error's code and message with the entry's prefix taken off.
type sealOutcome struct {
	resp *strandv1.SealResponse
	code connect.Code
	msg  string
}

func outcomeOf(resp *strandv1.SealResponse, err error) sealOutcome {
	if err != nil {
		ce := connect.NewError(connect.CodeUnknown, err)
		if c, ok := err.(*connect.Error); ok {
			ce = c
		}
		return sealOutcome{code: ce.Code(), msg: ce.Message()}
	}
	r := proto.Clone(resp).(*strandv1.SealResponse)
	r.Chain = 0
	return sealOutcome{resp: r}
}

func (o sealOutcome) String() string {
	if o.resp != nil {
		return o.resp.String()
	}
	return fmt.Sprintf("%v: %s", o.code, o.msg)
}

func (o sealOutcome) equal(p sealOutcome) bool {
	return proto.Equal(o.resp, p.resp) && o.code == p.code && o.msg == p.msg
}

// Each SealMany entry answers what a Seal of it answers on a broker in the
// same state: the same fence, tails and log epochs, or the same error with
// the fields it names under "seals[i].". Two brokers start alike; one gets
// the table as Seals one after the other, the other as entries of
// SealMany calls, in the same order.
func TestSealManyEntriesAnswerAsSeal(t *testing.T) {
	one, many := startSealBroker(t), startSealBroker(t)
	// Calls in order: later calls see what earlier ones fenced. Each
	// inner slice is one SealMany (one stream at most once).
	calls := [][]*strandv1.SealRequest{
		{
			{Stream: "s0", FenceEpoch: 2, TransitionId: "t2", Incarnation: "inc-1"}, // seals
			{Stream: "s1", FenceEpoch: 3, TransitionId: "t3"},                       // seals, incarnation not checked
			{Stream: "s2", FenceEpoch: 2, TransitionId: "t2", Incarnation: "inc-2"}, // another incarnation
			{Stream: "nope", FenceEpoch: 2, TransitionId: "t2"},                     // no copy here
			{Stream: "s3", FenceEpoch: 0, TransitionId: "t2"},                       // fence_epoch
			{Stream: "s4", FenceEpoch: 2, TransitionId: ""},                         // transition_id
			{Stream: "Bad!", FenceEpoch: 2, TransitionId: "t2"},                     // stream
		},
		{
			{Stream: "s0", FenceEpoch: 2, TransitionId: "t2", Incarnation: "inc-1"}, // the same seal again
			{Stream: "s1", FenceEpoch: 2, TransitionId: "t2"},                       // below the fence
			{Stream: "s2", FenceEpoch: 2, TransitionId: "t2", Incarnation: "inc-1"}, // now the right one
			{Stream: "s5", FenceEpoch: 4, TransitionId: "t4"},
		},
		{
			{Stream: "s0", FenceEpoch: 2, TransitionId: "t2b"}, // a newer transition takes the seal over
			{Stream: "s5", FenceEpoch: 5, TransitionId: "t5"},  // a later fence
		},
	}
	ctx := context.Background()
	for c, call := range calls {
		results, err := sealMany(ctx, many.rc, call)
		if err != nil {
			t.Fatalf("call %d: SealMany: %v", c, err)
		}
		for i, req := range call {
			r, err := one.rc.Seal(ctx, connect.NewRequest(req))
			var want sealOutcome
			if err != nil {
				want = outcomeOf(nil, err)
			} else {
				want = outcomeOf(r.Msg, nil)
			}
			var got sealOutcome
			switch o := results[i].GetOutcome().(type) {
			case *strandv1.SealResult_Response:
				got = outcomeOf(o.Response, nil)
			case *strandv1.SealResult_Error:
				got = outcomeOf(nil, rpcerr.FromEntry(o.Error, rpcerr.EntryPrefix("seals", i)))
				if want.code == connect.CodeInvalidArgument {
					// The entry's error names the field under its own.
					if fv := o.Error.GetMessage(); len(fv) < 9 || fv[:9] != fmt.Sprintf("seals[%d].", i) {
						t.Errorf("call %d entry %d: error %q does not name seals[%d]'s field", c, i, fv, i)
					}
				}
			default:
				t.Fatalf("call %d entry %d: no outcome", c, i)
			}
			if !got.equal(want) {
				t.Errorf("call %d entry %d (%v): SealMany answered %v, Seal %v", c, i, req, got, want)
			}
		}
	}
	// Both brokers end in the same state.
	a, b := one.m.Tails(), many.m.Tails()
	for _, s := range sealStreams {
		if a[s].SealEpoch != b[s].SealEpoch || a[s].RecordTail != b[s].RecordTail || a[s].Epoch != b[s].Epoch {
			t.Errorf("%s: after Seals %+v, after SealMany %+v", s, a[s], b[s])
		}
	}
	if b["s0"].SealEpoch != 2 || b["s5"].SealEpoch != 5 || b["s2"].SealEpoch != 2 || b["s3"].SealEpoch != 0 {
		t.Errorf("seal epochs after SealMany: %+v", b)
	}
}

// What refuses a SealMany whole is InvalidArgument naming the field, and
// seals nothing of any entry; a bad entry among good ones fails alone.
func TestSealManyRefusals(t *testing.T) {
	b := startSealBroker(t)
	ctx := context.Background()
	entry := func(s string) *strandv1.SealRequest {
		return &strandv1.SealRequest{Stream: s, FenceEpoch: 2, TransitionId: "t2", Incarnation: "inc-1"}
	}
	tooMany := make([]*strandv1.SealRequest, MaxSealManyEntries+1)
	for i := range tooMany {
		tooMany[i] = entry(fmt.Sprintf("x%d", i))
	}
	tooMany[0] = entry("s0")
	for _, tc := range []struct {
		name  string
		seals []*strandv1.SealRequest
		field string
	}{
		{"no entries", nil, "seals"},
		{"too many entries", tooMany, "seals"},
		{"a stream twice", []*strandv1.SealRequest{entry("s0"), entry("s1"), entry("s0")}, "seals[2].stream"},
	} {
		before := b.m.Tails()
		_, err := sealMany(ctx, b.rc, tc.seals)
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("%s: answered %v, want InvalidArgument", tc.name, err)
		}
		if fv := rpcerr.FieldViolations(err); len(fv) != 1 || fv[0].GetField() != tc.field {
			t.Fatalf("%s: %v names %v, want %q", tc.name, err, fv, tc.field)
		}
		for s, was := range before {
			if now := b.m.Tails()[s]; now != was {
				t.Fatalf("%s: refused whole, yet %s changed from %+v to %+v", tc.name, s, was, now)
			}
		}
	}

	// An unknown stream and a bad field among good entries: those two
	// fail, the others are sealed.
	results, err := sealMany(ctx, b.rc, []*strandv1.SealRequest{
		entry("s0"), entry("unknown"), {Stream: "s1", FenceEpoch: 0, TransitionId: "t2"}, entry("s2"),
	})
	if err != nil {
		t.Fatal(err)
	}
	// A broker with its assignments current holds no copy of a stream it
	// has no assignment for (docs/errors.md, ReplicationService).
	if e := results[1].GetError(); e == nil || connect.Code(e.GetCode()) != connect.CodeFailedPrecondition {
		t.Errorf("unknown stream: %v, want FailedPrecondition", results[1])
	}
	if e := results[2].GetError(); e == nil || connect.Code(e.GetCode()) != connect.CodeInvalidArgument || e.GetMessage()[:len("seals[2].fence_epoch")] != "seals[2].fence_epoch" {
		t.Errorf("fence epoch 0: %v, want InvalidArgument naming seals[2].fence_epoch", results[2])
	}
	tails := b.m.Tails()
	for i, s := range map[int]string{0: "s0", 3: "s2"} {
		if r := results[i].GetResponse(); r == nil || r.GetFenceEpoch() != 2 || r.GetRecordTail() != 2 || tails[s].SealEpoch != 2 {
			t.Errorf("%s: answered %v, copy %+v; want sealed at 2 with tail 2", s, results[i], tails[s])
		}
	}
	if tails["s1"].SealEpoch != 0 {
		t.Errorf("s1 sealed by a refused entry: %+v", tails["s1"])
	}
}

// BenchmarkSealCalls seals the copies of 512 streams on one broker, 128
// seals outstanding at a time as a recoverer's rounds in flight keep them
// (fewer than worker.DefaultMaxInFlight, so each pass holds every stream
// once): as a Seal each, and gathered into SealMany
// calls of up to 128 entries, 4 calls at once (the recoverer's
// sealCallsInFlight). Each op is one seal; after the first pass a seal
// takes the copy's seal over for a newer transition at the same fence
// epoch, a durable write as the first seal is (storage.Stream.Seal).
// cpu-ns/op is the process's CPU (the broker's side and the caller's) per
// seal, which a shared machine does not inflate as it does ns/op.
func BenchmarkSealCalls(b *testing.B) {
	const streams, outstanding, perCall, calls = 512, 128, 128, 4
	m, baseURL := serveTestBroker(b)
	names := make([]string, streams)
	assignments := map[string]cluster.Assignment{}
	for i := range names {
		names[i] = fmt.Sprintf("bench-%03d", i)
		assignments[names[i]] = cluster.Assignment{Stream: names[i], Epoch: 1, Owner: fuzzNode,
			Policy: cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}, Incarnation: "inc-1"}
	}
	m.SyncAssignments(assignments, nil)
	rc := strandv1connect.NewReplicationServiceClient(rpcserver.HTTPClient(), baseURL)
	ctx := context.Background()
	// Every seal names a transition new to its copy, so each is a durable
	// write (the takeover), never a repeat; runs count on from the last.
	var runs atomic.Int64
	req := func(run int64, n int) *strandv1.SealRequest {
		return &strandv1.SealRequest{Stream: names[n%streams], FenceEpoch: 2, TransitionId: fmt.Sprintf("t%d-%d", run, n/streams), Incarnation: "inc-1"}
	}
	// The first seal of each copy ends its role too: done before either
	// is measured, so both measure the same seal.
	var wg sync.WaitGroup
	for n := range streams {
		wg.Go(func() {
			if _, err := rc.Seal(ctx, connect.NewRequest(req(0, n))); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	b.Run("Seal", func(b *testing.B) {
		run := runs.Add(1)
		var next atomic.Int64
		stop := clustertest.CPUPerOp(b)
		for range outstanding {
			wg.Go(func() {
				for n := int(next.Add(1) - 1); n < b.N; n = int(next.Add(1) - 1) {
					if _, err := rc.Seal(ctx, connect.NewRequest(req(run, n))); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		stop()
	})
	b.Run("SealMany", func(b *testing.B) {
		run := runs.Add(1)
		var next atomic.Int64
		stop := clustertest.CPUPerOp(b)
		for range calls {
			wg.Go(func() {
				for {
					first := int(next.Add(perCall) - perCall)
					if first >= b.N {
						return
					}
					// One call's entries are distinct streams: perCall
					// divides streams.
					var batch []*strandv1.SealRequest
					for n := first; n < min(first+perCall, b.N); n++ {
						batch = append(batch, req(run, n))
					}
					results, err := sealMany(ctx, rc, batch)
					if err != nil {
						b.Error(err)
						return
					}
					for _, r := range results {
						if e := r.GetError(); e != nil {
							b.Error(e)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		stop()
	})
}
