package engine

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
)

// A failed write stops the engine (doc.go, "Durability contract"): the
// group it failed (here two batches queued behind a held fsync) fails
// with the write's error, to Do and to OnDone, OnFail is called once, and
// every later batch fails with ErrClosed, whichever way it was handed in;
// Err says so. The next open, on the same boot, distrusts what was
// written (the boot record is forgotten, boot.go) and holds every batch
// acknowledged before the fault and nothing of the failed ones.
func TestFailedWriteStopsTheEngine(t *testing.T) {
	dir := t.TempDir()
	boot := filepath.Join(t.TempDir(), "boot_id")
	writeBoot(t, boot, "boot-1")
	injected := errors.New("injected: no space left on device")
	var (
		fault atomic.Bool
		mu    sync.Mutex
		fails []error
		dones []string // OnDone: tag, and the error's kind
	)
	e := openEngine(t, dir, Options{
		BootIDPath: boot,
		WriteFault: func() error {
			if fault.Load() {
				return injected
			}
			return nil
		},
		OnFail: func(err error) {
			mu.Lock()
			fails = append(fails, err)
			mu.Unlock()
		},
		OnDone: func(b *Batch, err error) {
			kind := "durable"
			switch {
			case errors.Is(err, ErrClosed):
				kind = "closed"
			case errors.Is(err, injected):
				kind = "failed"
			case err != nil:
				kind = err.Error()
			}
			mu.Lock()
			dones = append(dones, b.Tag.(string)+" "+kind)
			mu.Unlock()
		},
	})
	defer e.Close()
	ctx := context.Background()
	for i := range 10 {
		if err := e.Do(ctx, ledgerBatch("f", 0, i)); err != nil {
			t.Fatal(err)
		}
	}
	// Batch 10 is held at its fsync, so 11 and 12 queue and are taken
	// together: the group the fault fails.
	inSync, release := holdNextSync(e)
	held := make(chan error, 1)
	go func() { held <- e.Do(ctx, ledgerBatch("f", 0, 10)) }()
	<-inSync
	failing := make(chan error, 1)
	go func() { failing <- e.Do(ctx, ledgerBatch("f", 0, 11)) }()
	clustertest.Eventually(t, 10*time.Second, "batch 11 queued", func() bool { return e.Queued() == 1 })
	if err := e.Enqueue(ctx, ledgerBatch("f", 0, 12)); err != nil {
		t.Fatal(err)
	}
	fault.Store(true)
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the batch written before the fault: %v", err)
	}
	if err := <-failing; !errors.Is(err, injected) || errors.Is(err, ErrClosed) {
		t.Fatalf("Do of the batch whose write failed: %v, want the write's error", err)
	}
	fault.Store(false) // the disk would take writes again: the engine must not
	if err := e.Err(); !errors.Is(err, ErrClosed) || !errors.Is(err, injected) {
		t.Fatalf("Err after the failed write: %v, want ErrClosed naming the write's error", err)
	}
	if err := e.Do(ctx, ledgerBatch("f", 0, 13)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after the failed write: %v, want ErrClosed", err)
	}
	if err := e.Enqueue(ctx, ledgerBatch("f", 0, 14)); err != nil {
		t.Fatalf("Enqueue after the failed write: %v (the committer refuses the batch, OnDone says so)", err)
	}
	if !e.TryEnqueue(ledgerBatch("f", 0, 15)) {
		t.Fatal("TryEnqueue after the failed write did not take the batch to refuse it")
	}
	last := &Batch{Tag: "last"}
	if err := e.Do(ctx, last); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after the failed write: %v, want ErrClosed", err)
	}
	mu.Lock()
	gotFails, gotDones := slices.Clone(fails), slices.Clone(dones)
	mu.Unlock()
	if len(gotFails) != 1 || !errors.Is(gotFails[0], injected) {
		t.Fatalf("OnFail got %v, want the write's error once", gotFails)
	}
	want := []string{"0 10 durable", "0 11 failed", "0 12 failed", "0 13 closed", "0 14 closed", "0 15 closed", "last closed"}
	if i := len(gotDones) - len(want); i < 0 || !slices.Equal(gotDones[i:], want) {
		t.Fatalf("OnDone reported %v, want it to end with %v", gotDones, want)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if fileExists(dir, cleanFile) {
		t.Fatal("a store whose write failed was marked clean by Close")
	}
	e = openEngine(t, dir, Options{BootIDPath: boot})
	defer e.Close()
	if !e.Recovery().MayHaveLostWritten {
		t.Error("after a failed write the same boot is trusted")
	}
	if n := checkLedger(t, e, "f", 0); n != 10 {
		t.Fatalf("latest batch %d after the reopen, want 10: the last acknowledged before the fault", n)
	}
}
