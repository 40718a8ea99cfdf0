package api

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
)

// fuzzKeepEntries is the codecs' entry bound under fuzzing, as fuzzKeep is
// their record bound.
const fuzzKeepEntries = 2

// FuzzPublishManyCodecs: on any body the PublishMany cuts never panic and
// decode what the stock codecs do, but for a request of more than
// fuzzKeepEntries entries or at least fuzzKeep records in all, of which
// they decode a prefix holding exactly fuzzKeepEntries entries or
// fuzzKeep records: what PublishMany needs to refuse it, never more.
func FuzzPublishManyCodecs(f *testing.F) {
	for _, m := range []*strandv1.PublishManyRequest{
		{Publishes: []*strandv1.PublishRequest{{Stream: "a", Records: emptyRecords(1)}}},
		{Publishes: []*strandv1.PublishRequest{{Stream: "a", Records: emptyRecords(1)}, {Stream: "b", Records: emptyRecords(5)}}},
		{Publishes: []*strandv1.PublishRequest{{Stream: "a"}, {Stream: "b"}, {Stream: "c"}}},
		{Publishes: []*strandv1.PublishRequest{{Stream: "a", Records: emptyRecords(fuzzKeep)}, {Stream: "b"}}},
	} {
		pb, _ := proto.Marshal(m)
		js, _ := protojson.Marshal(m)
		f.Add(pb, false)
		f.Add(js, true)
	}
	f.Add([]byte(`{"publishes":[{"records":[{},{}]},{"records":[{},{},{}]},{}]}`), true)
	f.Add([]byte(`{"publishes":null}`), true)
	f.Fuzz(func(t *testing.T, data []byte, json bool) {
		var want, got strandv1.PublishManyRequest
		var errWant, errGot error
		if json {
			if len(data) == 0 {
				return // refused before any cut (jsonCodec)
			}
			errWant = (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, &want)
			errGot = (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(jsonPublishesPrefix(data, fuzzKeepEntries, fuzzKeep), &got)
		} else {
			errWant = proto.Unmarshal(data, &want)
			errGot = proto.Unmarshal(protoPublishesPrefix(data, fuzzKeepEntries, fuzzKeep), &got)
		}
		records := func(m *strandv1.PublishManyRequest) int {
			n := 0
			for _, p := range m.GetPublishes() {
				n += len(p.GetRecords())
			}
			return n
		}
		if errGot == nil && (len(got.GetPublishes()) > fuzzKeepEntries || records(&got) > fuzzKeep) {
			t.Fatalf("body %q: decoded %d entries and %d records, past the bounds", data, len(got.GetPublishes()), records(&got))
		}
		switch {
		case errWant == nil && len(want.GetPublishes()) <= fuzzKeepEntries && records(&want) < fuzzKeep:
			if errGot != nil || !proto.Equal(&got, &want) {
				t.Fatalf("body %q: cut decodes %v (%v), stock %v", data, &got, errGot, &want)
			}
		case errWant == nil:
			if errGot != nil || (len(got.GetPublishes()) != fuzzKeepEntries && records(&got) != fuzzKeep) {
				t.Fatalf("body %q of %d entries, %d records: cut decodes %d entries, %d records (%v)", data,
					len(want.GetPublishes()), records(&want), len(got.GetPublishes()), records(&got), errGot)
			}
			// A prefix: every entry but the last equal, the last cut after
			// a prefix of its records (its fields past them dropped).
			for i, p := range got.GetPublishes() {
				w := want.GetPublishes()[i]
				last := i == len(got.GetPublishes())-1
				if (!last && !proto.Equal(p, w)) || len(p.GetRecords()) > len(w.GetRecords()) {
					t.Fatalf("body %q: entry %d cut to %v, stock %v", data, i, p, w)
				}
				for j, r := range p.GetRecords() {
					if !proto.Equal(r, w.GetRecords()[j]) {
						t.Fatalf("body %q: publishes[%d].records[%d] %v, stock %v", data, i, j, r, w.GetRecords()[j])
					}
				}
			}
		}
	})
}

// FuzzPublishManyBody: any body, protobuf or JSON, sent to the broker's
// PublishMany as it is: refused whole with a code naming the field and
// nothing stored, or answered one result per entry, each entry refused
// naming its field under publishes[i] or stored, and the record tail moved
// by exactly what the entries stored. This is the whole decode path: read
// limit, codecs, whole-call and per-entry checks.
func FuzzPublishManyBody(f *testing.F) {
	b := startFuzzBroker(f)
	clients := map[bool]*connect.Client[rawBody, strandv1.PublishManyResponse]{}
	for _, json := range []bool{false, true} {
		name := "proto"
		if json {
			name = "json"
		}
		clients[json] = connect.NewClient[rawBody, strandv1.PublishManyResponse](rpcserver.HTTPClient(),
			b.baseURL+strandv1connect.StreamServicePublishManyProcedure, connect.WithCodec(rawCodec{name: name}))
	}
	for _, m := range []*strandv1.PublishManyRequest{
		{Publishes: []*strandv1.PublishRequest{{Stream: fuzzStream, Records: []*strandv1.Record{{Payload: []byte("a")}}}}},
		{Publishes: []*strandv1.PublishRequest{{Stream: fuzzStream, Records: []*strandv1.Record{{Payload: []byte("a")}}}, {Stream: "other", Records: []*strandv1.Record{{}}}}},
		{Publishes: []*strandv1.PublishRequest{{Stream: fuzzStream, Records: []*strandv1.Record{{ProducerId: "p", Sequence: 1}}}, {Stream: "Bad", Records: []*strandv1.Record{{Headers: map[string]string{"": ""}}}}}},
		{Publishes: []*strandv1.PublishRequest{{Stream: fuzzStream}, {Stream: fuzzStream}}},
		{},
	} {
		pb, _ := proto.Marshal(m)
		js, _ := protojson.Marshal(m)
		f.Add(pb, false)
		f.Add(js, true)
	}
	f.Add([]byte(`{"publishes":[{"stream":"s","records":[{"payload":"not base64!"}]}]}`), true)
	f.Fuzz(func(t *testing.T, data []byte, json bool) {
		before := b.state()
		body := rawBody(data)
		res, err := clients[json].CallUnary(fuzzCtx(t), connect.NewRequest(&body))
		if err != nil {
			checkRefusal(t, "PublishMany", err, connect.CodeInvalidArgument, connect.CodeResourceExhausted)
			b.unchanged(t, "PublishMany", before)
			return
		}
		stored := 0
		for i, r := range res.Msg.GetResults() {
			switch o := r.GetOutcome().(type) {
			case *strandv1.PublishResult_Response:
				for _, d := range o.Response.GetDuplicate() {
					if !d {
						stored++
					}
				}
			case *strandv1.PublishResult_Error:
				prefix := rpcerr.EntryPrefix("publishes", i)
				eerr := rpcerr.FromEntry(o.Error, "")
				checkRefusal(t, "PublishMany entry", eerr, connect.CodeInvalidArgument, connect.CodeResourceExhausted, connect.CodeOutOfRange,
					connect.CodeFailedPrecondition, connect.CodeNotFound)
				for _, v := range rpcerr.FieldViolations(eerr) {
					if !strings.HasPrefix(v.GetField(), prefix) {
						t.Fatalf("entry %d's error names %q, not under %s", i, v.GetField(), prefix)
					}
				}
			default:
				t.Fatalf("entry %d answered no outcome", i)
			}
		}
		if got, want := b.m.Tails()[fuzzStream].RecordTail, before.tails[fuzzStream].RecordTail+uint64(stored); got != want {
			t.Fatalf("record tail %d after entries storing %d records, want %d", got, stored, want)
		}
	})
}
