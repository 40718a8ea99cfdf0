package api

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
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
