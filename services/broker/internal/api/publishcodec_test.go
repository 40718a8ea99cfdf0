package api

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

func emptyRecords(n int) []*strandv1.Record {
	recs := make([]*strandv1.Record, n)
	for i := range recs {
		recs[i] = &strandv1.Record{}
	}
	return recs
}

// encodings are the publish codecs with how a client encodes for each.
var encodings = map[string]struct {
	codec  func(keep int) interface{ Unmarshal([]byte, any) error }
	encode func(proto.Message) ([]byte, error)
}{
	"proto": {func(keep int) interface{ Unmarshal([]byte, any) error } { return protoCodec{keep: keep} }, proto.Marshal},
	"json":  {func(keep int) interface{ Unmarshal([]byte, any) error } { return jsonCodec{name: "json", keep: keep} }, protojson.Marshal},
}

// A batch far above the limit is decoded only up to the limit: empty
// records cost 2 bytes (3 in JSON) on the wire and about 100 in memory,
// so decoding all of them is what a small body exhausts a broker with.
func TestPublishCodecsDecodeAtMostKeepRecords(t *testing.T) {
	const keep = 11
	for name, enc := range encodings {
		for _, n := range []int{keep + 1, 100_000} {
			// Fields on either side of the records: the stream before them
			// is kept.
			data, err := enc.encode(&strandv1.PublishRequest{Stream: "s", Records: emptyRecords(n)})
			if err != nil {
				t.Fatal(err)
			}
			var got strandv1.PublishRequest
			if err := enc.codec(keep).Unmarshal(data, &got); err != nil {
				t.Fatalf("%s, %d records: %v", name, n, err)
			}
			if len(got.GetRecords()) != keep || got.GetStream() != "s" {
				t.Errorf("%s, %d records: decoded %d records of stream %q, want %d of s", name, n, len(got.GetRecords()), got.GetStream(), keep)
			}
		}
	}
	// JSON written by hand: whitespace, the stream after the records,
	// and a body that turns malformed only past the limit.
	for _, body := range []string{
		`{ "records" : [ {} , {}, {},{},{},{},{},{},{},{},{},{}, {} ] , "stream": "s" }`,
		`{"records":[{},{},{},{},{},{},{},{},{},{},{},{},{}, this is not JSON`,
	} {
		var got strandv1.PublishRequest
		if err := (jsonCodec{name: "json", keep: keep}).Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if len(got.GetRecords()) != keep {
			t.Errorf("%s: decoded %d records, want %d", body, len(got.GetRecords()), keep)
		}
	}
}

// Within the limit, and for every other message, the codecs decode exactly
// what connect-go's own do; malformed bodies are refused as there.
func TestPublishCodecsKeepMessagesWithinTheLimit(t *testing.T) {
	const keep = 4
	braces := "{" + strings.Repeat("}{", 10) + "}" // '{' in strings: the JSON bound is not enough
	in := &strandv1.PublishRequest{Stream: "s", Records: []*strandv1.Record{
		{Payload: []byte("a"), Headers: map[string]string{"k": braces}, ProducerId: "p", Sequence: 1},
		{Payload: []byte("b"), Headers: map[string]string{braces: "v"}, ProducerId: "p", Sequence: 2},
		{},
		{Payload: []byte(braces)},
	}}
	for name, enc := range encodings {
		data, err := enc.encode(in)
		if err != nil {
			t.Fatal(err)
		}
		var got strandv1.PublishRequest
		if err := enc.codec(keep).Unmarshal(data, &got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !proto.Equal(&got, in) {
			t.Errorf("%s: decoded %v, want %v", name, &got, in)
		}
		other := &strandv1.ReadRequest{Stream: "s", FromOffset: 7, MaxRecords: 3}
		data, err = enc.encode(other)
		if err != nil {
			t.Fatal(err)
		}
		var read strandv1.ReadRequest
		if err := enc.codec(keep).Unmarshal(data, &read); err != nil || !proto.Equal(&read, other) {
			t.Errorf("%s: ReadRequest decoded %v (%v), want %v", name, &read, err, other)
		}
	}
	// Unknown fields: dropped from JSON (as connect-go does), kept in
	// protobuf.
	var got strandv1.PublishRequest
	if err := (jsonCodec{name: "json", keep: keep}).Unmarshal([]byte(`{"stream":"s","future":1}`), &got); err != nil || got.GetStream() != "s" {
		t.Errorf("JSON with an unknown field: %v, %v", &got, err)
	}
	malformed := map[string][]byte{
		"proto": protowire.AppendTag([]byte{}, 2, protowire.BytesType), // a records tag without its length
		"json":  []byte(`{"stream":"s","records":[{},`),
	}
	for name, data := range malformed {
		var got strandv1.PublishRequest
		if err := encodings[name].codec(keep).Unmarshal(data, &got); err == nil {
			t.Errorf("%s: malformed %q decoded", name, data)
		}
	}
}

// The Go client's batches, at its defaults, are well within what a broker
// at its defaults accepts and reads.
func TestClientBatchesFitTheBrokerDefaults(t *testing.T) {
	l := Limits{}.withDefaults()
	if client.DefaultMaxBatchRecords > l.MaxBatchRecords {
		t.Errorf("client batches of %d records, broker limit %d", client.DefaultMaxBatchRecords, l.MaxBatchRecords)
	}
	if client.DefaultMaxBatchBytes > l.MaxBatchBytes {
		t.Errorf("client batches of %d bytes, broker limit %d", client.DefaultMaxBatchBytes, l.MaxBatchBytes)
	}
	// Every batch a broker accepts fits its dedupe window, so a retry of
	// it after a lost answer is answered as duplicates.
	if l.MaxBatchRecords > storage.DefaultProducerWindow {
		t.Errorf("publish batches of up to %d records, dedupe window %d records", l.MaxBatchRecords, storage.DefaultProducerWindow)
	}
	// A full batch of the largest records, each with the largest producer
	// id, encodes within Publish's read limit (at a smaller scale than the
	// defaults, and at one byte a record).
	for _, l := range []Limits{{MaxBatchBytes: 1 << 20, MaxBatchRecords: 4096}, {MaxBatchBytes: 4096, MaxBatchRecords: 4096}} {
		l = l.withDefaults()
		recs := make([]*strandv1.Record, l.MaxBatchRecords)
		id := strings.Repeat("p", storage.MaxProducerID)
		for i := range recs {
			recs[i] = &strandv1.Record{Payload: make([]byte, l.MaxBatchBytes/l.MaxBatchRecords), ProducerId: id, Sequence: ^uint64(0)}
		}
		for name, enc := range encodings {
			data, err := enc.encode(&strandv1.PublishRequest{Stream: strings.Repeat("s", 128), Records: recs})
			if err != nil {
				t.Fatal(err)
			}
			if limit := l.publishRequestMaxBytes(); len(data) > limit {
				t.Errorf("%s: a full batch (%d bytes, %d records) is %d bytes, above the read limit of %d", name, l.MaxBatchBytes, l.MaxBatchRecords, len(data), limit)
			}
		}
	}
}
