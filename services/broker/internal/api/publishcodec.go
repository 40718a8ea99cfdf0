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
	if _, ok := m.(*strandv1.PublishRequest); ok {
		data = protoRecordsPrefix(data, c.keep)
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
	if _, ok := m.(*strandv1.PublishRequest); ok {
		data = jsonRecordsPrefix(data, c.keep)
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
		if key, _ := t.(string); key != publishRecords.JSONName() && key != string(publishRecords.Name()) {
			if err := dec.Decode(&skip); err != nil {
				return data
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return data // null, or not an array: protojson answers it
		}
		for n := 0; dec.More(); n++ {
			if n == keep {
				end := dec.InputOffset()
				return append(data[:end:end], ']', '}')
			}
			if err := dec.Decode(&skip); err != nil {
				return data
			}
		}
		// A second records key is a duplicate, which protojson refuses
		// before it decodes the value.
		return data
	}
	return data
}

func notProto(m any) error { return fmt.Errorf("%T doesn't implement proto.Message", m) }
