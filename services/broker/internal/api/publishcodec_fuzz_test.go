package api

import (
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcserver"
)

// fuzzKeep is the codecs' record bound under fuzzing: small, so inputs
// past it are common.
const fuzzKeep = 3

// FuzzPublishCodecs: on any body the publish codecs never panic and
// decode what connect-go's own codecs do, but for a batch of more than
// keep records, of which they decode exactly the first keep
// (publishcodec.go). A body the stock codec refuses is refused too, unless
// what it refuses lies past the keep-th record.
func FuzzPublishCodecs(f *testing.F) {
	for _, m := range []*strandv1.PublishRequest{
		{Stream: "s", Records: []*strandv1.Record{{Payload: []byte("a"), Headers: map[string]string{"k": "v"}, ProducerId: "p", Sequence: 1}}},
		{Stream: "s", Records: emptyRecords(fuzzKeep)},
		{Stream: "s", Records: emptyRecords(fuzzKeep + 1)},
		{Records: emptyRecords(10)},
	} {
		pb, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		js, err := protojson.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(pb, false)
		f.Add(js, true)
	}
	f.Add([]byte(`{"records":[{},{},{},{},{"payload":"!"}],"stream":"s"}`), true)
	f.Add([]byte(`{"stream":"s","records":[{"headers":{"{":"}"}},{},{}]}`), true)
	f.Add([]byte(`{"records":null}`), true)
	f.Fuzz(func(t *testing.T, data []byte, json bool) {
		var (
			want, got   strandv1.PublishRequest
			errWant     error
			errGot      error
			stockMarker string
		)
		if json {
			stockMarker = "protojson"
			if len(data) > 0 {
				errWant = (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, &want)
			} else {
				errWant = errEmpty
			}
			errGot = jsonCodec{name: "json", keep: fuzzKeep}.Unmarshal(data, &got)
		} else {
			stockMarker = "proto"
			errWant = proto.Unmarshal(data, &want)
			errGot = protoCodec{keep: fuzzKeep}.Unmarshal(data, &got)
		}
		switch {
		case errWant == nil && len(want.GetRecords()) <= fuzzKeep:
			if errGot != nil || !proto.Equal(&got, &want) {
				t.Fatalf("%s body %q: codec %v (%v), stock %v", stockMarker, data, &got, errGot, &want)
			}
		case errWant == nil:
			if errGot != nil || len(got.GetRecords()) != fuzzKeep {
				t.Fatalf("%s body %q of %d records: codec decoded %d (%v), want %d", stockMarker, data, len(want.GetRecords()), len(got.GetRecords()), errGot, fuzzKeep)
			}
			for i, r := range got.GetRecords() {
				if !proto.Equal(r, want.GetRecords()[i]) {
					t.Fatalf("%s body %q: records[%d] %v, stock %v", stockMarker, data, i, r, want.GetRecords()[i])
				}
			}
		case errGot == nil && len(got.GetRecords()) != fuzzKeep:
			t.Fatalf("%s body %q: stock refuses it (%v), the codec decoded %v", stockMarker, data, errWant, &got)
		}
	})
}

// errEmpty stands for the stock JSON codec's refusal of an empty body.
var errEmpty = errorString("zero-length payload")

type errorString string

func (e errorString) Error() string { return string(e) }

// rawBody is a request message sent as the bytes it holds (rawCodec).
type rawBody []byte

// rawCodec sends a rawBody's bytes as they are, under name, and decodes
// answers as the stock codec of that name does.
type rawCodec struct{ name string }

func (c rawCodec) Name() string { return c.name }

func (c rawCodec) Marshal(m any) ([]byte, error) {
	if b, ok := m.(*rawBody); ok {
		return *b, nil
	}
	return nil, errorString("rawCodec sends rawBody only")
}

func (c rawCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return errorString("rawCodec decodes proto messages only")
	}
	if c.name == "json" {
		return protojson.Unmarshal(data, pm)
	}
	return proto.Unmarshal(data, pm)
}

// FuzzPublishBody: any body, protobuf or JSON, sent to the broker's
// Publish as it is (past the client's encoding) is stored as the request
// it decodes to, or refused with a code of the table naming the field, and
// nothing stored. This is the whole decode path: read limit, publish
// codecs, handler checks.
func FuzzPublishBody(f *testing.F) {
	b := startFuzzBroker(f)
	clients := map[bool]*connect.Client[rawBody, strandv1.PublishResponse]{}
	for _, json := range []bool{false, true} {
		name := "proto"
		if json {
			name = "json"
		}
		clients[json] = connect.NewClient[rawBody, strandv1.PublishResponse](rpcserver.HTTPClient(),
			b.baseURL+strandv1connect.StreamServicePublishProcedure, connect.WithCodec(rawCodec{name: name}))
	}
	for _, m := range []*strandv1.PublishRequest{
		{Stream: fuzzStream, Records: []*strandv1.Record{{Payload: []byte("a"), Headers: map[string]string{"k": "v"}}}},
		{Stream: fuzzStream, Records: []*strandv1.Record{{ProducerId: "p", Sequence: 1}, {ProducerId: "p", Sequence: 2}}},
		{Stream: fuzzStream},
		{Stream: "other", Records: []*strandv1.Record{{}}},
	} {
		pb, _ := proto.Marshal(m)
		js, _ := protojson.Marshal(m)
		f.Add(pb, false)
		f.Add(js, true)
	}
	f.Add([]byte(`{"stream":"s","records":[{"payload":"not base64!"}]}`), true)
	f.Add([]byte{0x0a, 0x01, 's', 0x12, 0xff}, false)
	f.Fuzz(func(t *testing.T, data []byte, json bool) {
		before := b.state()
		body := rawBody(data)
		res, err := clients[json].CallUnary(fuzzCtx(t), connect.NewRequest(&body))
		if err != nil {
			checkRefusal(t, "Publish", err, connect.CodeInvalidArgument, connect.CodeResourceExhausted, connect.CodeOutOfRange,
				connect.CodeFailedPrecondition, connect.CodeNotFound)
			b.unchanged(t, "Publish", before)
			return
		}
		stored := 0
		for _, d := range res.Msg.GetDuplicate() {
			if !d {
				stored++
			}
		}
		if got, want := b.m.Tails()[fuzzStream].RecordTail, before.tails[fuzzStream].RecordTail+uint64(stored); got != want {
			t.Fatalf("record tail %d after a publish storing %d records, want %d", got, stored, want)
		}
	})
}
