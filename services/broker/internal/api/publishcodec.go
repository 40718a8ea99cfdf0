package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// Decoding a publish costs far more than its bytes on the wire: an empty
// record is 2 bytes of protobuf (3 of JSON) and about 100 bytes of Go
// struct and pointer, so a request within any sane read limit could still
// become gigabytes before Publish counted its records. The codecs below are
// connect-go's protobuf and JSON codecs, except that they decode a
// PublishRequest only up to its first keep records: the fields after the
// keep-th record are never decoded. keep is MaxBatchRecords+1 (Handler)
// and Publish refuses every batch of more than MaxBatchRecords records
// before it looks at anything else, so what is left undecoded is never
// needed. That check must stay first: without it a cut batch would be
// stored in part (TestPublishRecordLimit). Any other message, and any
// publish within the limit, decodes exactly as with connect-go's own codecs
// (codec.go there): the bytes are only scanned.

// publishRecords describes PublishRequest.records, the field counted.
var publishRecords = (&strandv1.PublishRequest{}).ProtoReflect().Descriptor().Fields().ByName("records")

// publishCodecs are the handler options that register the codecs for every
// name connect-go serves protobuf and JSON under.
func publishCodecs(keep int) []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(protoCodec{keep: keep}),
		connect.WithCodec(jsonCodec{name: "json", keep: keep}),
		connect.WithCodec(jsonCodec{name: "json; charset=utf-8", keep: keep}),
	}
}

type protoCodec struct{ keep int }

func (protoCodec) Name() string { return "proto" }

func (protoCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, notProto(m)
	}
	return proto.Marshal(pm)
}

func (c protoCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return notProto(m)
	}
	switch m.(type) {
	case *strandv1.PublishRequest:
		data = protoRecordsPrefix(data, c.keep)
	case *strandv1.PublishManyRequest:
		data = protoPublishesPrefix(data, MaxPublishManyEntries+1, c.keep)
	}
	if err := proto.Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

// protoRecordsPrefix returns data up to the first field past the keep-th
// record of a PublishRequest, or data whole when it has no more than keep
// records. Malformed data is returned whole, for proto.Unmarshal to say
// what is wrong: it stops there, before more than keep records.
func protoRecordsPrefix(data []byte, keep int) []byte {
	if len(data) < 2*(keep+1) {
		return data // a record is at least 2 bytes: there are at most keep
	}
	n := 0
	for off := 0; off < len(data); {
		num, typ, tagLen := protowire.ConsumeTag(data[off:])
		if tagLen < 0 {
			return data
		}
		valLen := protowire.ConsumeFieldValue(num, typ, data[off+tagLen:])
		if valLen < 0 {
			return data
		}
		if num == publishRecords.Number() && typ == protowire.BytesType {
			if n == keep {
				return data[:off]
			}
			n++
		}
		off += tagLen + valLen
	}
	return data
}

type jsonCodec struct {
	name string
	keep int
}

func (c jsonCodec) Name() string { return c.name }

func (jsonCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, notProto(m)
	}
	return protojson.Marshal(pm)
}

func (c jsonCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return notProto(m)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	switch m.(type) {
	case *strandv1.PublishRequest:
		data = jsonRecordsPrefix(data, c.keep)
	case *strandv1.PublishManyRequest:
		data = jsonPublishesPrefix(data, MaxPublishManyEntries+1, c.keep)
	}
	// As connect-go: unknown fields are dropped, so clients and servers
	// need not share one version of the schema.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

// jsonRecordsPrefix returns a PublishRequest in JSON cut after the keep-th
// element of its records array and closed (`]}`), or data whole when the
// array has no more than keep elements. Malformed data is returned whole,
// for protojson to say what is wrong: it stops there, before more than
// keep records.
func jsonRecordsPrefix(data []byte, keep int) []byte {
	// Every record is an object (protojson refuses null elements), and
	// the request is one: with no more than keep+1 '{', there are at
	// most keep records.
	if bytes.Count(data, []byte{'{'}) <= keep+1 {
		return data
	}
	out, _ := jsonRecordsPrefixN(data, keep)
	return out
}

// jsonRecordsPrefixN is jsonRecordsPrefix, also returning how many records
// the answer holds (of malformed data, how many precede the fault).
func jsonRecordsPrefixN(data []byte, keep int) ([]byte, int) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return data, 0
	}
	var skip json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return data, 0
		}
		if key, _ := t.(string); key != publishRecords.JSONName() && key != string(publishRecords.Name()) {
			if err := dec.Decode(&skip); err != nil {
				return data, 0
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return data, 0 // null, or not an array: protojson answers it
		}
		n := 0
		for ; dec.More(); n++ {
			if n == keep {
				end := dec.InputOffset()
				return append(data[:end:end], ']', '}'), n
			}
			if err := dec.Decode(&skip); err != nil {
				return data, n
			}
		}
		// A second records key is a duplicate, which protojson refuses
		// before it decodes the value.
		return data, n
	}
	return data, 0
}

// A PublishManyRequest is cut the same way (PublishMany checks its bounds
// before anything else): after its keepEntries-th entry, or within the
// entry that brings its records to keepRecords, keepEntries and
// keepRecords being one past MaxPublishManyEntries and MaxBatchRecords.

// publishManyEntries describes PublishManyRequest.publishes.
var publishManyEntries = (&strandv1.PublishManyRequest{}).ProtoReflect().Descriptor().Fields().ByName("publishes")

// protoPublishesPrefix cuts a PublishManyRequest in protobuf: data up to
// the first field past its keepEntries-th entry, or up to the entry that
// brings the records to keepRecords, that entry cut after its records
// (protoRecordsPrefix) and framed again. Data within both bounds, and
// malformed data, is returned whole, as protoRecordsPrefix does.
func protoPublishesPrefix(data []byte, keepEntries, keepRecords int) []byte {
	if len(data) < 2*(min(keepEntries, keepRecords)+1) {
		return data // entries and records are at least 2 bytes each
	}
	entries, records := 0, 0
	for off := 0; off < len(data); {
		num, typ, tagLen := protowire.ConsumeTag(data[off:])
		if tagLen < 0 {
			return data
		}
		valLen := protowire.ConsumeFieldValue(num, typ, data[off+tagLen:])
		if valLen < 0 {
			return data
		}
		if num == publishManyEntries.Number() && typ == protowire.BytesType {
			if entries == keepEntries {
				return data[:off]
			}
			entries++
			entry, _ := protowire.ConsumeBytes(data[off+tagLen:])
			n, ok := protoRecordsCount(entry, keepRecords-records)
			if !ok {
				return data // proto.Unmarshal stops within this entry
			}
			if records += n; records >= keepRecords {
				cut := protoRecordsPrefix(entry, n)
				out := protowire.AppendTag(data[:off:off], publishManyEntries.Number(), protowire.BytesType)
				return protowire.AppendBytes(out, cut)
			}
		}
		off += tagLen + valLen
	}
	return data
}

// protoRecordsCount counts the records of a PublishRequest in protobuf, up
// to limit; ok is false for malformed data.
func protoRecordsCount(data []byte, limit int) (n int, ok bool) {
	for off := 0; off < len(data) && n < limit; {
		num, typ, tagLen := protowire.ConsumeTag(data[off:])
		if tagLen < 0 {
			return n, false
		}
		valLen := protowire.ConsumeFieldValue(num, typ, data[off+tagLen:])
		if valLen < 0 {
			return n, false
		}
		if num == publishRecords.Number() && typ == protowire.BytesType {
			n++
		}
		off += tagLen + valLen
	}
	return n, true
}

// jsonPublishesPrefix cuts a PublishManyRequest in JSON as
// protoPublishesPrefix does: rebuilt as {"publishes":[...]} of the entries
// kept, the last one cut by jsonRecordsPrefixN. Data within both bounds,
// and malformed data, is returned whole.
func jsonPublishesPrefix(data []byte, keepEntries, keepRecords int) []byte {
	// Entries and records are objects, in an object: see jsonRecordsPrefix.
	if bytes.Count(data, []byte{'{'}) <= min(keepEntries, keepRecords)+1 {
		return data
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return data
	}
	var skip json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return data
		}
		if key, _ := t.(string); key != publishManyEntries.JSONName() && key != string(publishManyEntries.Name()) {
			if err := dec.Decode(&skip); err != nil {
				return data
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return data
		}
		var kept [][]byte
		records := 0
		for dec.More() {
			if len(kept) == keepEntries {
				return jsonPublishes(kept)
			}
			var entry json.RawMessage
			if err := dec.Decode(&entry); err != nil {
				return data
			}
			cut, n := jsonRecordsPrefixN(entry, keepRecords-records)
			kept = append(kept, cut)
			if records += n; records >= keepRecords {
				return jsonPublishes(kept)
			}
		}
		return data
	}
	return data
}

// jsonPublishes is a PublishManyRequest in JSON of the entries given.
func jsonPublishes(entries [][]byte) []byte {
	out := []byte(`{"publishes":[`)
	out = append(out, bytes.Join(entries, []byte{','})...)
	return append(out, ']', '}')
}

func notProto(m any) error { return fmt.Errorf("%T doesn't implement proto.Message", m) }
