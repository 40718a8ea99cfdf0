package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestRetentionByRecordsClampsCursors(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	s := ownerStream(t, db, "r", 1)
	// Five batches, so five segments of two records each: retention to
	// head 8 leaves exactly the last one stored.
	var out []Record
	for i := range 5 {
		out = append(out, mustAppend(t, s, 1, recs(fmt.Sprintf("a%d-", i), 2))...)
	}
	if _, err := s.CommitCursor(ctx, 1, "slow", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitCursor(ctx, 1, "fast", 9); err != nil {
		t.Fatal(err)
	}
	bytes := s.State().Bytes

	// Unconfirmed records are never dropped.
	if h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 2}, time.Now()); err != nil || h != 0 {
		t.Fatalf("retention with no watermark: head %d, %v", h, err)
	}
	s.SetConfirmWatermark(6)
	if h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 2}, time.Now()); err != nil || h != 6 {
		t.Fatalf("retention up to the watermark: head %d, %v", h, err)
	}
	s.SetConfirmWatermark(10)
	h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 2}, time.Now())
	if err != nil || h != 8 {
		t.Fatalf("retention: head %d, %v", h, err)
	}
	st := s.State()
	if st.Head != 8 || st.RecordTail != 10 || st.Bytes >= bytes || st.Bytes == 0 {
		t.Fatalf("state %+v (bytes before %d)", st, bytes)
	}
	if p, _ := s.Cursor("slow"); p != 8 {
		t.Fatalf("slow cursor = %d, want clamped to 8", p)
	}
	if p, _ := s.Cursor("fast"); p != 9 {
		t.Fatalf("fast cursor = %d", p)
	}
	if _, err := s.Read(7, 1, 0); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read below head: %v", err)
	}
	if c, err := s.ChainAt(8); err != nil || c != out[7].Chain {
		t.Fatalf("ChainAt(head) = %#x, %v", c, err)
	}
	// A commit below the head lands at the head.
	if ev, err := s.CommitCursor(ctx, 1, "new", 2); err != nil || ev.Position != 8 {
		t.Fatalf("commit below head = %+v, %v", ev, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "r")
	if st2 := s.State(); st2.Head != 8 || st2.Bytes != st.Bytes {
		t.Fatalf("after restart %+v, before %+v", st2, st)
	}
	if got := mustRead(t, s, 8, 0); len(got) != 2 || got[0].Chain != out[8].Chain {
		t.Fatalf("retained records = %+v", got)
	}
	if got := s.storedOffsets(t); !slices.Equal(got, []uint64{8, 9}) {
		t.Fatalf("records left in storage %v, want [8 9]", got)
	}
	if p, _ := s.Cursor("slow"); p != 8 {
		t.Fatalf("slow cursor after restart = %d", p)
	}
}

func TestRetentionByBytes(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "b", 1)
	rs := make([]Record, 10)
	for i := range rs {
		rs[i] = Record{Payload: make([]byte, 100), PublishTime: time.Unix(1, 0)}
	}
	out := mustAppend(t, s, 1, rs)
	size := uint64(recordSize(&out[0]))
	if s.State().Bytes != 10*size {
		t.Fatalf("bytes = %d, want %d", s.State().Bytes, 10*size)
	}
	s.SetConfirmWatermark(10)
	h, err := s.ApplyRetention(context.Background(), Retention{MaxBytes: 3*size + size/2}, time.Now())
	if err != nil || h != 7 {
		t.Fatalf("head %d, %v; want 7", h, err)
	}
	if s.State().Bytes != 3*size {
		t.Fatalf("bytes = %d, want %d", s.State().Bytes, 3*size)
	}
}

func TestRetentionByAge(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	s := ownerStream(t, db, "age", 1)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	rs := make([]Record, 6)
	for i := range rs {
		rs[i] = Record{Payload: []byte{byte(i)}, PublishTime: now.Add(-time.Duration(6-i) * time.Minute)}
	}
	mustAppend(t, s, 1, rs)
	if _, err := s.CommitCursor(ctx, 1, "c", 1); err != nil {
		t.Fatal(err)
	}
	s.SetConfirmWatermark(6)
	// Records published 6..1 minutes ago; keep those at most 3.5 minutes old.
	h, err := s.ApplyRetention(context.Background(), Retention{MaxAge: 3*time.Minute + 30*time.Second}, now)
	if err != nil || h != 3 {
		t.Fatalf("head %d, %v; want 3", h, err)
	}
	if p, _ := s.Cursor("c"); p != 3 {
		t.Fatalf("cursor = %d, want 3", p)
	}
	if h, err := s.ApplyRetention(context.Background(), Retention{}, now.Add(time.Hour)); err != nil || h != 3 {
		t.Fatalf("zero retention moved the head to %d, %v", h, err)
	}
}

func TestRetentionManyWindows(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "big", 1)
	const n = 2*retentionWindow + 100
	for i := 0; i < n; i += 500 {
		mustAppend(t, s, 1, recs(fmt.Sprint("x", i), min(500, n-i)))
	}
	s.SetConfirmWatermark(n)
	h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 50}, time.Now())
	if err != nil || h != n-50 {
		t.Fatalf("head %d, %v; want %d", h, err, n-50)
	}
	if got := mustRead(t, s, h, 0); len(got) != 50 {
		t.Fatalf("%d records retained", len(got))
	}
}
