package engine

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

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/services/broker/internal/storage/engine/enginetest"
)

// powerLoss plays a machine crash in the middle of a transaction: the
// store lives in dir, and crashed copies of it are made as package
// enginetest says. The boot id file lets the test reboot.
type powerLoss struct {
	t    *testing.T
	dir  string
	boot string
	// hooks are the engine's for every open.
	hooks *Hooks
}

func newPowerLoss(t *testing.T) *powerLoss {
	h := &powerLoss{t: t, dir: t.TempDir(), boot: filepath.Join(t.TempDir(), "boot_id"), hooks: &Hooks{}}
	writeBoot(t, h.boot, "boot-1")
	return h
}

func (h *powerLoss) options(dir string) Options {
	return Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20, BootIDPath: h.boot, Hooks: h.hooks}
}

// open opens dir, not settled: the caller looks at Recovery first.
func (h *powerLoss) open(dir string, recover func(*Recovering) error) *Engine {
	h.t.Helper()
	opts := h.options(dir)
	opts.Recover = recover
	e, err := Open(opts)
	if err != nil {
		h.t.Fatalf("Open(%s): %v", dir, err)
	}
	return e
}

// valueLogs reads the value log files of h.dir.
func (h *powerLoss) valueLogs() map[string][]byte { return enginetest.ValueLogs(h.t, h.dir) }

// crashCopy copies h.dir as the page cache holds it now, with the value
// log files as vlogs held them (enginetest.CrashCopy).
func (h *powerLoss) crashCopy(vlogs map[string][]byte) string {
	return enginetest.CrashCopy(h.t, h.dir, vlogs)
}

// crashDuring hands b to e and plays a machine crash between its commit
// and its fsync, after the kernel wrote back everything but the value
// log: it closes e, reboots and returns the crashed copy's dir.
func (h *powerLoss) crashDuring(e *Engine, b *Batch) string {
	h.t.Helper()
	onDisk := h.valueLogs()
	inSync, release := holdNextSync(e)
	done := make(chan error, 1)
	go func() { done <- e.Do(context.Background(), b) }()
	<-inSync
	crashed := h.crashCopy(onDisk)
	close(release)
	if err := <-done; err != nil {
		h.t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		h.t.Fatal(err)
	}
	writeBoot(h.t, h.boot, "boot-2")
	return crashed
}

// A machine crash tears the newest transaction: its pointers reached the
// disk (the write-ahead log), its values did not (doc.go, "What Open
// guarantees after a power loss"). The open rolls it back to the versions
// below it, the caller's Recover step then sees the store as the last
// fsync left it and its write is kept, Recovery reports what happened
// until Settle, and every earlier synced batch is there whole. A crash of
// the process after Settle, on the same boot, asks for no recovery again.
func TestTornTransactionIsRolledBack(t *testing.T) {
	h := newPowerLoss(t)
	e := h.open(h.dir, nil)
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	big := func(tag string) []byte { return bytes.Repeat([]byte(tag), 2048) }
	for i := range 4 {
		if err := e.Do(ctx, ledgerBatch("t", 0, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if err := e.Do(ctx, ledgerBatch("t", 1, i)); err != nil {
			t.Fatal(err)
		}
	}
	over := &Batch{}
	over.Set([]byte("o"), big("a"))
	if err := e.Do(ctx, over); err != nil {
		t.Fatal(err)
	}
	// The torn batch: the ledger's next batch (new keys, an overwrite of
	// the latest key, a delete) and an overwrite of a value in the value
	// log.
	torn := ledgerBatch("t", 0, 4)
	torn.Set([]byte("o"), big("b"))
	crashed := h.crashDuring(e, torn)

	var recovered []byte
	e = h.open(crashed, func(r *Recovering) error {
		err := r.View(func(txn *Txn) error {
			item, err := txn.Get([]byte("o"))
			if err != nil {
				return err
			}
			recovered, err = item.ValueCopy(nil)
			return err
		})
		if err != nil {
			return err
		}
		return r.Write([]Entry{{Key: []byte("marked"), Value: []byte("yes")}})
	})
	rec := e.Recovery()
	if !rec.MayHaveLostWritten || !rec.Pending || rec.ValuesLost {
		_ = e.Close()
		t.Fatalf("Recovery after a machine crash = %+v, want MayHaveLostWritten and Pending, no values lost", rec)
	}
	if !bytes.Equal(recovered, big("a")) {
		_ = e.Close()
		t.Fatalf("the Recover step read %d bytes of o, want the value before the torn write", len(recovered))
	}
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	if rec := e.Recovery(); rec.Pending || !rec.MayHaveLostWritten {
		t.Fatalf("Recovery after Settle = %+v", rec)
	}
	check := func(e *Engine) {
		t.Helper()
		if n := checkLedger(t, e, "t", 0); n != 3 {
			t.Fatalf("latest batch %d after the crash, want 3: the torn batch was not rolled back", n)
		}
		if n := checkLedger(t, e, "t", 1); n != 1 {
			t.Fatalf("the other writer's latest batch %d, want 1", n)
		}
		checkValues(t, e, "after the roll back", map[string][]byte{"o": big("a"), "marked": []byte("yes")})
	}
	check(e)
	if fileExists(crashed, unsureFile) {
		t.Fatal("the recovery marker outlived Settle")
	}
	// The process dies on the same boot: the recovery is done.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	removeClean(t, crashed)
	e = h.open(crashed, func(*Recovering) error { return errors.New("a second recovery") })
	defer e.Close()
	if rec := e.Recovery(); rec.MayHaveLostWritten {
		t.Fatalf("Recovery after a process crash on the same boot = %+v", rec)
	}
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	check(e)
	if err := e.Do(ctx, ledgerBatch("t", 0, 4)); err != nil {
		t.Fatal(err)
	}
	if n := checkLedger(t, e, "t", 0); n != 4 {
		t.Fatalf("latest batch %d after writing again, want 4", n)
	}
}

// A crash in the middle of a roll back: the next open on the same boot
// rolls back the rest. It must not take the roll back's own first write
// for the newest transaction (a fresh look would, find nothing torn in it
// and leave the rest torn): the version it started from, and that it is
// rolling back, are kept in STRAND_UNSURE (torn.go). The batch holds a
// small value (the write-ahead log) that sorts first and a large one (the
// value log).
func TestRollBackInterruptedIsFinishedByTheNextOpen(t *testing.T) {
	h := newPowerLoss(t)
	e := h.open(h.dir, nil)
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	put := func(tag string) *Batch {
		b := &Batch{}
		b.Set([]byte("x1"), []byte(tag))
		b.Set([]byte("x2"), bytes.Repeat([]byte(tag), 2048))
		return b
	}
	if err := e.Do(context.Background(), put("a")); err != nil {
		t.Fatal(err)
	}
	crashed := h.crashDuring(e, put("b"))

	h.hooks.WriteBackSplit = 1
	_, err := Open(h.options(crashed))
	h.hooks.WriteBackSplit = 0
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("open with a roll back cut short: %v", err)
	}
	e = h.open(crashed, nil)
	defer e.Close()
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	checkValues(t, e, "after the roll back", map[string][]byte{"x1": []byte("a"), "x2": bytes.Repeat([]byte("a"), 2048)})
	if fileExists(crashed, unsureFile) {
		t.Fatal("the recovery marker outlived a finished recovery")
	}
}

// A value log GC marker left by a process that died mid-rewrite on the
// same boot asks for nothing: the page cache kept every write (vlog.go).
// The next open drops it, so a later machine crash does not read every
// value back for it.
func TestValueLogGCMarkerAfterAProcessCrashIsDropped(t *testing.T) {
	h := newPowerLoss(t)
	e := h.open(h.dir, nil)
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	if err := e.Do(context.Background(), ledgerBatch("m", 0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	removeClean(t, h.dir)
	if err := os.WriteFile(filepath.Join(h.dir, gcMarkerFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e = h.open(h.dir, nil)
	defer e.Close()
	if e.Recovery().MayHaveLostWritten {
		t.Fatal("a process crash on the same boot claims written data may be lost")
	}
	if fileExists(h.dir, gcMarkerFile) {
		t.Fatal("the GC marker of a process crash outlived the next open")
	}
	if n := checkLedger(t, e, "m", 0); n != 0 {
		t.Fatalf("latest batch %d, want 0", n)
	}
}

// gcPowerLoss writes live values among garbage in h.dir (liveGarbage),
// runs the value log GC and returns a copy of the store as a power loss
// right after Badger's rewrite, before its sync, can leave it: the moved
// values' new pointers written back, the values not. It returns the
// copy's dir and the live values, and reboots.
func gcPowerLoss(t *testing.T, h *powerLoss) (string, map[string][]byte) {
	t.Helper()
	e := h.open(h.dir, nil)
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	want := liveGarbage(t, e)
	crashed := enginetest.CrashDuringGC(t, h.dir, &h.hooks.AfterGCRewrite, e.RunValueLogGC)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	writeBoot(t, h.boot, "boot-2")
	return crashed, want
}

// A power loss in the middle of a value log GC rewrite: the values it
// moved are read back from the file they were moved from (doc.go, "What
// Open guarantees after a power loss"; torn.go, repairValueLogGC), and no
// value is reported lost.
func TestValueLogGCInterruptedByAPowerLossIsRepaired(t *testing.T) {
	h := newPowerLoss(t)
	crashed, want := gcPowerLoss(t, h)
	e := h.open(crashed, nil)
	defer e.Close()
	if rec := e.Recovery(); !rec.MayHaveLostWritten || rec.ValuesLost {
		t.Fatalf("Recovery = %+v, want MayHaveLostWritten and no values lost", rec)
	}
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	checkValues(t, e, "the values the GC moved", want)
	if fileExists(crashed, gcMarkerFile) || fileExists(crashed, unsureFile) {
		t.Fatal("markers left after the repair")
	}
}

// When the file the GC moved values from is gone too, nothing can repair
// them: Recovery says values were lost (ValuesLost) until Settle, so the
// caller reads back what it relies on, and a value the GC moved reads as
// what was written or as empty, never as other bytes.
func TestValueLogGCInterruptedWithoutTheOldFileReportsValuesLost(t *testing.T) {
	h := newPowerLoss(t)
	crashed, want := gcPowerLoss(t, h)
	// Every value log file but the newest goes: the old one among them.
	files := enginetest.VlogFiles(t, crashed)
	for _, f := range files[:len(files)-1] {
		if err := os.Remove(filepath.Join(crashed, f)); err != nil {
			t.Fatal(err)
		}
	}
	e := h.open(crashed, nil)
	defer e.Close()
	if rec := e.Recovery(); !rec.MayHaveLostWritten || !rec.ValuesLost || !rec.Pending {
		t.Fatalf("Recovery = %+v, want MayHaveLostWritten, ValuesLost and Pending", rec)
	}
	got := readPrefix(t, e, []byte("k"))
	lost := 0
	for k, v := range want {
		switch g, ok := got[k]; {
		case !ok || len(g) == 0:
			lost++
		case !bytes.Equal(g, v):
			t.Fatalf("%s reads %d bytes that differ from the %d written", k, len(g), len(v))
		}
	}
	if lost == 0 {
		t.Fatal("every value reads back although the file it was moved from is gone")
	}
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	if rec := e.Recovery(); rec.ValuesLost || rec.Pending {
		t.Fatalf("Recovery after Settle = %+v", rec)
	}
}

// openTearingRecovery opens h.dir, which must need a recovery, and returns
// a copy of it as a power loss in its first write back leaves it
// (enginetest.TearFirstWriteBack). It reboots.
func (h *powerLoss) openTearingRecovery() string {
	h.t.Helper()
	crashed := enginetest.TearFirstWriteBack(h.t, h.dir, &h.hooks.BeforeWriteBackSync, func() io.Closer { return h.open(h.dir, nil) })
	writeBoot(h.t, h.boot, "boot-3")
	return crashed
}

// A power loss during the write of the values a GC repair read back: the
// next open rolls it back and repairs again, from the old file.
func TestValueLogGCRepairTornByAPowerLossIsRepairedAgain(t *testing.T) {
	h := newPowerLoss(t)
	crashed, want := gcPowerLoss(t, h)
	h = &powerLoss{t: t, dir: crashed, boot: h.boot, hooks: h.hooks}
	crashed = h.openTearingRecovery()
	e := h.open(crashed, nil)
	defer e.Close()
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	checkValues(t, e, "the values the GC moved", want)
}

// Power losses during the recovery of a value log GC rewrite cut short:
// the repair's write torn once, then the next recovery stopped right after
// its roll back (its From saved past the torn repair); or the repair's
// write torn twice in a row. Each time the values the GC moved must come
// back from the old file, which still holds them.
func TestValueLogGCRepairSurvivesRepeatedCrashes(t *testing.T) {
	for _, c := range []struct {
		name  string
		crash func(h *powerLoss) string
	}{
		{"stopped after the roll back", func(h *powerLoss) string {
			h.hooks.AfterRecoveryStep = func(at string) error {
				if at == "roll back" {
					return fmt.Errorf("injected: crash after %s", at)
				}
				return nil
			}
			defer func() { h.hooks.AfterRecoveryStep = nil }()
			_, err := Open(h.options(h.dir))
			if err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("open stopped after the roll back: %v", err)
			}
			return h.dir
		}},
		{"torn again", func(h *powerLoss) string { return h.openTearingRecovery() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newPowerLoss(t)
			crashed, want := gcPowerLoss(t, h)
			h = &powerLoss{t: t, dir: crashed, boot: h.boot, hooks: h.hooks}
			h = &powerLoss{t: t, dir: h.openTearingRecovery(), boot: h.boot, hooks: h.hooks}
			crashed = c.crash(h)
			e := h.open(crashed, nil)
			defer e.Close()
			if err := e.Settle(); err != nil {
				t.Fatal(err)
			}
			checkValues(t, e, "the values the GC moved", want)
		})
	}
}
