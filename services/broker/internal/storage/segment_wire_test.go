package storage

import "testing"

// A segment decodes to the records it was encoded from, payloads aliasing
// the segment; anything cut short or of another version is refused.
func TestEncodeDecodeSegment(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	out := mustAppend(t, s, 1, recs("a", 5))
	seg := EncodeSegment(out)
	got, err := DecodeSegment(seg)
	if err != nil || len(got) != len(out) {
		t.Fatalf("DecodeSegment = %d records, %v", len(got), err)
	}
	for i := range got {
		if err := sameRecord(got[i], out[i]); err != nil {
			t.Fatal(err)
		}
		if got[i].Chain != out[i].Chain || got[i].Offset != out[i].Offset || got[i].Epoch != out[i].Epoch {
			t.Fatalf("record %d: %+v, want %+v", i, got[i], out[i])
		}
	}
	if recs, err := DecodeSegment(nil); err != nil || recs != nil {
		t.Fatalf("empty segment: %v, %v", recs, err)
	}
	if EncodeSegment(nil) != nil {
		t.Fatal("no records encode to a non-empty segment")
	}
	for _, bad := range [][]byte{
		seg[:len(seg)-1],              // last record cut short
		append([]byte{1}, seg[1:]...), // the per-record layout's version
		{segmentVersion, 0xff},        // a length past the end
	} {
		if recs, err := DecodeSegment(bad); err == nil {
			t.Errorf("DecodeSegment(%x...) = %d records, want an error", bad[:min(len(bad), 8)], len(recs))
		}
	}
}
