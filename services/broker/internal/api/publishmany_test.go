package api

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
)

// otherStream is a second stream the fuzz broker owns in these tests, so a
// PublishMany has two streams to carry.
const otherStream = "s2"

// startTwoStreamBroker is the fuzz broker owning fuzzStream and otherStream.
func startTwoStreamBroker(t *testing.T) *fuzzBroker {
	t.Helper()
	b := startFuzzBroker(t)
	policy := cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}
	b.m.SyncAssignments(map[string]cluster.Assignment{
		fuzzStream:  {Stream: fuzzStream, Epoch: 1, Owner: fuzzNode, Followers: []string{fuzzFollower}, Policy: policy, Incarnation: b.incarnation},
		otherStream: {Stream: otherStream, Epoch: 1, Owner: fuzzNode, Followers: []string{fuzzFollower}, Policy: policy, Incarnation: "inc-2"},
	}, nil)
	clustertest.Eventually(t, 10*time.Second, "the broker owns "+otherStream, func() error {
		_, err := b.sc.Read(context.Background(), connect.NewRequest(&strandv1.ReadRequest{Stream: otherStream}))
		return err
	})
	return b
}

// readPayloads reads every record of stream from the broker.
func (b *fuzzBroker) readPayloads(t *testing.T, stream string) []string {
	t.Helper()
	res, err := b.sc.Read(fuzzCtx(t), connect.NewRequest(&strandv1.ReadRequest{Stream: stream, FromEarliest: true}))
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	var out []string
	for _, r := range res.Msg.GetRecords() {
		out = append(out, string(r.GetPayload()))
	}
	return out
}

func entry(stream string, records ...*strandv1.Record) *strandv1.PublishRequest {
	return &strandv1.PublishRequest{Stream: stream, Records: records}
}

func rec(payload string) *strandv1.Record { return &strandv1.Record{Payload: []byte(payload)} }

func emptyEntries(n int) []*strandv1.PublishRequest {
	out := make([]*strandv1.PublishRequest, n)
	for i := range out {
		out[i] = entry(fmt.Sprintf("e%d", i), rec("x"))
	}
	return out
}

// A call refused whole names the field, with InvalidArgument, and stores
// nothing of any entry, its good entries included.
func TestPublishManyRefusesWholeCall(t *testing.T) {
	b := startTwoStreamBroker(t)
	mib := bytes.Repeat([]byte("x"), DefaultMaxRecordBytes)
	big := func() []*strandv1.Record {
		out := make([]*strandv1.Record, 9)
		for i := range out {
			out[i] = &strandv1.Record{Payload: mib}
		}
		return out
	}
	many := func(n int) []*strandv1.Record {
		out := make([]*strandv1.Record, n)
		for i := range out {
			out[i] = &strandv1.Record{}
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		pubs  []*strandv1.PublishRequest
		field string
	}{
		{"no entries", nil, "publishes"},
		{"too many entries", append([]*strandv1.PublishRequest{entry(fuzzStream, rec("good"))}, emptyEntries(MaxPublishManyEntries)...), "publishes"},
		{"too many records in all", []*strandv1.PublishRequest{entry(fuzzStream, many(DefaultMaxBatchRecords/2)...), entry(otherStream, many(DefaultMaxBatchRecords/2+1)...)}, "publishes"},
		{"too many bytes in all", []*strandv1.PublishRequest{entry(fuzzStream, big()...), entry(otherStream, big()...)}, "publishes"},
		{"a stream twice", []*strandv1.PublishRequest{entry(fuzzStream, rec("a")), entry(otherStream, rec("b")), entry(fuzzStream, rec("c"))}, "publishes[2].stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := [][]string{b.readPayloads(t, fuzzStream), b.readPayloads(t, otherStream)}
			_, err := b.sc.PublishMany(fuzzCtx(t), connect.NewRequest(&strandv1.PublishManyRequest{Publishes: tc.pubs}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("answered %v, want InvalidArgument", err)
			}
			if fv := rpcerr.FieldViolations(err); len(fv) != 1 || fv[0].GetField() != tc.field {
				t.Fatalf("%v names %v, want the field %s", err, fv, tc.field)
			}
			after := [][]string{b.readPayloads(t, fuzzStream), b.readPayloads(t, otherStream)}
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("refused whole, yet the streams went from %q to %q", before, after)
			}
		})
	}
}

// A bad entry fails alone, its field named under publishes[i], and stores
// nothing; the other entry is stored and answered as its Publish would be.
func TestPublishManyBadEntryFailsAlone(t *testing.T) {
	b := startTwoStreamBroker(t)
	ctx := fuzzCtx(t)
	// The producer "p" has sequence 1 on otherStream: 3 is a gap.
	if _, err := b.sc.Publish(ctx, connect.NewRequest(entry(otherStream, &strandv1.Record{Payload: []byte("p1"), ProducerId: "p", Sequence: 1}))); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name  string
		bad   *strandv1.PublishRequest
		code  connect.Code
		field string // "" for an error naming no field
	}{
		{"empty header key", entry(otherStream, rec("ok"), &strandv1.Record{Payload: []byte("x"), Headers: map[string]string{"": "v"}}), connect.CodeInvalidArgument, "publishes[1].records[1].headers"},
		{"bad stream name", entry("Bad Name", rec("x")), connect.CodeInvalidArgument, "publishes[1].stream"},
		{"no records", entry(otherStream), connect.CodeInvalidArgument, "publishes[1].records"},
		{"sequence without producer", entry(otherStream, &strandv1.Record{Payload: []byte("x"), Sequence: 4}), connect.CodeInvalidArgument, "publishes[1].records[0].producer_id"},
		{"record too large", entry(otherStream, &strandv1.Record{Payload: bytes.Repeat([]byte("x"), DefaultMaxRecordBytes+1)}), connect.CodeResourceExhausted, "publishes[1].records[0]"},
		{"sequence gap", entry(otherStream, &strandv1.Record{Payload: []byte("x"), ProducerId: "p", Sequence: 3}), connect.CodeFailedPrecondition, "publishes[1].records[0].sequence"},
		{"stream not here", entry("nowhere", rec("x")), connect.CodeNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good := fmt.Sprintf("good-%d", i)
			beforeGood, beforeBad := b.readPayloads(t, fuzzStream), b.readPayloads(t, otherStream)
			res, err := b.sc.PublishMany(ctx, connect.NewRequest(&strandv1.PublishManyRequest{Publishes: []*strandv1.PublishRequest{entry(fuzzStream, rec(good)), tc.bad}}))
			if err != nil {
				t.Fatalf("the call failed whole: %v", err)
			}
			results := res.Msg.GetResults()
			if len(results) != 2 {
				t.Fatalf("%d results for 2 entries", len(results))
			}
			if r := results[0].GetResponse(); r == nil || len(r.GetOffsets()) != 1 || r.GetOffsets()[0] != uint64(len(beforeGood)) {
				t.Fatalf("the good entry answered %v, want its record at offset %d", results[0], len(beforeGood))
			}
			pe := results[1].GetError()
			if pe == nil {
				t.Fatalf("the bad entry answered %v, want an error", results[1])
			}
			eerr := rpcerr.FromEntry(pe, "")
			if connect.CodeOf(eerr) != tc.code {
				t.Fatalf("the bad entry answered %v, want %v", eerr, tc.code)
			}
			if tc.field != "" {
				named := []string{}
				for _, v := range rpcerr.FieldViolations(eerr) {
					named = append(named, v.GetField())
				}
				if v, ok := rpcerr.Precondition(eerr, rpcerr.PreconditionSequence); ok {
					named = append(named, v.GetSubject())
				}
				if len(named) != 1 || named[0] != tc.field || !strings.HasPrefix(pe.GetMessage(), tc.field+":") {
					t.Fatalf("the bad entry's error %q names %v, want %s", pe.GetMessage(), named, tc.field)
				}
				// Taken off again, it is what a Publish of the entry answers.
				if alone := rpcerr.FieldViolations(rpcerr.FromEntry(pe, "publishes[1].")); tc.code != connect.CodeFailedPrecondition &&
					(len(alone) != 1 || alone[0].GetField() != strings.TrimPrefix(tc.field, "publishes[1].")) {
					t.Fatalf("without the entry's prefix the error names %v", alone)
				}
			}
			if got, want := b.readPayloads(t, fuzzStream), append(beforeGood, good); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s holds %q, want %q", fuzzStream, got, want)
			}
			if got := b.readPayloads(t, otherStream); fmt.Sprint(got) != fmt.Sprint(beforeBad) {
				t.Fatalf("the bad entry's stream went from %q to %q", beforeBad, got)
			}
		})
	}
}

// Entries of an idempotent producer are answered as its Publishes: a
// retried call is answered as duplicates at the original offsets, and
// stores nothing again.
func TestPublishManyRetryIsDuplicate(t *testing.T) {
	b := startTwoStreamBroker(t)
	ctx := fuzzCtx(t)
	req := &strandv1.PublishManyRequest{Publishes: []*strandv1.PublishRequest{
		entry(fuzzStream, &strandv1.Record{Payload: []byte("a1"), ProducerId: "q", Sequence: 1}),
		entry(otherStream, &strandv1.Record{Payload: []byte("b1"), ProducerId: "q", Sequence: 1}, &strandv1.Record{Payload: []byte("b2"), ProducerId: "q", Sequence: 2}),
	}}
	first, err := b.sc.PublishMany(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.sc.PublishMany(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	for i := range req.Publishes {
		f, a := first.Msg.GetResults()[i].GetResponse(), again.Msg.GetResults()[i].GetResponse()
		if f == nil || a == nil {
			t.Fatalf("entry %d: %v then %v", i, first.Msg.GetResults()[i], again.Msg.GetResults()[i])
		}
		allDup := len(a.GetDuplicate()) == len(a.GetOffsets())
		for _, d := range a.GetDuplicate() {
			allDup = allDup && d
		}
		if fmt.Sprint(f.GetOffsets()) != fmt.Sprint(a.GetOffsets()) || !allDup {
			t.Fatalf("entry %d: retried at %v (duplicate %v), first at %v", i, a.GetOffsets(), a.GetDuplicate(), f.GetOffsets())
		}
	}
	if got := b.readPayloads(t, otherStream); fmt.Sprint(got) != "[b1 b2]" {
		t.Fatalf("%s holds %q after a retried call, want [b1 b2]", otherStream, got)
	}
}
