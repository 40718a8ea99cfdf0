package storage

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
)

// failover builds, in db, the old owner "old" of epoch 1 holding 10 records
// and 3 cursor events, and "new": a follower that replicated records 0..5 and
// events 0..1, was sealed at 2, promoted at 2 at its own tails (6, 2) and
// appended 4 records and 2 cursor events of its own. The history start of
// epoch 2 is therefore (6, 2). With snap, old snapshots its cursors after
// its last event.
func failover(t *testing.T, db *DB, snap bool) (old, nw *Stream) {
	t.Helper()
	ctx := context.Background()
	old = ownerStream(t, db, "old", 1)
	a := mustAppend(t, old, 1, recs("a", 10))
	for _, c := range []struct {
		name string
		pos  uint64
	}{{"r", 2}, {"q", 8}, {"r", 9}} {
		if _, err := old.CommitCursor(ctx, 1, c.name, c.pos); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := old.ReadCursorEvents(0, 0)
	if err != nil || len(evs) != 3 {
		t.Fatalf("old events %+v, %v", evs, err)
	}
	if snap {
		// The snapshot compacts the events below it away.
		if err := old.Snapshot(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	nw = ownerStream(t, db, "new", 1)
	if err := nw.AppendReplicated(ctx, a[:6], evs[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := nw.Seal(context.Background(), 2, "tr"); err != nil {
		t.Fatal(err)
	}
	if err := nw.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, nw, 2, recs("b", 4))
	if _, err := nw.CommitCursor(ctx, 2, "q", 9); err != nil {
		t.Fatal(err)
	}
	if _, err := nw.CommitCursor(ctx, 2, "s", 7); err != nil {
		t.Fatal(err)
	}
	if err := nw.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	return old, nw
}

// catchUp makes old follow nw at epoch 2 from old's own tails.
func catchUp(t *testing.T, old, nw *Stream) {
	t.Helper()
	ctx := context.Background()
	if err := old.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	st := old.State()
	rs := mustRead(t, nw, st.RecordTail, 0)
	evs, err := nw.ReadCursorEvents(st.CursorEventTail, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.AppendReplicated(ctx, rs, evs); err != nil {
		t.Fatalf("old takes the new owner's entries: %v", err)
	}
}

func sameLogs(t *testing.T, a, b *Stream) {
	t.Helper()
	sa, sb := a.State(), b.State()
	if sa.RecordTail != sb.RecordTail || sa.Chain != sb.Chain || sa.CursorEventTail != sb.CursorEventTail || sa.Bytes != sb.Bytes || sa.Head != sb.Head {
		t.Fatalf("states differ:\n%s %+v\n%s %+v", a.Name(), sa, b.Name(), sb)
	}
	ra, rb := mustRead(t, a, sa.Head, 0), mustRead(t, b, sb.Head, 0)
	if len(ra) != len(rb) {
		t.Fatalf("%d records != %d", len(ra), len(rb))
	}
	for i := range ra {
		if err := sameRecord(ra[i], rb[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Each copy compacts its cursor events on its own: the events both
	// still hold are the same, and so is the cursor state.
	from := max(a.CursorEventHead(), b.CursorEventHead())
	ea, erra := a.ReadCursorEvents(from, 0)
	eb, errb := b.ReadCursorEvents(from, 0)
	if erra != nil || errb != nil || !slices.Equal(ea, eb) {
		t.Fatalf("cursor events from %d differ:\n%+v %v\n%+v %v", from, ea, erra, eb, errb)
	}
}

// sameCursors checks that a and b read every cursor at the same position.
func sameCursors(t *testing.T, a, b *Stream) {
	t.Helper()
	if ca, cb := cursorState(a), cursorState(b); !maps.Equal(ca, cb) {
		t.Fatalf("cursor state differs:\n%s %v\n%s %v", a.Name(), ca, b.Name(), cb)
	}
}

func TestCutLongerSuffixTakesNewOwnersEntries(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	old, nw := failover(t, db, false)
	if err := old.Cut(context.Background(), 6, 2); err != nil {
		t.Fatal(err)
	}
	st := old.State()
	if st.RecordTail != 6 || st.CursorEventTail != 2 || !slices.Equal(st.LogEpochs, []LogEpoch{{Epoch: 1}}) {
		t.Fatalf("after cut %+v", st)
	}
	if c, _ := nw.ChainAt(6); st.Chain != c {
		t.Fatalf("chain after cut %#x, new owner's chain at 6 %#x", st.Chain, c)
	}
	// q was at 8 from an event below the cut: clamped to the cut. A reader
	// resuming there receives records 6 and 7 again, never skips one.
	if p, _ := old.Cursor("q"); p != 6 {
		t.Fatalf("cursor q = %d, want clamped to 6", p)
	}
	if p, _ := old.Cursor("r"); p != 2 {
		t.Fatalf("cursor r = %d, want 2 (its event at 9 was cut)", p)
	}
	if err := old.Cut(context.Background(), 6, 2); err != nil {
		t.Fatalf("repeated cut: %v", err)
	}
	if old.State().RecordTail != 6 {
		t.Fatal("repeated cut moved the tail")
	}
	catchUp(t, old, nw)
	sameLogs(t, old, nw)
	for _, c := range []string{"q", "r", "s"} {
		po, _ := old.Cursor(c)
		pn, _ := nw.Cursor(c)
		if po != pn {
			t.Fatalf("cursor %s: %d on the old copy, %d on the new owner", c, po, pn)
		}
	}
}

// A cut below a snapshot's boundary, at or above the events the copy
// retains (the snapshot is not compacted yet), lowers the boundary.
func TestCutLowersSnapshotBoundaryAndReplays(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	db.holdCompaction.Store(true)
	old, nw := failover(t, db, true)
	if snap, _ := old.readSnapshot(); snap.Boundary != 3 {
		t.Fatalf("snapshot boundary before the cut = %d", snap.Boundary)
	}
	if err := old.Cut(context.Background(), 6, 2); err != nil {
		t.Fatal(err)
	}
	snap, err := old.readSnapshot()
	if err != nil || snap.Boundary != 2 {
		t.Fatalf("snapshot after the cut = %+v, %v; want boundary 2", snap, err)
	}
	// The snapshot keeps its state (r at 9 from the cut event), clamped.
	if !maps.Equal(snap.Cursors, map[string]uint64{"r": 6, "q": 6}) {
		t.Fatalf("snapshot cursors = %v", snap.Cursors)
	}
	catchUp(t, old, nw)
	sameLogs(t, old, nw)
	// The new owner's events at 2 and 3 replayed over the snapshot.
	want := map[string]uint64{"r": 6, "q": 9, "s": 7}
	check := func(when string) {
		for c, p := range want {
			if got, ok := old.Cursor(c); !ok || got != p {
				t.Fatalf("%s: cursor %s = %d, %v; want %d", when, c, got, ok, p)
			}
		}
	}
	check("live")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	old = openStream(t, db, "old")
	check("after restart")
}

// errCrash stops a cut between the two log cuts.
var errCrash = errors.New("crash between the log cuts")

func TestCutCrashBetweenLogCutsIsIdempotent(t *testing.T) {
	ref := openDB(t, t.TempDir())
	defer ref.Close()
	ref.holdCompaction.Store(true)
	refOld, _ := failover(t, ref, true)
	if err := refOld.Cut(context.Background(), 6, 2); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	db := openDB(t, dir)
	db.holdCompaction.Store(true)
	old, _ := failover(t, db, true)
	db.afterRecordCut = func() error { return errCrash }
	if err := old.Cut(context.Background(), 6, 2); !errors.Is(err, errCrash) {
		t.Fatalf("interrupted cut: %v", err)
	}
	if _, err := old.Append(context.Background(), 1, recs("z", 1)); !errors.Is(err, ErrFenced) {
		t.Fatalf("append during a pending cut: %v", err)
	}
	var events int
	if err := old.scanKeys(old.eventPrefix, func([]byte) { events++ }); err != nil || events != 3 {
		t.Fatalf("%d cursor events stored mid-cut, want all 3 (the event log is cut second)", events)
	}
	if records := old.storedOffsets(t); len(records) != 6 || records[5] != 5 {
		t.Fatalf("records %v stored mid-cut, want 0..5", records)
	}
	// everything written so far is synced: a crash here leaves the same files
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	defer db.Close()
	old = openStream(t, db, "old") // completes the pending cut
	a, b := old.State(), refOld.State()
	if !equalState(a, b) {
		t.Fatalf("resumed cut:\n%+v\nuninterrupted:\n%+v", a, b)
	}
	sameLogs(t, old, refOld)
	sa, _ := old.readSnapshot()
	sb, _ := refOld.readSnapshot()
	if sa.Boundary != sb.Boundary || !maps.Equal(sa.Cursors, sb.Cursors) {
		t.Fatalf("snapshots differ: %+v vs %+v", sa, sb)
	}
	for _, c := range []string{"q", "r"} {
		pa, _ := old.Cursor(c)
		pb, _ := refOld.Cursor(c)
		if pa != pb {
			t.Fatalf("cursor %s: %d vs %d", c, pa, pb)
		}
	}
	if err := old.Cut(context.Background(), 6, 2); err != nil || !equalState(old.State(), b) {
		t.Fatalf("cut again: %v, %+v", err, old.State())
	}
}

func equalState(a, b State) bool {
	return a.Epoch == b.Epoch && slices.Equal(a.LogEpochs, b.LogEpochs) && a.SealEpoch == b.SealEpoch &&
		a.SealTransition == b.SealTransition && slices.Equal(a.SealedLogEpochs, b.SealedLogEpochs) &&
		a.Head == b.Head && a.RecordTail == b.RecordTail && a.CursorEventTail == b.CursorEventTail &&
		a.Chain == b.Chain && a.Bytes == b.Bytes && a.ConfirmWatermark == b.ConfirmWatermark
}

func TestCutNeverBelowHead(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "h", 1)
	out := mustAppend(t, s, 1, recs("a", 10))
	s.SetConfirmWatermark(10)
	if _, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 5}, out[0].PublishTime); err != nil {
		t.Fatal(err)
	}
	if err := s.Cut(context.Background(), 2, 0); err != nil {
		t.Fatal(err)
	}
	st := s.State()
	if st.Head != 5 || st.RecordTail != 5 || st.Chain != out[4].Chain || st.ConfirmWatermark != 5 || st.Bytes != 0 {
		t.Fatalf("cut below head: %+v", st)
	}
	// A cut at or past the tails changes nothing.
	if err := s.Cut(context.Background(), 50, 50); err != nil || !equalState(s.State(), st) {
		t.Fatalf("cut past the tails: %v, %+v", err, s.State())
	}
	mustAppend(t, s, 1, recs("b", 1))
	if got := mustRead(t, s, 5, 0); len(got) != 1 || got[0].Chain != Chain(out[4].Chain, &got[0]) {
		t.Fatalf("append after the cut = %+v", got)
	}
}

func TestCutLogEpochs(t *testing.T) {
	le := func(e, r, c uint64) LogEpoch { return LogEpoch{Epoch: e, RecordStart: r, CursorEventStart: c} }
	cases := []struct {
		in     []LogEpoch
		rt, et uint64
		want   []LogEpoch
	}{
		{nil, 5, 5, nil},
		{[]LogEpoch{le(1, 0, 0), le(3, 8, 3)}, 6, 2, []LogEpoch{le(1, 0, 0)}},
		{[]LogEpoch{le(1, 0, 0), le(3, 6, 2)}, 6, 2, []LogEpoch{le(1, 0, 0), le(3, 6, 2)}},
		{[]LogEpoch{le(1, 0, 0), le(3, 8, 1)}, 6, 2, []LogEpoch{le(1, 0, 0), le(3, 6, 1)}},
		{[]LogEpoch{le(1, 0, 0), le(3, 4, 5)}, 6, 2, []LogEpoch{le(1, 0, 0), le(3, 4, 2)}},
	}
	for i, c := range cases {
		if got := cutLogEpochs(c.in, c.rt, c.et); !slices.Equal(got, c.want) {
			t.Fatalf("case %d: %v", i, got)
		}
	}
}
