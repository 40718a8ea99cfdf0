package storage

import "testing"

// This file makes scripts/fuzz.sh (make test, make fuzz) fuzz the
// package's targets: FuzzTailsChunk here, FuzzRecordCodec and
// FuzzProducerChunk beside the codecs they test.

// Any bytes decode to an error or to tails that encode back to the same.
func FuzzTailsChunk(f *testing.F) {
	var w tailsWriter
	w.add("s", streamTails{1, 2, 3, 4, 5})
	out, _ := w.entries(1, nil, nil)
	f.Add(out[0].Value)
	f.Add([]byte{tailsVersion})
	f.Fuzz(func(t *testing.T, v []byte) {
		var again tailsWriter
		n := 0
		if err := decodeTails(v, func(name string, st streamTails) { again.add(name, st); n++ }); err != nil {
			return
		}
		out, _ := again.entries(1, nil, nil)
		m := 0
		for _, e := range out {
			if err := decodeTails(e.Value, func(string, streamTails) { m++ }); err != nil {
				t.Fatalf("re-encoded chunk does not decode: %v", err)
			}
		}
		if m != n {
			t.Fatalf("decoded %d streams, re-encoded %d", n, m)
		}
	})
}
