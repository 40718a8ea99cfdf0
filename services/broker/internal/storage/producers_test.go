package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// openDedupeDB opens a store with small producer table limits.
func openDedupeDB(t testing.TB, dir string, maxProducers, window, every int) *DB {
	t.Helper()
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20,
		MaxProducers: maxProducers, ProducerWindow: window, ProducerCheckpointRecords: every})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return db
}

// seqs returns records of producer id with the given sequences.
func seqs(id string, ss ...uint64) []Record {
	out := make([]Record, len(ss))
	for i, s := range ss {
		out[i] = Record{ProducerID: id, Sequence: s, Payload: []byte(fmt.Sprintf("%s/%d", id, s))}
	}
	return out
}

func cat(batches ...[]Record) []Record { return slices.Concat(batches...) }

// tableBytes is the encoding of the copy's producer table (LRU order
// included), for comparing tables.
func tableBytes(s *Stream) []byte {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	return bytes.Join(s.assigned.producers.encode(1<<30), nil)
}

func mustAppendIdem(t testing.TB, s *Stream, epoch uint64, rs []Record) AppendResult {
	t.Helper()
	res, err := s.AppendIdempotent(context.Background(), epoch, rs)
	if err != nil {
		t.Fatalf("AppendIdempotent: %v", err)
	}
	return res
}

// checkResult compares offsets and duplicate flags.
func checkResult(t testing.TB, what string, res AppendResult, offsets []uint64, dup []bool) {
	t.Helper()
	if !slices.Equal(res.Offsets, offsets) || !slices.Equal(res.Duplicate, dup) {
		t.Fatalf("%s: offsets %v duplicate %v, want %v %v", what, res.Offsets, res.Duplicate, offsets, dup)
	}
	stored := 0
	for _, d := range dup {
		if !d {
			stored++
		}
	}
	if len(res.Stored) != stored {
		t.Fatalf("%s: %d records stored, want %d", what, len(res.Stored), stored)
	}
}

// TestIdempotentAppendTable walks one owner copy (at most 3 producers, a
// window of 4 records) through the (producer, sequence) cases in order;
// each step sees the log the earlier ones left.
func TestIdempotentAppendTable(t *testing.T) {
	db := openDedupeDB(t, t.TempDir(), 3, 4, 0)
	defer db.Close()
	s := ownerStream(t, db, "dedupe", 1)
	const f, d = false, true
	steps := []struct {
		name     string
		recs     []Record
		offsets  []uint64
		dup      []bool
		err      error
		errIndex int
		tail     uint64
	}{
		{name: "in order", recs: seqs("p", 1, 2, 3), offsets: []uint64{0, 1, 2}, dup: []bool{f, f, f}, tail: 3},
		{name: "duplicate returns the original offset", recs: seqs("p", 2), offsets: []uint64{1}, dup: []bool{d}, tail: 3},
		{name: "a batch of duplicates only", recs: seqs("p", 1, 2, 3), offsets: []uint64{0, 1, 2}, dup: []bool{d, d, d}, tail: 3},
		{name: "the next sequence", recs: seqs("p", 4), offsets: []uint64{3}, dup: []bool{f}, tail: 4},
		{name: "gap", recs: seqs("p", 6), err: ErrSequenceGap, errIndex: 0, tail: 4},
		{name: "gap inside the batch", recs: seqs("p", 5, 7), err: ErrSequenceGap, errIndex: 1, tail: 4},
		{name: "repeat inside the batch", recs: seqs("p", 5, 5), err: ErrSequenceOrder, errIndex: 1, tail: 4},
		{name: "duplicate prefix, then new records", recs: seqs("p", 3, 4, 5, 6), offsets: []uint64{2, 3, 4, 5}, dup: []bool{d, d, f, f}, tail: 6},
		{name: "duplicate after a new record", recs: cat(seqs("q", 1), seqs("p", 6)), err: ErrSequenceOrder, errIndex: 1, tail: 6},
		{name: "duplicate after an unsequenced record", recs: cat([]Record{{Payload: []byte("u")}}, seqs("p", 6)), err: ErrSequenceOrder, errIndex: 1, tail: 6},
		{name: "below the window", recs: seqs("p", 2), err: ErrBelowWindow, errIndex: 0, tail: 6},
		{name: "oldest sequence in the window", recs: seqs("p", 3), offsets: []uint64{2}, dup: []bool{d}, tail: 6},
		{name: "records without a producer id or sequence are never deduplicated",
			recs: []Record{{Payload: []byte("x")}, {ProducerID: "p", Payload: []byte("y")}}, offsets: []uint64{6, 7}, dup: []bool{f, f}, tail: 8},
		{name: "... not even the second time",
			recs: []Record{{Payload: []byte("x")}, {ProducerID: "p", Payload: []byte("y")}}, offsets: []uint64{8, 9}, dup: []bool{f, f}, tail: 10},
		{name: "an unknown producer starts at any sequence", recs: seqs("q", 100, 101), offsets: []uint64{10, 11}, dup: []bool{f, f}, tail: 12},
		{name: "mixed producers in a batch", recs: cat(seqs("p", 7), seqs("q", 102), seqs("p", 8)), offsets: []uint64{12, 13, 14}, dup: []bool{f, f, f}, tail: 15},
		{name: "a third producer", recs: seqs("r", 1), offsets: []uint64{15}, dup: []bool{f}, tail: 16},
		{name: "q is still known", recs: seqs("q", 101), offsets: []uint64{11}, dup: []bool{d}, tail: 16},
		// LRU by last append (a duplicate lookup does not count): q (13),
		// p (14), r (15).
		{name: "a fourth producer evicts the least recently appended", recs: seqs("s", 1), offsets: []uint64{16}, dup: []bool{f}, tail: 17},
		{name: "the evicted producer is unknown: its old sequence is stored again", recs: seqs("q", 101), offsets: []uint64{17}, dup: []bool{f}, tail: 18},
		{name: "which evicted p, the least recently appended then", recs: seqs("p", 1), offsets: []uint64{18}, dup: []bool{f}, tail: 19},
		{name: "s was kept", recs: seqs("s", 1), offsets: []uint64{16}, dup: []bool{d}, tail: 19},
	}
	for i, st := range steps {
		res, err := s.AppendIdempotent(context.Background(), 1, st.recs)
		if st.err != nil {
			var se *SequenceError
			if !errors.Is(err, st.err) || !errors.As(err, &se) || se.Index != st.errIndex {
				t.Fatalf("step %d %q: err = %v, want %v at record %d", i, st.name, err, st.err, st.errIndex)
			}
		} else {
			if err != nil {
				t.Fatalf("step %d %q: %v", i, st.name, err)
			}
			checkResult(t, fmt.Sprintf("step %d %q", i, st.name), res, st.offsets, st.dup)
			for j, r := range res.Stored {
				if r.Offset != st.offsets[len(st.offsets)-len(res.Stored)+j] {
					t.Fatalf("step %d %q: stored record %d at %d", i, st.name, j, r.Offset)
				}
			}
		}
		if tail := s.State().RecordTail; tail != st.tail {
			t.Fatalf("step %d %q: record tail %d, want %d", i, st.name, tail, st.tail)
		}
	}
	// The log holds what the table says: every offset answered as a
	// duplicate holds that producer's record.
	got := mustRead(t, s, 0, 0)
	if got[1].ProducerID != "p" || got[1].Sequence != 2 || got[11].ProducerID != "q" || got[11].Sequence != 101 {
		t.Fatalf("records 1 and 11: %+v %+v", got[1], got[11])
	}
}

// Concurrent retries of one batch store it once: the check runs where the
// offsets are assigned.
func TestIdempotentAppendConcurrentRetries(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "race", 1)
	const workers = 16
	batch := seqs("p", 1, 2, 3, 4, 5, 6, 7, 8)
	results := make([]AppendResult, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[w], errs[w] = s.AppendIdempotent(context.Background(), 1, batch)
		}()
	}
	wg.Wait()
	stored := 0
	for w := range workers {
		if errs[w] != nil {
			t.Fatal(errs[w])
		}
		if !slices.Equal(results[w].Offsets, []uint64{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Fatalf("worker %d: offsets %v", w, results[w].Offsets)
		}
		if !results[w].Duplicate[0] {
			stored++
		}
	}
	if stored != 1 || s.State().RecordTail != 8 {
		t.Fatalf("%d workers stored the batch, tail %d; want 1 and 8", stored, s.State().RecordTail)
	}
}

// producerLoad appends n records of a few producers in batches of varying
// size from offset 0 on, starting each producer's sequences at 1.
func producerLoad(t testing.TB, s *Stream, epoch uint64, n int) {
	t.Helper()
	next := map[string]uint64{}
	for i := 0; i < n; {
		id := fmt.Sprint("p", i%5)
		k := min(1+i%4, n-i)
		ss := make([]uint64, k)
		for j := range ss {
			next[id]++
			ss[j] = next[id]
		}
		mustAppendIdem(t, s, epoch, seqs(id, ss...))
		i += k
	}
}

func TestProducerTableSurvivesRestart(t *testing.T) {
	for _, every := range []int{7, 1 << 20} { // with checkpoints, and replaying the whole log
		t.Run(fmt.Sprint("checkpoint every ", every), func(t *testing.T) {
			dir := t.TempDir()
			db := openDedupeDB(t, dir, 100, 6, every)
			s := ownerStream(t, db, "r", 1)
			producerLoad(t, s, 1, 61)
			first := mustAppendIdem(t, s, 1, seqs("z", 1, 2))
			live := tableBytes(s)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openDedupeDB(t, dir, 100, 6, every)
			defer db.Close()
			s = openStream(t, db, "r")
			s.assigned.mu.Lock()
			gens := slices.Clone(s.assigned.m.ProducerTables)
			s.assigned.mu.Unlock()
			if checkpoints := len(gens) > 0; checkpoints != (every == 7) {
				t.Fatalf("checkpoints %+v", gens)
			}
			if !bytes.Equal(tableBytes(s), live) {
				t.Fatal("the table after the restart differs from the one before it")
			}
			res := mustAppendIdem(t, s, 1, seqs("z", 1, 2))
			checkResult(t, "retry after restart", res, first.Offsets, []bool{true, true})
			res = mustAppendIdem(t, s, 1, seqs("z", 3))
			checkResult(t, "next after restart", res, []uint64{63}, []bool{false})
			if _, err := s.AppendIdempotent(context.Background(), 1, seqs("z", 5)); !errors.Is(err, ErrSequenceGap) {
				t.Fatalf("gap after restart: %v", err)
			}
		})
	}
}

// A follower builds the owner's table from AppendReplicated, so once
// promoted it answers a retry with the original offsets.
func TestFollowerBuildsProducerTable(t *testing.T) {
	db := openDedupeDB(t, t.TempDir(), 100, 8, 10)
	defer db.Close()
	ctx := context.Background()
	owner := ownerStream(t, db, "owner", 1)
	producerLoad(t, owner, 1, 40)
	last := mustAppendIdem(t, owner, 1, seqs("p9", 1, 2, 3))
	all := mustRead(t, owner, 0, 0)

	f := ownerStream(t, db, "follower", 1)
	for i := 0; i < len(all); i += 7 {
		if err := f.AppendReplicated(ctx, all[i:min(i+7, len(all))], nil); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(tableBytes(f), tableBytes(owner)) {
		t.Fatal("the follower's producer table differs from the owner's")
	}
	f.assigned.mu.Lock()
	gens := len(f.assigned.m.ProducerTables)
	f.assigned.mu.Unlock()
	if gens == 0 {
		t.Fatal("the follower wrote no checkpoint")
	}
	if _, err := f.Seal(context.Background(), 2, "t"); err != nil {
		t.Fatal(err)
	}
	if err := f.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	res := mustAppendIdem(t, f, 2, seqs("p9", 2, 3, 4))
	checkResult(t, "retry on the promoted follower", res, []uint64{last.Offsets[1], last.Offsets[2], 43}, []bool{true, true, false})
	if got := mustRead(t, f, 43, 0); len(got) != 1 || got[0].Epoch != 2 || got[0].Sequence != 4 {
		t.Fatalf("new record on the promoted follower: %+v", got)
	}
}

// Records cut away leave the table: their sequences are new again, and
// the rebuilt table is the one a copy that never held them would have.
func TestCutRemovesProducerEntries(t *testing.T) {
	for _, c := range []struct {
		name string
		// cut picks the cut point from the checkpoints (two, oldest first).
		cut func(gens []producerGen) uint64
	}{
		{"from the checkpoint below the cut", func(gens []producerGen) uint64 { return gens[0].Boundary + 1 }},
		{"replaying the log when every checkpoint is past the cut", func(gens []producerGen) uint64 { return gens[0].Boundary - 2 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			db := openDedupeDB(t, dir, 100, 6, 9)
			s := ownerStream(t, db, "old", 1)
			producerLoad(t, s, 1, 80)
			if err := s.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			s.assigned.mu.Lock()
			gens := slices.Clone(s.assigned.m.ProducerTables)
			s.assigned.mu.Unlock()
			if len(gens) != 2 || gens[1].Boundary <= gens[0].Boundary+1 || gens[0].Boundary < 3 {
				t.Fatalf("checkpoints %+v, want two apart", gens)
			}
			cut := c.cut(gens)
			ref := ownerStream(t, db, "ref", 1)
			if err := ref.AppendReplicated(context.Background(), mustRead(t, s, 0, int(cut)), nil); err != nil {
				t.Fatal(err)
			}
			cutAway := mustRead(t, s, cut, 1)[0]

			if err := s.Cut(context.Background(), cut, 0); err != nil {
				t.Fatal(err)
			}
			check := func(when string, s *Stream) {
				t.Helper()
				if !bytes.Equal(tableBytes(s), tableBytes(ref)) {
					t.Fatalf("%s: the table after the cut differs from a copy that held only [0, %d)", when, cut)
				}
				s.assigned.mu.Lock()
				gens := slices.Clone(s.assigned.m.ProducerTables)
				s.assigned.mu.Unlock()
				if len(gens) == 0 || gens[len(gens)-1].Boundary != cut {
					t.Fatalf("%s: checkpoints %+v, want the newest at the cut %d", when, gens, cut)
				}
				for _, g := range gens {
					if g.Boundary > cut {
						t.Fatalf("%s: checkpoint %+v past the cut", when, g)
					}
				}
			}
			check("live", s)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openDedupeDB(t, dir, 100, 6, 9)
			defer db.Close()
			s = openStream(t, db, "old")
			ref = openStream(t, db, "ref")
			check("after restart", s)
			if err := s.AdvanceEpoch(context.Background(), 2); err != nil {
				t.Fatal(err)
			}
			// The first cut-away record is new again, at the cut.
			res := mustAppendIdem(t, s, 2, seqs(cutAway.ProducerID, cutAway.Sequence))
			checkResult(t, "cut-away sequence", res, []uint64{cut}, []bool{false})
		})
	}
}

// A crash between a checkpoint's chunks and the meta that names it leaves
// chunks nobody names; Open deletes them. Retired checkpoints are deleted
// with later ones, so the chunks stored stay bounded.
func TestProducerCheckpointChunksAreCollected(t *testing.T) {
	dir := t.TempDir()
	db := openDedupeDB(t, dir, 100, 4, 3)
	s := ownerStream(t, db, "gc", 1)
	producerLoad(t, s, 1, 200)
	gensStored := func(s *Stream) map[uint64]bool {
		out := map[uint64]bool{}
		if err := s.scanKeys(s.prodPrefix, func(k []byte) { out[keyGen(s, k)] = true }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(gensStored(s)); n > 4 {
		t.Fatalf("%d checkpoints stored after 200 records, want at most 4", n)
	}
	orphan := &op{}
	orphan.add(s.producerChunkKey(1<<40, 0), []byte("torn"))
	if err := db.do(context.Background(), orphan); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDedupeDB(t, dir, 100, 4, 3)
	defer db.Close()
	s = openStream(t, db, "gc")
	s.assigned.mu.Lock()
	named := map[uint64]bool{}
	for _, g := range s.assigned.m.ProducerTables {
		named[g.Gen] = true
	}
	s.assigned.mu.Unlock()
	if got := gensStored(s); len(got) != len(named) || len(named) == 0 {
		t.Fatalf("after open: checkpoints stored %v, named %v", got, named)
	}
}

func keyGen(s *Stream, k []byte) uint64 {
	var g uint64
	for _, b := range k[len(s.prodPrefix) : len(s.prodPrefix)+8] {
		g = g<<8 | uint64(b)
	}
	return g
}

// Retention never leaves the newest checkpoint below the head, so a
// reopened copy still answers retries of records retention removed.
func TestRetentionKeepsProducerTable(t *testing.T) {
	dir := t.TempDir()
	db := openDedupeDB(t, dir, 100, 32, 1<<20)
	s := ownerStream(t, db, "ret", 1)
	for i := uint64(1); i <= 20; i += 4 {
		mustAppendIdem(t, s, 1, seqs("p", i, i+1, i+2, i+3))
	}
	s.SetConfirmWatermark(20)
	if h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 5}, time.Now()); err != nil || h != 15 {
		t.Fatalf("retention: head %d, %v", h, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDedupeDB(t, dir, 100, 32, 1<<20)
	defer db.Close()
	s = openStream(t, db, "ret")
	if st := s.State(); st.Head != 15 {
		t.Fatalf("head %d after restart", st.Head)
	}
	res := mustAppendIdem(t, s, 1, seqs("p", 10, 11))
	checkResult(t, "retry of records below the head", res, []uint64{9, 10}, []bool{true, true})
	res = mustAppendIdem(t, s, 1, seqs("p", 21))
	checkResult(t, "next", res, []uint64{20}, []bool{false})
}

// ResetTo starts the table afresh at the new head: the producers it knew
// may have moved on in the records the copy skipped.
func TestResetToClearsProducerTable(t *testing.T) {
	dir := t.TempDir()
	db := openDedupeDB(t, dir, 100, 8, 0)
	s := ownerStream(t, db, "reset", 1)
	mustAppendIdem(t, s, 1, seqs("p", 1, 2, 3))
	if err := s.ResetTo(context.Background(), 50, 1234); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDedupeDB(t, dir, 100, 8, 0)
	defer db.Close()
	s = openStream(t, db, "reset")
	if len(tableBytes(s)) != 2 { // version and a count of 0
		t.Fatalf("table after reset: %x", tableBytes(s))
	}
	res := mustAppendIdem(t, s, 1, seqs("p", 40))
	checkResult(t, "after reset", res, []uint64{50}, []bool{false})
}

func TestSequenceErrorDetail(t *testing.T) {
	for _, c := range []struct {
		err  *SequenceError
		want string
	}{
		{&SequenceError{Err: ErrSequenceGap, Index: 2, ProducerID: "p", Sequence: 9, Expected: 5},
			`storage: sequence gap: record 2: sequence 9 of producer "p" skips ahead; the next sequence is 5`},
		{&SequenceError{Err: ErrBelowWindow, Index: 0, ProducerID: "p", Sequence: 1, First: 7},
			`storage: sequence below the dedupe window: record 0: sequence 1 of producer "p" is older than the dedupe window, which starts at 7`},
	} {
		if got := c.err.Error(); got != c.want {
			t.Fatalf("%q, want %q", got, c.want)
		}
	}
}

func FuzzProducerChunk(f *testing.F) {
	tbl := newProducerTable(10, 4, 3)
	for i := range uint64(12) {
		tbl.apply(fmt.Sprint("p", i%3), i/3+1, 2*i)
	}
	f.Add(tbl.encode(1 << 20)[0])
	f.Add([]byte{producerTableVersion, 1, 1, 'p', 5, 2, 1, 3, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		got := newProducerTable(10, 4, 3)
		if err := got.decodeChunk(b); err != nil {
			return
		}
		// What decodes is a valid table: it re-encodes to a value that
		// decodes to the same table, and every window lookup agrees.
		again := newProducerTable(10, 4, 3)
		enc := bytes.Join(got.encode(1<<30), nil)
		if err := again.decodeChunk(enc); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytes.Join(again.encode(1<<30), nil), enc) {
			t.Fatal("re-encoding changed the table")
		}
		for p := got.oldest; p != nil; p = p.newer {
			for seq := p.first(); seq <= p.last; seq++ {
				if _, ok := p.offset(seq); !ok {
					t.Fatalf("producer %q: sequence %d in the window has no offset", p.id, seq)
				}
			}
		}
	})
}

// The table against a plain model (a list of offsets per producer and an
// LRU list) under random appends: batches, interleaving, restarted
// sequences and evictions, with a window small enough to wrap its ring and
// a run limit that sometimes ends the window before the record limit.
func TestProducerTableMatchesModel(t *testing.T) {
	type modelProducer struct {
		id   string
		last uint64
		offs []uint64 // offsets of sequences last-len+1 .. last
	}
	const maxProducers, window, batches = 4, 5, 3
	tbl := newProducerTable(maxProducers, window, batches)
	var lru []*modelProducer // oldest first
	find := func(id string) int {
		return slices.IndexFunc(lru, func(m *modelProducer) bool { return m.id == id })
	}
	rng := uint64(42)
	rand := func(n int) int { // xorshift: deterministic, no seed to manage
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return int(rng % uint64(n))
	}
	off := uint64(0)
	for step := range 5000 {
		id := fmt.Sprint("p", rand(7))
		i := find(id)
		seq := uint64(1 + rand(3))
		if i >= 0 && rand(10) > 0 {
			seq = lru[i].last + 1
		}
		n := 1 + rand(4)
		for range n {
			tbl.apply(id, seq, off)
			i := find(id)
			var m *modelProducer
			if i >= 0 {
				m = lru[i]
				lru = slices.Delete(lru, i, i+1)
				if seq != m.last+1 {
					m.offs = nil
				}
			} else {
				if len(lru) == maxProducers {
					lru = lru[1:]
				}
				m = &modelProducer{id: id}
			}
			m.last = seq
			m.offs = append(m.offs, off)
			if len(m.offs) > window {
				m.offs = m.offs[len(m.offs)-window:]
			}
			// At most batches runs of consecutive offsets: drop the
			// oldest run while there are more.
			for {
				runs := 1
				for k := 1; k < len(m.offs); k++ {
					if m.offs[k] != m.offs[k-1]+1 {
						runs++
					}
				}
				if runs <= batches {
					break
				}
				k := 1
				for m.offs[k] == m.offs[k-1]+1 {
					k++
				}
				m.offs = m.offs[k:]
			}
			lru = append(lru, m)
			seq++
			off += 1 + uint64(rand(2)) // sometimes another producer's record in between
		}
		if len(tbl.byID) != len(lru) {
			t.Fatalf("step %d: %d producers, model %d", step, len(tbl.byID), len(lru))
		}
		runs, q := 0, tbl.oldest
		for _, m := range lru {
			if q == nil || q.id != m.id {
				t.Fatalf("step %d: LRU order differs at %q", step, m.id)
			}
			runs += q.n
			if q.last != m.last || q.count != uint64(len(m.offs)) {
				t.Fatalf("step %d: %q last %d count %d, model %d %d", step, m.id, q.last, q.count, m.last, len(m.offs))
			}
			first := m.last - uint64(len(m.offs)) + 1
			for k, want := range m.offs {
				if got, ok := q.offset(first + uint64(k)); !ok || got != want {
					t.Fatalf("step %d: %q sequence %d at %d (%v), model %d", step, m.id, first+uint64(k), got, ok, want)
				}
			}
			if _, ok := q.offset(first - 1); ok && first > 1 {
				t.Fatalf("step %d: %q sequence %d below the window found", step, m.id, first-1)
			}
			if q.n > batches || len(q.runs) > batches {
				t.Fatalf("step %d: %q holds %d runs in a ring of %d", step, m.id, q.n, len(q.runs))
			}
			q = q.newer
		}
		if runs != tbl.runs {
			t.Fatalf("step %d: %d runs counted, table says %d", step, runs, tbl.runs)
		}
	}
}

// A retry of a batch far larger than 256 records, whose answer was lost, is
// answered as duplicates at the defaults, even after the producer published
// more batches: the window is counted in batches (runs), as long as it
// holds at most DefaultProducerWindow records. Once the producer has
// published DefaultProducerBatches separate batches after it, the retry is
// below the window and refused, never stored again.
func TestRetryOfALargeBatchIsAnsweredAsDuplicates(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	const big = 5000
	batch := make([]Record, big)
	for i := range batch {
		batch[i] = seqs("p", uint64(i+1))[0]
	}
	first := mustAppendIdem(t, s, 1, batch)
	// More batches of p, each apart from the one before (another
	// producer's record in between), so each is a run of its own.
	next := uint64(big + 1)
	more := func(n int) {
		for range n {
			mustAppendIdem(t, s, 1, seqs("q", next))
			mustAppendIdem(t, s, 1, seqs("p", next))
			next++
		}
	}
	more(DefaultProducerBatches - 1)
	retry := mustAppendIdem(t, s, 1, batch)
	for i := range batch {
		if !retry.Duplicate[i] || retry.Offsets[i] != first.Offsets[i] {
			t.Fatalf("record %d of the retried batch: offset %d duplicate %v, want the original %d", i, retry.Offsets[i], retry.Duplicate[i], first.Offsets[i])
		}
	}
	if len(retry.Stored) != 0 {
		t.Fatalf("the retry stored %d records", len(retry.Stored))
	}
	more(1)
	tail := s.State().RecordTail
	if _, err := s.AppendIdempotent(context.Background(), 1, batch); !errors.Is(err, ErrBelowWindow) {
		t.Fatalf("retry after %d later batches: %v, want ErrBelowWindow", DefaultProducerBatches, err)
	}
	if got := s.State().RecordTail; got != tail {
		t.Fatalf("a refused retry moved the record tail from %d to %d", tail, got)
	}
}

// A producer table checkpoint that cannot be read (a machine crash tore
// it, torn.go) is passed over: the table comes back from the checkpoint
// before it and the records after that, whole, instead of the stream
// failing to load.
func TestUnreadableProducerCheckpointFallsBackToAnEarlierOne(t *testing.T) {
	dir := t.TempDir()
	db := openDedupeDB(t, dir, 100, 6, 7)
	s := ownerStream(t, db, "r", 1)
	producerLoad(t, s, 1, 61)
	first := mustAppendIdem(t, s, 1, seqs("z", 1, 2))
	live := tableBytes(s)
	s.assigned.mu.Lock()
	gens := slices.Clone(s.assigned.m.ProducerTables)
	s.assigned.mu.Unlock()
	if len(gens) < 2 {
		t.Fatalf("checkpoints %+v: the test needs two", gens)
	}
	newest := gens[len(gens)-1]
	gone := &op{}
	gone.del(s.producerChunkKey(newest.Gen, 0))
	if err := db.do(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDedupeDB(t, dir, 100, 6, 7)
	defer db.Close()
	s = openStream(t, db, "r")
	if !bytes.Equal(tableBytes(s), live) {
		t.Fatal("the table rebuilt past the unreadable checkpoint differs from the one before the restart")
	}
	res := mustAppendIdem(t, s, 1, seqs("z", 1, 2))
	checkResult(t, "retry after restart", res, first.Offsets, []bool{true, true})
}
