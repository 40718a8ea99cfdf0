package storage

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// appendBatches appends n batches of size records and returns them all.
func appendBatches(t *testing.T, s *Stream, n, size int) []Record {
	t.Helper()
	var out []Record
	for i := range n {
		out = append(out, mustAppend(t, s, 1, recs(fmt.Sprintf("b%d", i), size))...)
	}
	return out
}

func offsets(from, to uint64) []uint64 {
	var out []uint64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

// A head and a cut inside a segment: reads start exactly at the head,
// the straddling segment stays until the head passes its last record, a
// cut rewrites the segment it lands in, and all of it holds across a
// reopen.
func TestSegmentsStraddlingHeadAndCut(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := ownerStream(t, db, "s", 1)
	out := appendBatches(t, s, 3, 4) // segments [0,3] [4,7] [8,11]
	if lasts, _, err := s.storedSegments(); err != nil || !slices.Equal(lasts, []uint64{3, 7, 11}) {
		t.Fatalf("segments %v, %v; want keyed 3, 7, 11", lasts, err)
	}

	s.SetConfirmWatermark(12)
	if h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 6}, time.Now()); err != nil || h != 6 {
		t.Fatalf("retention: head %d, %v", h, err)
	}
	if got := s.storedOffsets(t); !slices.Equal(got, offsets(4, 12)) {
		t.Fatalf("stored %v after retention to 6, want the segments from 4 on", got)
	}
	if got := mustRead(t, s, 6, 0); len(got) != 6 || got[0].Offset != 6 || got[0].Chain != out[6].Chain {
		t.Fatalf("read from the head = %d records starting %+v", len(got), got)
	}
	if c, err := s.ChainAt(7); err != nil || c != out[6].Chain {
		t.Fatalf("ChainAt(7) = %#x, %v", c, err)
	}

	if err := s.Cut(context.Background(), 9, 0); err != nil {
		t.Fatal(err)
	}
	if lasts, offs, err := s.storedSegments(); err != nil || !slices.Equal(lasts, []uint64{7, 8}) || !slices.Equal(offs[1], []uint64{8}) {
		t.Fatalf("after a cut at 9: segments %v %v, %v; want [4,7] and [8]", lasts, offs, err)
	}
	if st := s.State(); st.RecordTail != 9 || st.Chain != out[8].Chain {
		t.Fatalf("after the cut %+v", st)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "s")
	if got := mustRead(t, s, 6, 0); len(got) != 3 || got[2].Chain != out[8].Chain {
		t.Fatalf("after reopen: read %d records", len(got))
	}
	more := mustAppend(t, s, 1, recs("c", 2))
	if more[0].Offset != 9 || more[0].Chain != Chain(out[8].Chain, &more[0]) {
		t.Fatalf("append after the cut: %+v", more[0])
	}
	s.SetConfirmWatermark(11)
	if h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 2}, time.Now()); err != nil || h != 9 {
		t.Fatalf("retention: head %d, %v", h, err)
	}
	if got := s.storedOffsets(t); !slices.Equal(got, offsets(9, 11)) {
		t.Fatalf("stored %v once the head passed segments [4,7] and [8], want [9 10]", got)
	}
}

// Truncation writes the kept prefix of the straddling segment before it
// deletes the old one. If Badger splits that op and the process dies in
// between, both are stored; truncating again (as the next open does)
// converges on the same log.
func TestTruncateRecordsAfterSplitOp(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := ownerStream(t, db, "s", 1)
	out := appendBatches(t, s, 2, 4) // [0,3] [4,7]
	// The state a split op leaves: the prefix [4,5] written, [4,7] not yet
	// deleted.
	o := &op{}
	seg := newSegmentBuilder(s.recPrefix, db.maxEntryBytes, segmentEstimate(out[4:6]))
	for i := 4; i < 6; i++ {
		seg.add(o, &out[i])
	}
	seg.flush(o)
	if err := db.do(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if lasts, _, _ := s.storedSegments(); !slices.Equal(lasts, []uint64{3, 5, 7}) {
		t.Fatalf("segments %v, want overlapping 3, 5, 7", lasts)
	}
	for range 2 { // idempotent
		if err := s.truncateRecords(context.Background(), 6); err != nil {
			t.Fatal(err)
		}
		if got := s.storedOffsets(t); !slices.Equal(got, offsets(0, 6)) {
			t.Fatalf("stored %v after truncating at 6, want 0..5", got)
		}
	}
}

// A batch larger than one segment may hold is split across segments, each
// within the bound, and reads back whole.
func TestLargeBatchSplitsIntoSegments(t *testing.T) {
	db, err := Open(Options{Dir: t.TempDir(), Logger: zerolog.Nop(), MemTableBytes: 1 << 20, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	out := mustAppend(t, s, 1, sizedRecs("big", 300, 1024))
	lasts, offs, err := s.storedSegments()
	if err != nil || len(lasts) < 3 {
		t.Fatalf("%d segments for 300 KiB with a %d-byte bound, %v", len(lasts), db.maxEntryBytes, err)
	}
	next := uint64(0)
	for i, in := range offs {
		if in[0] != next || lasts[i] != in[len(in)-1] {
			t.Fatalf("segment %d keyed %d holds %v, want from %d", i, lasts[i], in, next)
		}
		next = lasts[i] + 1
	}
	got := mustRead(t, s, 0, 0)
	if len(got) != len(out) {
		t.Fatalf("read %d records, want %d", len(got), len(out))
	}
	for i := range got {
		if err := sameRecord(got[i], out[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Bytes counts record encodings, not segment framing.
	var want uint64
	for i := range out {
		want += uint64(recordSize(&out[i]))
	}
	if st := s.State(); st.Bytes != want {
		t.Fatalf("Bytes %d, want %d", st.Bytes, want)
	}
}
