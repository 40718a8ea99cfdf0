package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
	"github.com/strandhq/strand/services/broker/internal/storage/engine/enginetest"
)

// crashHarness plays a machine crash in the middle of a batch: the store
// lives in dir, and crashed copies of it are made as package enginetest
// says. The boot id file lets the test reboot.
type crashHarness struct {
	t    *testing.T
	dir  string
	boot string
	// hooks are the engine's for every open of the harness.
	hooks *engine.Hooks
}

func newCrashHarness(t *testing.T) *crashHarness {
	h := &crashHarness{t: t, dir: t.TempDir(), boot: filepath.Join(t.TempDir(), "boot_id"), hooks: &engine.Hooks{}}
	h.reboot("boot-1")
	return h
}

func (h *crashHarness) reboot(id string) {
	h.t.Helper()
	if err := os.WriteFile(h.boot, []byte(id+"\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *crashHarness) open(dir string) *DB {
	h.t.Helper()
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20, BootIDPath: h.boot, hooks: h.hooks})
	if err != nil {
		h.t.Fatalf("Open(%s): %v", dir, err)
	}
	return db
}

// crashDuringAppend appends a batch to s at epoch and plays a machine
// crash between its commit and its fsync, after the kernel wrote back
// everything but the value log (crashCopy): it closes db, reboots and
// returns the crashed copy's dir.
func (h *crashHarness) crashDuringAppend(db *DB, s *Stream, epoch uint64) string {
	h.t.Helper()
	return h.crashDuring(db, func() error {
		_, err := s.Append(context.Background(), epoch, sizedRecs("torn", 8, 2048))
		return err
	})
}

// crashDuring is crashDuringAppend for any write: write runs while the
// crash is played between its commit and its fsync.
func (h *crashHarness) crashDuring(db *DB, write func() error) string {
	h.t.Helper()
	onDisk := h.valueLogs()
	inSync, release := holdNextSync(db)
	done := make(chan error, 1)
	go func() { done <- write() }()
	<-inSync
	crashed := h.crashCopy(onDisk)
	close(release)
	if err := <-done; err != nil {
		h.t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		h.t.Fatal(err)
	}
	h.reboot("boot-2")
	return crashed
}

// valueLogs reads the value log files of h.dir.
func (h *crashHarness) valueLogs() map[string][]byte { return enginetest.ValueLogs(h.t, h.dir) }

// crashCopy copies h.dir as the page cache holds it now, with the value
// log files as vlogs held them (enginetest.CrashCopy).
func (h *crashHarness) crashCopy(vlogs map[string][]byte) string {
	return enginetest.CrashCopy(h.t, h.dir, vlogs)
}

// A machine crash between a batch's commit and its fsync, after the kernel
// wrote the write-ahead log back but not the value log: the stream's
// metadata claims the batch, whose values never reached the disk. The copy
// must come back claiming only what it holds (the torn batch rolled back),
// every record readable, able to append at its tail, and unsure of its
// epoch (also after a restart on the same boot). Without the roll back the
// store did not open: the producer table replay hit the torn segment.
func TestTornBatchIsRolledBackAfterAMachineCrash(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	synced := mustAppend(t, s, 1, sizedRecs("synced", 8, 2048))
	// Another stream that the torn batch does not touch stays whole.
	other := ownerStream(t, db, "other", 3)
	otherRecs := mustAppend(t, other, 3, sizedRecs("other", 4, 2048))
	crashed := h.crashDuringAppend(db, s, 1)
	db = h.open(crashed)
	check := func(db *DB) {
		t.Helper()
		if !db.MayHaveLostWritten() {
			t.Fatal("a store opened after a machine crash claims nothing can be missing")
		}
		if db.eng.Recovery().Pending {
			t.Fatal("the recovery's read transaction outlived the open: compaction and the value log GC would keep every version")
		}
		s := openStream(t, db, "s")
		st := s.State()
		if st.RecordTail != uint64(len(synced)) {
			t.Fatalf("record tail %d after the crash, want %d: the copy claims records it cannot read", st.RecordTail, len(synced))
		}
		if st.UnsureEpoch != 1 {
			t.Fatalf("unsure epoch %d, want 1", st.UnsureEpoch)
		}
		got := mustRead(t, s, 0, 0)
		if len(got) != len(synced) {
			t.Fatalf("read %d records, want %d", len(got), len(synced))
		}
		for i := range got {
			if got[i].Chain != synced[i].Chain || !bytes.Equal(got[i].Payload, synced[i].Payload) {
				t.Fatalf("record %d differs after the crash", i)
			}
		}
		if st.Chain != synced[len(synced)-1].Chain {
			t.Fatalf("chain at the tail %#x, want %#x", st.Chain, synced[len(synced)-1].Chain)
		}
		o := openStream(t, db, "other")
		if got := mustRead(t, o, 0, 0); len(got) != len(otherRecs) || o.State().UnsureEpoch != 3 {
			t.Fatalf("untouched stream: %d records (want %d), unsure epoch %d (want 3)", len(got), len(otherRecs), o.State().UnsureEpoch)
		}
	}
	check(db)
	// The process dies again on the same boot: the copies still know.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(crashed, cleanFile)); err != nil {
		t.Fatal(err)
	}
	db = h.open(crashed)
	defer db.Close()
	s = openStream(t, db, "s")
	if st := s.State(); st.UnsureEpoch != 1 || st.RecordTail != uint64(len(synced)) {
		t.Fatalf("after a restart on the same boot: unsure epoch %d (want 1), tail %d (want %d)", st.UnsureEpoch, st.RecordTail, len(synced))
	}
	after := mustAppend(t, s, 1, sizedRecs("after", 2, 2048))
	if after[0].Offset != uint64(len(synced)) || after[0].Chain != Chain(synced[len(synced)-1].Chain, &after[0]) {
		t.Fatalf("append after the cut at offset %d, want %d, chain continued: %v", after[0].Offset, len(synced), after[0].Chain == Chain(synced[len(synced)-1].Chain, &after[0]))
	}
	// A new epoch's history starts at the copy's tails: no longer unsure.
	if err := s.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if st := s.State(); st.UnsureEpoch != 0 {
		t.Fatalf("unsure epoch %d after advancing to epoch 2", st.UnsureEpoch)
	}
}

// gcCrash builds a store whose value log GC has a file to rewrite with
// live values in it: stream "s" fills the value log files and retention
// then drops nearly all of it, while stream "k", appended between, is kept
// whole. It runs the GC and returns a copy of the store as a power loss
// right after Badger's rewrite, before its sync, can leave it: the moved
// values' new pointers written back, the values not. It returns the
// copy's dir and k's records.
func gcCrash(t *testing.T, h *crashHarness) (string, []Record) {
	t.Helper()
	db := h.open(h.dir)
	_, _, want := liveGarbage(t, db)
	crashed := enginetest.CrashDuringGC(t, h.dir, &db.hooks.AfterGCRewrite, db.eng.RunValueLogGC)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return crashed, want
}

// When the file the GC moved values from is gone too, nothing can repair
// them: the copy is cut below the lowest record it cannot read, and claims
// only what it holds.
func TestValueLogGCInterruptedWithoutTheOldFileCutsTheCopy(t *testing.T) {
	h := newCrashHarness(t)
	crashed, want := gcCrash(t, h)
	// Every value log file but the newest goes: the old one among them.
	files := enginetest.VlogFiles(t, crashed)
	for _, f := range files[:len(files)-1] {
		if err := os.Remove(filepath.Join(crashed, f)); err != nil {
			t.Fatal(err)
		}
	}
	h.reboot("boot-2")
	db := h.open(crashed)
	defer db.Close()
	k := openStream(t, db, "k")
	st := k.State()
	if st.RecordTail >= uint64(len(want)) {
		t.Fatalf("record tail %d: the copy still claims records whose values are gone", st.RecordTail)
	}
	got, err := k.Read(0, 0, 0)
	if err != nil && st.RecordTail > 0 {
		t.Fatalf("reading what the copy claims: %v", err)
	}
	// What the copy claims is a prefix of what was written (the tail
	// check above keeps it shorter).
	sameRecords(t, "what the copy claims", got, want[:len(got)])
}

// The newest transaction's metadata may be torn as its segments are: a
// meta with a few log epochs is above the value threshold, so in the value
// log. Appends at the copy's epoch write only tails (tails.go), so the torn
// write here is a seal, which writes the metadata whole. The copy comes
// back with the metadata the last synced write left (tails, chain, log
// epochs, unsealed), every record readable; without the roll back the
// store did not open.
func TestTornMetadataIsRolledBackAfterAMachineCrash(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s, synced := bigMetaStream(t, db)
	before := s.State()
	crashed := h.crashDuring(db, func() error {
		_, err := s.Seal(context.Background(), 13, "test")
		return err
	})
	db = h.open(crashed)
	defer db.Close()
	s = openStream(t, db, "s")
	st := s.State()
	if st.RecordTail != before.RecordTail || st.Chain != before.Chain || len(st.LogEpochs) != len(before.LogEpochs) || st.SealEpoch != 0 {
		t.Fatalf("after the crash: tail %d chain %#x %d log epochs sealed at %d, want %d %#x %d unsealed", st.RecordTail, st.Chain, len(st.LogEpochs), st.SealEpoch, before.RecordTail, before.Chain, len(before.LogEpochs))
	}
	sameRecords(t, "after the roll back", mustRead(t, s, 0, 0), synced)
}

// A crash in the middle of the recovery, after the roll back and before
// the copies are marked unsure: the next open on the same boot finishes
// it. It must not take the roll back's own write for the newest
// transaction (a fresh look would, and find nothing torn in it): the
// version it started from is kept in STRAND_UNSURE.
func TestRecoveryInterruptedIsFinishedByTheNextOpen(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	synced := mustAppend(t, s, 1, sizedRecs("synced", 8, 2048))
	crashed := h.crashDuringAppend(db, s, 1)

	for _, step := range []string{"roll back", "mark"} {
		h.hooks.AfterRecoveryStep = func(at string) error {
			if at == step {
				return fmt.Errorf("injected: crash after %s", at)
			}
			return nil
		}
		_, err := Open(Options{Dir: crashed, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20, BootIDPath: h.boot, hooks: h.hooks})
		h.hooks.AfterRecoveryStep = nil
		if err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("open with a crash after %q: %v", step, err)
		}
		if !storeFileExists(crashed, unsureFile) {
			t.Fatalf("the recovery marker is gone after a crash after %q", step)
		}
	}
	db = h.open(crashed)
	defer db.Close()
	s = openStream(t, db, "s")
	st := s.State()
	if st.RecordTail != uint64(len(synced)) || st.UnsureEpoch != 1 {
		t.Fatalf("after the recovery: tail %d, unsure epoch %d; want %d, 1", st.RecordTail, st.UnsureEpoch, len(synced))
	}
	if got := mustRead(t, s, 0, 0); len(got) != len(synced) {
		t.Fatalf("read %d records, want %d", len(got), len(synced))
	}
	if storeFileExists(crashed, unsureFile) {
		t.Fatal("the recovery marker outlived a finished recovery")
	}
}

// openTearingRecovery opens h.dir, which must need a recovery, and returns
// a copy of it as a power loss in its first write back leaves it
// (enginetest.TearFirstWriteBack). It reboots.
func (h *crashHarness) openTearingRecovery() string {
	h.t.Helper()
	crashed := enginetest.TearFirstWriteBack(h.t, h.dir, &h.hooks.BeforeWriteBackSync, func() io.Closer { return h.open(h.dir) })
	h.reboot("boot-3")
	return crashed
}

// bigMetaStream makes stream "s" with twelve epochs of records, so that
// its metadata (a log epoch each) is above the value threshold, in the value
// log, and returns it with its records.
func bigMetaStream(t *testing.T, db *DB) (*Stream, []Record) {
	t.Helper()
	s := openStream(t, db, "s")
	var recs []Record
	for ep := uint64(1); ep <= 12; ep++ {
		if err := s.AdvanceEpoch(context.Background(), ep); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, mustAppend(t, s, ep, sizedRecs(fmt.Sprint("e", ep), 2, 2048))...)
	}
	s.assigned.mu.Lock()
	metaBytes := len(encodeMeta(&s.assigned.m))
	s.assigned.mu.Unlock()
	if metaBytes <= 512 {
		t.Fatalf("meta of %d bytes stays in the LSM tree; the test needs it in the value log", metaBytes)
	}
	return s, recs
}

// A power loss during the recovery's own write (here, marking the copies
// unsure, whose metas are in the value log): the next opens roll it back
// and do it again, instead of failing for ever on the torn metadata.
func TestRecoveryWriteTornByAPowerLossIsRolledBack(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s, _ := bigMetaStream(t, db)
	before := s.State()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(h.dir, cleanFile)); err != nil {
		t.Fatal(err)
	}
	h.reboot("boot-2")
	crashed := h.openTearingRecovery()
	for i := range 2 {
		db := h.open(crashed)
		st := openStream(t, db, "s").State()
		if st.RecordTail != before.RecordTail || st.Chain != before.Chain || st.UnsureEpoch != 12 {
			t.Fatalf("open %d: tail %d chain %#x unsure epoch %d, want %d %#x 12", i, st.RecordTail, st.Chain, st.UnsureEpoch, before.RecordTail, before.Chain)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The value log GC moves values of the newest transaction, which was
// synced (its append rotated the value log file, so its values sit in a
// file the GC rewrites), and a power loss cuts the rewrite short. The
// recovery must find those values where the GC moved them from and keep
// the append, not take them for a torn write and roll back a synced
// append.
func TestValueLogGCMovingTheNewestTransactionKeepsIt(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s := ownerStream(t, db, "s", 1)
	k := ownerStream(t, db, "k", 1)
	kWant := len(mustAppend(t, k, 1, sizedRecs("k0", 2, 4096)))
	// Fill a value log file with s, then drop s: that file is garbage but
	// for k's records.
	files := len(enginetest.VlogFiles(t, h.dir))
	for i := 0; len(enginetest.VlogFiles(t, h.dir)) == files; i++ {
		if i > 400 {
			t.Fatal("the value log file never rotated")
		}
		mustAppend(t, s, 1, sizedRecs(fmt.Sprint("a", i), 8, 4096))
	}
	for j := range 24 {
		mustAppend(t, s, 1, sizedRecs(fmt.Sprint("b", j), 8, 4096))
	}
	s.SetConfirmWatermark(s.State().RecordTail)
	if _, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 1}, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The watermark written now, so that k's last append below is the
	// newest transaction.
	db.flushWatermarks(true)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	countGarbage(t, db)
	// k's appends until one rotates the file: the newest transaction's
	// values are in the file just closed.
	files = len(enginetest.VlogFiles(t, h.dir))
	for j := 0; len(enginetest.VlogFiles(t, h.dir)) == files; j++ {
		if j > 1000 {
			t.Fatal("the value log file never rotated")
		}
		kWant += len(mustAppend(t, k, 1, sizedRecs(fmt.Sprint("k", j), 1, 4096)))
	}
	var copies []string
	for range 10 {
		onDisk := h.valueLogs()
		var crashed string
		db.hooks.AfterGCRewrite = func() { crashed = h.crashCopy(onDisk) }
		err := db.eng.RunValueLogGC()
		if errors.Is(err, engine.ErrNoRewrite) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		copies = append(copies, crashed)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if len(copies) == 0 {
		t.Fatal("the GC rewrote nothing")
	}
	h.reboot("boot-2")
	for i, c := range copies {
		db := h.open(c)
		st := openStream(t, db, "k").State()
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if st.RecordTail != uint64(kWant) {
			t.Fatalf("crash in GC round %d: k's tail %d, want %d: a synced append was rolled back", i, st.RecordTail, kWant)
		}
	}
}

// A committer batch whose value log bytes reached the disk and whose
// write-ahead log bytes did not, while a value log GC round had written its
// marker: Badger drops the batch and gives its version to the recovery's
// first write (the unsure marks, metas in the value log), which a second
// power loss tears. The next recovery must not take the dropped batch's
// stale value log entry of that key and version for a value the GC moved:
// it would write back metadata claiming records never stored, and the
// stream would never load again.
func TestRecoveryIgnoresStaleValuesOfAReusedVersion(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	s, _ := bigMetaStream(t, db)
	db.flushWatermarks(true)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := s.State()
	crashed := h.crashCopy(h.valueLogs()) // the write-ahead log without the batch
	inSync, release := holdNextSync(db)
	done := make(chan error, 1)
	go func() {
		_, err := s.Append(context.Background(), 12, sizedRecs("dropped", 8, 2048))
		done <- err
	}()
	<-inSync
	withBatch := h.valueLogs() // the value log with it
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for name, b := range withBatch {
		if err := os.WriteFile(filepath.Join(crashed, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(crashed, gcMarkerFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.reboot("boot-2")
	h = &crashHarness{t: t, dir: crashed, boot: h.boot, hooks: h.hooks}
	crashed = h.openTearingRecovery()
	db = h.open(crashed)
	defer db.Close()
	st := openStream(t, db, "s").State()
	if st.RecordTail != before.RecordTail || st.Chain != before.Chain {
		t.Fatalf("record tail %d chain %#x, want %d %#x: the dropped batch's metadata came back", st.RecordTail, st.Chain, before.RecordTail, before.Chain)
	}
}

// A copy sealed when the machine crashed took nothing at its epoch after
// the seal, which returned only once all before it was durable: it is not
// marked unsure, so a recovery that makes it owner at the fence epoch does
// not see it stand down (and need another round). An unsealed copy is.
func TestSealedCopyIsNotMarkedUnsure(t *testing.T) {
	h := newCrashHarness(t)
	db := h.open(h.dir)
	sealed := ownerStream(t, db, "sealed", 1)
	mustAppend(t, sealed, 1, sizedRecs("a", 4, 2048))
	if _, err := sealed.Seal(context.Background(), 2, "t1"); err != nil {
		t.Fatal(err)
	}
	open := ownerStream(t, db, "open", 1)
	mustAppend(t, open, 1, sizedRecs("b", 4, 2048))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(h.dir, cleanFile)); err != nil {
		t.Fatal(err)
	}
	h.reboot("boot-2")
	db = h.open(h.dir)
	defer db.Close()
	if st := openStream(t, db, "sealed").State(); st.UnsureEpoch != 0 || st.SealEpoch != 2 {
		t.Fatalf("sealed copy: unsure epoch %d, seal epoch %d; want 0, 2", st.UnsureEpoch, st.SealEpoch)
	}
	if st := openStream(t, db, "open").State(); st.UnsureEpoch != 1 {
		t.Fatalf("unsealed copy: unsure epoch %d, want 1", st.UnsureEpoch)
	}
}

// The engine's marker files (engine/boot.go, engine/torn.go): a GC
// rewrite not yet durable, a recovery not yet done, a clean stop. Spelled
// out here, so a renamed file, which an upgraded broker would not find,
// fails the tests.
const (
	gcMarkerFile = "STRAND_VLOG_GC"
	unsureFile   = "STRAND_UNSURE"
	cleanFile    = "STRAND_CLEAN"
)

func storeFileExists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// liveGarbage appends to two owned streams of db, "s" and "k", so that
// retention on s leaves every value log file mostly garbage while k keeps a
// few records in each: a GC rewrite has values to move. It returns s, its
// record tail and k's records.
func liveGarbage(t *testing.T, db *DB) (*Stream, uint64, []Record) {
	t.Helper()
	s := ownerStream(t, db, "s", 1)
	k := ownerStream(t, db, "k", 1)
	var want []Record
	for i := range 24 {
		mustAppend(t, s, 1, sizedRecs(fmt.Sprint("a", i), 64, 4096))
		if i%4 == 0 {
			want = append(want, mustAppend(t, k, 1, sizedRecs(fmt.Sprint("k", i), 8, 4096))...)
		}
	}
	tail := s.State().RecordTail
	s.SetConfirmWatermark(tail)
	if _, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 96}, time.Now()); err != nil {
		t.Fatal(err)
	}
	countGarbage(t, db)
	return s, tail, want
}

// countGarbage brings Badger's garbage counts per value log file up to
// date: Badger counts a file's garbage when compaction drops the deleted
// segments, so the memtables are flushed (dropping a prefix that holds a
// key flushes the active one too) and everything is compacted now.
func countGarbage(t *testing.T, db *DB) {
	t.Helper()
	if err := db.eng.FlushAndCompact(); err != nil {
		t.Fatal(err)
	}
}
