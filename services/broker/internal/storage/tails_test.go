package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// storedMeta reads s's metadata as Badger holds it, with the tails entries
// newer than it applied (what a restart would find, tails.go).
func storedMeta(t *testing.T, s *Stream) meta {
	t.Helper()
	m := rawMeta(t, s)
	lt, err := readTails(s.db.eng)
	if err != nil {
		t.Fatal(err)
	}
	lt.apply(s.name, &m)
	return m
}

// crashAndOpen plays a crash of the process (the store as the page cache
// holds it now, on the same boot), closes db and opens the crashed copy.
func (h *crashHarness) crashAndOpen(db *DB) *DB {
	h.t.Helper()
	crashed := h.crashCopy(h.valueLogs())
	if err := db.Close(); err != nil {
		h.t.Fatal(err)
	}
	return h.open(crashed)
}

// tailsKeys lists the tails keys Badger holds.
func tailsKeys(t *testing.T, db *DB) [][]byte {
	t.Helper()
	lt, err := readTails(db.eng)
	if err != nil {
		t.Fatal(err)
	}
	return lt.keys
}

// rawMeta reads s's metadata key alone, without the tails entries; a zero
// meta when there is none.
func rawMeta(t *testing.T, s *Stream) meta {
	t.Helper()
	var m meta
	err := s.db.eng.View(func(txn *engine.Txn) error {
		item, err := txn.Get(s.metaKey)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) (err error) {
			m, err = decodeMeta(v)
			return err
		})
	})
	if err != nil && !errors.Is(err, engine.ErrNotFound) {
		t.Fatal(err)
	}
	return m
}

// Every field of meta but the tails must make two metadata differ: a field
// onlyTailsDiffer missed would be written only as tails, and a restart
// would lose it.
func TestOnlyTailsDifferComparesEveryField(t *testing.T) {
	tails := map[string]bool{"RecordTail": true, "Chain": true, "CursorEventTail": true, "Bytes": true, "ConfirmWatermark": true, "TailsSeq": true}
	typ := reflect.TypeFor[meta]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		var a, b meta
		v := reflect.ValueOf(&b).Elem().Field(i)
		switch v.Kind() {
		case reflect.Uint64:
			v.SetUint(7)
		case reflect.String:
			v.SetString("x")
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Slice:
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		case reflect.Pointer:
			v.Set(reflect.New(v.Type().Elem()))
		default:
			t.Fatalf("field %s of kind %v: teach this test to change it", f.Name, v.Kind())
		}
		if got := onlyTailsDiffer(&a, &b); got != tails[f.Name] {
			t.Errorf("metadata differing in %s: onlyTailsDiffer = %v, want %v", f.Name, got, tails[f.Name])
		}
	}
	// A cut intent is compared by value, not by pointer.
	a, b := meta{Cut: &cutIntent{RecordTail: 3}}, meta{Cut: &cutIntent{RecordTail: 3}}
	if !onlyTailsDiffer(&a, &b) {
		t.Error("equal cut intents at different addresses differ")
	}
	b.Cut.Chain = 1
	if onlyTailsDiffer(&a, &b) {
		t.Error("cut intents with different chains do not differ")
	}
}

// Appends write their tails, not the whole metadata; a crash of the
// process finds them (folded back into the metadata on open, which leaves
// no tails entry), and the log goes on from there.
func TestTailsSurviveACrash(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	first := mustAppend(t, s, 1, recs("a", 3))
	var want []Record
	want = append(want, first...)
	for i := range 4 {
		want = append(want, mustAppend(t, s, 1, recs(fmt.Sprint("b", i), 2))...)
	}
	s.SetConfirmWatermark(uint64(len(want)))
	db.flushWatermarks(true)
	// Queued behind the watermark's write: done once it is.
	if err := db.do(context.Background(), &op{}); err != nil {
		t.Fatal(err)
	}
	st := s.State()
	if raw := rawMeta(t, s); raw.RecordTail >= st.RecordTail {
		t.Fatalf("the metadata key holds tail %d after appends to %d: appends rewrote it", raw.RecordTail, st.RecordTail)
	}
	if len(tailsKeys(t, db)) == 0 {
		t.Fatal("no tails entry after appends")
	}
	if got := storedMeta(t, s); got.RecordTail != st.RecordTail || got.Chain != st.Chain || got.ConfirmWatermark != uint64(len(want)) {
		t.Fatalf("stored tails %d %#x watermark %d, want %d %#x %d", got.RecordTail, got.Chain, got.ConfirmWatermark, st.RecordTail, st.Chain, len(want))
	}
	db = h.crashAndOpen(db)
	defer db.Close()
	if keys := tailsKeys(t, db); len(keys) != 0 {
		t.Fatalf("%d tails entries left after the open folded them", len(keys))
	}
	s = openStream(t, db, "s")
	got := s.State()
	if got.RecordTail != st.RecordTail || got.Chain != st.Chain || got.Bytes != st.Bytes || got.ConfirmWatermark != uint64(len(want)) {
		t.Fatalf("after the crash: tail %d chain %#x bytes %d watermark %d; want %d %#x %d %d",
			got.RecordTail, got.Chain, got.Bytes, got.ConfirmWatermark, st.RecordTail, st.Chain, st.Bytes, len(want))
	}
	if raw := rawMeta(t, s); raw.RecordTail != st.RecordTail {
		t.Fatalf("the folded metadata holds tail %d, want %d", raw.RecordTail, st.RecordTail)
	}
	sameRecords(t, "after the crash", mustRead(t, s, 0, 0), want)
	more := mustAppend(t, s, 1, recs("c", 1))
	if more[0].Offset != st.RecordTail || more[0].Chain != Chain(st.Chain, &more[0]) {
		t.Fatalf("append after the crash = offset %d, want %d", more[0].Offset, st.RecordTail)
	}
}

// A change other than the tails writes the whole metadata, after which an
// older tails entry no longer applies: here a cut below the tail the
// newest tails entry holds, which must not come back after a crash with
// records the cut deleted.
func TestTailsEntriesOlderThanTheMetadataDoNotApply(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	want := mustAppend(t, s, 1, recs("a", 3))
	mustAppend(t, s, 1, recs("b", 3)) // tails entries at tail 6
	if _, err := s.Seal(context.Background(), 2, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.Cut(context.Background(), 3, 0); err != nil {
		t.Fatal(err)
	}
	st := s.State()
	if st.RecordTail != 3 {
		t.Fatalf("tail %d after the cut, want 3", st.RecordTail)
	}
	db = h.crashAndOpen(db)
	defer db.Close()
	s = openStream(t, db, "s")
	got := s.State()
	if got.RecordTail != 3 || got.Chain != st.Chain || got.SealEpoch != 2 {
		t.Fatalf("after the crash: tail %d chain %#x sealed at %d; want 3 %#x 2", got.RecordTail, got.Chain, got.SealEpoch, st.Chain)
	}
	sameRecords(t, "after the crash", mustRead(t, s, 0, 0), want)
}

// A stream dropped and made again under the same name does not take the
// tails its first life left in tails entries.
func TestADroppedStreamsTailsDoNotApplyToItsSuccessor(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("old", 5))
	if err := db.Drop("s"); err != nil {
		t.Fatal(err)
	}
	s = ownerStream(t, db, "s", 1)
	want := mustAppend(t, s, 1, recs("new", 2))
	// Sealed: written whole, so the newest tails entry naming "s" is the
	// first life's.
	if _, err := s.Seal(context.Background(), 2, "test"); err != nil {
		t.Fatal(err)
	}
	db = h.crashAndOpen(db)
	defer db.Close()
	s = openStream(t, db, "s")
	if st := s.State(); st.RecordTail != 2 || st.SealEpoch != 2 {
		t.Fatalf("the new stream after the crash: tail %d sealed at %d, want 2 and 2", st.RecordTail, st.SealEpoch)
	}
	sameRecords(t, "the new stream", mustRead(t, s, 0, 0), want)
}

// A drop has the stream's tails written whole before its marker: a
// checkpoint in between deletes the tails entries without writing a closed
// stream whole, and a crash before the marker would bring the copy back
// with older tails, cutting records it had made durable.
func TestDropWritesTheTailsWholeBeforeItsMarker(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	want := mustAppend(t, s, 1, recs("a", 1))
	want = append(want, mustAppend(t, s, 1, recs("b", 2))...)
	if raw := rawMeta(t, s); raw.RecordTail == 3 {
		t.Fatal("the appends wrote the metadata whole: nothing to test")
	}
	var crashed string
	db.beforeDropMarker = func() {
		if err := db.do(context.Background(), &op{checkpoint: true}); err != nil {
			t.Error(err)
		}
		crashed = h.crashCopy(h.valueLogs())
	}
	if err := db.Drop("s"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = h.open(crashed)
	defer db.Close()
	s = openStream(t, db, "s")
	if st := s.State(); st.RecordTail != 3 {
		t.Fatalf("the copy a crash in its drop left has tail %d, want 3", st.RecordTail)
	}
	sameRecords(t, "the copy a crash in its drop left", mustRead(t, s, 0, 0), want)
}

// Every tailsCheckpointChunks chunks the streams whose state is only in
// tails entries are written whole and the tails entries go; a clean Close
// does the same, so a store closed cleanly holds none (and a broker of an
// earlier version, which knows no tails entries, reads it whole).
func TestTailsCheckpoints(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Options{Dir: dir, tailsCheckpointChunks: 4})
	if err != nil {
		t.Fatal(err)
	}
	a, b := ownerStream(t, db, "a", 1), ownerStream(t, db, "b", 1)
	mustAppend(t, a, 1, recs("a0", 1))
	mustAppend(t, b, 1, recs("b0", 1))
	if n, raw := len(tailsKeys(t, db)), rawMeta(t, b); n != 2 || raw.RecordTail != 0 {
		t.Fatalf("after one append to each: %d tails entries, b's metadata at tail %d; want 2 and 0", n, raw.RecordTail)
	}
	for i := range 6 {
		mustAppend(t, a, 1, recs(fmt.Sprint("a", i+1), 1))
	}
	// The fifth group found four chunks and checkpointed, writing b whole
	// too; each group after it wrote one chunk.
	left := len(tailsKeys(t, db))
	if left >= 4 {
		t.Fatalf("%d tails entries after more than a checkpoint's worth", left)
	}
	if raw := rawMeta(t, b); raw.RecordTail != 1 {
		t.Fatalf("b's metadata holds tail %d after the checkpoint, want 1", raw.RecordTail)
	}
	if raw := rawMeta(t, a); raw.RecordTail != uint64(7-left) {
		t.Fatalf("a's metadata holds tail %d after the checkpoint with %d appends after it, want %d", raw.RecordTail, left, 7-left)
	}
	// The watermark is flushed by Close and, a tails-only change, lands in
	// a tails entry unless the close's checkpoint comes after it.
	a.SetConfirmWatermark(7)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// What the store holds before any open folds it.
	eng, err := engine.Open(engine.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	lt, err := readTails(eng)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if len(lt.keys) != 0 {
		t.Fatalf("a clean close left %d tails entries", len(lt.keys))
	}
	db, err = Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a = openStream(t, db, "a")
	if raw := rawMeta(t, a); raw.RecordTail != 7 || raw.ConfirmWatermark != 7 {
		t.Fatalf("a's metadata holds tail %d watermark %d after a clean close, want 7 and 7", raw.RecordTail, raw.ConfirmWatermark)
	}
}

// Tails chunks decode to what was added, stay below the value threshold,
// and a corrupt chunk is an error, never a panic.
func TestTailsChunks(t *testing.T) {
	var w tailsWriter
	type named struct {
		name string
		t    streamTails
	}
	var want []named
	for i := range 40 {
		n := named{fmt.Sprintf("stream-%03d-%s", i, strings.Repeat("n", i%7*30)), streamTails{uint64(i), math.MaxUint64 - uint64(i), uint64(i) << 40, 1 << 50, uint64(i)}}
		want = append(want, n)
		w.add(n.name, n.t)
	}
	out, keys := w.entries(9, nil, nil)
	if len(out) < 2 || len(keys) != len(out) {
		t.Fatalf("%d chunks, %d keys", len(out), len(keys))
	}
	var got []named
	for i, e := range out {
		if len(e.Value) >= 512 {
			t.Fatalf("chunk %d of %d bytes: at the value threshold", i, len(e.Value))
		}
		if seq, ok := tailsKeySeq(e.Key); !ok || seq != 9 {
			t.Fatalf("chunk %d key %x: group %d %v", i, e.Key, seq, ok)
		}
		if err := decodeTails(e.Value, func(name string, t streamTails) { got = append(got, named{name, t}) }); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
	for _, bad := range [][]byte{nil, {2}, {tailsVersion, 0}, {tailsVersion, 3, 'a'}, {tailsVersion, 1, 'a', 1, 2}} {
		if err := decodeTails(bad, func(string, streamTails) {}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decodeTails(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}
