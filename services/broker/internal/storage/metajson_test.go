package storage

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// appendMeta writes what json.Marshal writes for every shape of meta:
// each optional field present and absent, zero and extreme numbers, and
// strings that need escaping.
func TestAppendMetaIsJSONMarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	strs := []string{"", "inc-0f3a", "a\"b", `back\slash`, "<tag>&", "tab\there", "ünïcode", "\u2028", "bad\xffutf8", "ctl\x01"}
	num := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64
		default:
			return rng.Uint64() >> rng.IntN(64)
		}
	}
	epochs := func() []LogEpoch {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return []LogEpoch{}
		}
		out := make([]LogEpoch, 1+rng.IntN(3))
		for i := range out {
			out[i] = LogEpoch{Epoch: num(), RecordStart: num(), CursorEventStart: num()}
		}
		return out
	}
	for i := range 5000 {
		m := meta{
			Incarnation: strs[rng.IntN(len(strs))], Epoch: num(), LogEpochs: epochs(),
			SealEpoch: num(), SealTransition: strs[rng.IntN(len(strs))], SealedLogEpochs: epochs(),
			Head: num(), HeadChain: num(), Purged: num(), RecordTail: num(), Chain: num(),
			CursorEventTail: num(), CursorEventsPurged: num(), Bytes: num(), ConfirmWatermark: num(),
			Dropping: rng.IntN(2) == 0, ProducerGen: num(), UnsureEpoch: num(), TailsSeq: num(),
		}
		if rng.IntN(2) == 0 {
			m.Cut = &cutIntent{RecordTail: num(), CursorEventTail: num(), Chain: num(), Bytes: num(), ResetCursors: rng.IntN(2) == 0}
		}
		if n := rng.IntN(3); n > 0 {
			for range n {
				m.ProducerTables = append(m.ProducerTables, producerGen{Gen: num(), Boundary: num(), Chunks: rng.IntN(1<<20) - 10})
			}
		}
		want, err := json.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMeta(nil, &m); !bytes.Equal(got, want) {
			t.Fatalf("meta %d:\n got %s\nwant %s", i, got, want)
		}
		back, err := decodeMeta(appendMeta([]byte("prefix"), &m)[len("prefix"):])
		if err != nil || back.RecordTail != m.RecordTail {
			t.Fatalf("meta %d does not decode: %v", i, err)
		}
	}
}

// BenchmarkEncodeMeta is the committer's per-stream metadata encoding
// (groupMeta), against json.Marshal's.
func BenchmarkEncodeMeta(b *testing.B) {
	m := meta{Incarnation: "0f3a9c2e-7d4b-4e1a-9b8c-1d2e3f4a5b6c", Epoch: 3,
		LogEpochs: []LogEpoch{{Epoch: 1}, {Epoch: 3, RecordStart: 120934, CursorEventStart: 17}},
		Head:      1024, HeadChain: 0x9f3a1b2c3d4e5f60, RecordTail: 1209345, Chain: 0x1234567890abcdef,
		CursorEventTail: 1234, Bytes: 1 << 30, ConfirmWatermark: 1209300,
		ProducerTables: []producerGen{{Gen: 7, Boundary: 1200000, Chunks: 3}}, ProducerGen: 7}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendMeta(buf[:0], &m)
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(&m)
		}
	})
}

// appendMeta names every field it writes: a field added to meta (or to a
// type it holds) would be dropped from every metadata write without a
// sign, and TestAppendMetaIsJSONMarshal fills only the fields it knows.
// This fails first, naming the field to add to both.
func TestAppendMetaKnowsEveryField(t *testing.T) {
	known := map[string][]string{
		"meta": {"Incarnation", "Epoch", "LogEpochs", "SealEpoch", "SealTransition", "SealedLogEpochs", "Head", "HeadChain",
			"Purged", "RecordTail", "Chain", "CursorEventTail", "CursorEventsPurged", "Bytes", "ConfirmWatermark", "Cut",
			"Dropping", "ProducerTables", "ProducerGen", "UnsureEpoch", "TailsSeq"},
		"cutIntent":   {"RecordTail", "CursorEventTail", "Chain", "Bytes", "ResetCursors"},
		"producerGen": {"Gen", "Boundary", "Chunks"},
		"LogEpoch":    {"Epoch", "RecordStart", "CursorEventStart"},
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[meta](), reflect.TypeFor[cutIntent](), reflect.TypeFor[producerGen](), reflect.TypeFor[LogEpoch]()} {
		var fields []string
		for f := range typ.Fields() {
			if f.Tag.Get("json") == "-" {
				continue
			}
			fields = append(fields, f.Name)
		}
		if !slices.Equal(fields, known[typ.Name()]) {
			t.Errorf("%s has fields %v; appendMeta writes %v: add the new field to appendMeta (metajson.go), to TestAppendMetaIsJSONMarshal and here", typ.Name(), fields, known[typ.Name()])
		}
	}
}
