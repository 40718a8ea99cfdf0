package storage

import (
	"bytes"
	"math"
	"testing"
	"time"
)

func TestRecordCodecRoundTrip(t *testing.T) {
	in := []Record{
		{},
		{Offset: 1 << 40, Epoch: 7, Payload: []byte("hello"), Headers: map[string]string{"b": "2", "a": "1", "": ""},
			PublishTime: time.Unix(0, 123456789).UTC(), ProducerID: "p", Sequence: math.MaxUint64, Chain: 0xdeadbeef},
		{PublishTime: time.Unix(-5, 0).UTC(), Payload: bytes.Repeat([]byte{0}, 5000)},
	}
	for i, r := range in {
		v := encodeRecord(nil, &r)
		if len(v) != recordSize(&r) {
			t.Fatalf("record %d: encoded %d bytes, recordSize %d", i, len(v), recordSize(&r))
		}
		got, err := decodeRecord(v)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if err := sameRecord(got, r); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if Chain(1, &got) != Chain(1, &r) {
			t.Fatalf("record %d: chain changed by the round trip", i)
		}
	}
	for _, bad := range [][]byte{nil, {2}, {1, 0x80}, encodeRecord(nil, &in[1])[:20]} {
		if _, err := decodeRecord(bad); err == nil {
			t.Fatalf("decoded %x", bad)
		}
	}
}

func TestChainCoversEveryField(t *testing.T) {
	base := Record{Offset: 3, Epoch: 2, Payload: []byte("p"), Headers: map[string]string{"k": "v"},
		PublishTime: time.Unix(10, 0), ProducerID: "pr", Sequence: 9}
	c := Chain(5, &base)
	if Chain(5, &base) != c {
		t.Fatal("chain is not deterministic")
	}
	changes := map[string]func(r *Record){
		"offset":   func(r *Record) { r.Offset++ },
		"epoch":    func(r *Record) { r.Epoch++ },
		"payload":  func(r *Record) { r.Payload = []byte("q") },
		"header":   func(r *Record) { r.Headers = map[string]string{"k": "w"} },
		"time":     func(r *Record) { r.PublishTime = r.PublishTime.Add(1) },
		"producer": func(r *Record) { r.ProducerID = "ps" },
		"sequence": func(r *Record) { r.Sequence++ },
	}
	for name, change := range changes {
		r := base
		change(&r)
		if Chain(5, &r) == c {
			t.Fatalf("chain does not cover the %s", name)
		}
	}
	if Chain(6, &base) == c {
		t.Fatal("chain does not cover the previous chain")
	}
	r := base
	r.Chain = 42
	if Chain(5, &r) != c {
		t.Fatal("chain covers the record's own chain field")
	}
}

func FuzzRecordCodec(f *testing.F) {
	f.Add([]byte("payload"), "producer", uint64(1), int64(1e18), "k", "v", uint64(3))
	f.Add([]byte{}, "", uint64(0), int64(math.MinInt64), "", "", uint64(0))
	f.Fuzz(func(t *testing.T, payload []byte, producer string, seq uint64, nanos int64, hk, hv string, epoch uint64) {
		r := Record{Offset: seq ^ epoch, Epoch: epoch, Payload: payload, Headers: map[string]string{hk: hv},
			PublishTime: fromUnixNanos(nanos), ProducerID: producer, Sequence: seq, Chain: uint64(nanos)}
		v := encodeRecord(nil, &r)
		if len(v) != recordSize(&r) {
			t.Fatalf("encoded %d bytes, recordSize %d", len(v), recordSize(&r))
		}
		got, err := decodeRecord(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameRecord(got, r); err != nil {
			t.Fatal(err)
		}
		if Chain(7, &got) != Chain(7, &r) {
			t.Fatal("chain changed by the round trip")
		}
		// Arbitrary bytes never panic, and what decodes re-encodes to a
		// value that decodes the same.
		for _, b := range [][]byte{payload, v[:len(v)/2]} {
			d, err := decodeRecord(b)
			if err != nil {
				continue
			}
			d2, err := decodeRecord(encodeRecord(nil, &d))
			if err != nil {
				t.Fatal(err)
			}
			if err := sameRecord(d, d2); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := decodeEvent(payload); err == nil {
			ev, _ := decodeEvent(payload)
			ev2, err := decodeEvent(encodeEvent(nil, &ev))
			if err != nil || ev2 != ev {
				t.Fatalf("event round trip: %+v vs %+v, %v", ev, ev2, err)
			}
		}
	})
}
