package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/strandhq/strand/services/broker/internal/storage/engine/enginetest"
)

// The value log GC racing a stream of batches that overwrite and delete
// the same keys, so every value log file soon is mostly garbage and the GC
// has files to rewrite while batches commit (doc.go, "Durability
// contract": the GC never writes between a commit and its sync, and makes
// its rewrite durable before Badger deletes the file it rewrote). The
// writer goes on until the GC rewrote a few files under it, bounded in
// batches and time. Afterwards, and after a reopen, every key holds the
// value of its last acknowledged batch, and every deleted key is gone.
func TestValueLogGCRacingWritesKeepsTheLatestValues(t *testing.T) {
	const (
		keys       = 48
		minBatches = 200
		maxBatches = 3000
		minGCs     = 3
	)
	dir := t.TempDir()
	e := openEngine(t, dir, Options{})
	key := func(k int) []byte { return fmt.Appendf(nil, "k%03d", k) }
	want := map[string][]byte{} // the writer's, until it is done
	var (
		mu       sync.Mutex
		rewrites int
		gcErr    error
	)
	writerDone := make(chan struct{})
	var wg sync.WaitGroup
	// The GC runs until the writer is done, which is bounded.
	wg.Go(func() {
		for {
			select {
			case <-writerDone:
				return
			default:
			}
			err := e.FlushAndCompact()
			if err == nil {
				err = e.RunValueLogGC()
			}
			mu.Lock()
			switch {
			case err == nil:
				rewrites++
			case !errors.Is(err, ErrNoRewrite):
				gcErr = err
			}
			failed := gcErr != nil
			mu.Unlock()
			if failed {
				return
			}
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	batches := 0
	for ; batches < maxBatches && time.Now().Before(deadline); batches++ {
		mu.Lock()
		enough, failed := rewrites >= minGCs, gcErr != nil
		mu.Unlock()
		if failed || (enough && batches >= minBatches) {
			break
		}
		b := &Batch{}
		next := maps.Clone(want)
		for j := range 8 {
			k := key((batches*8 + j) % keys)
			v := append(fmt.Appendf(nil, "%s@%d:", k, batches), bytes.Repeat([]byte{byte(batches)}, 4096)...)
			b.Set(k, v)
			next[string(k)] = v
		}
		if batches%5 == 4 {
			// A key the batch did not set goes.
			k := key((batches*8 + 8 + batches%7) % keys)
			b.Delete(k)
			delete(next, string(k))
		}
		if err := e.Do(context.Background(), b); err != nil {
			t.Fatalf("batch %d: %v", batches, err)
		}
		want = next
	}
	close(writerDone)
	wg.Wait()
	if gcErr != nil {
		t.Fatalf("value log GC: %v", gcErr)
	}
	if rewrites < minGCs {
		t.Fatalf("the GC rewrote %d files while %d batches were written, want %d", rewrites, batches, minGCs)
	}
	t.Logf("%d batches, %d value log files rewritten under them", batches, rewrites)
	sameContents(t, "after the GC", readPrefix(t, e, []byte("k")), want)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, dir, Options{})
	defer e.Close()
	sameContents(t, "after the GC and a reopen", readPrefix(t, e, []byte("k")), want)
}

// The value log GC rewrites a file that is mostly garbage, and Badger
// deletes the old file only once the rewrite is durable (vlog.go): when
// the rewrite returns, every file it started with is still there (without
// the iterator that pins them, Badger deletes the rewritten file at once,
// and a power loss would then lose the values its rewrite had not yet
// synced). Afterwards the old file is gone and every live value reads back,
// after a reopen too. That the committer is kept out meanwhile is
// TestValueLogGCKeepsTheCommitterOut.
func TestValueLogGCKeepsTheOldFileUntilTheRewriteIsDurable(t *testing.T) {
	dir := t.TempDir()
	e := openEngine(t, dir, Options{})
	want := liveGarbage(t, e)
	before := enginetest.VlogFiles(t, dir)
	var during []string
	e.hooks.AfterGCRewrite = func() { during = enginetest.VlogFiles(t, dir) }
	if err := e.RunValueLogGC(); err != nil {
		_ = e.Close()
		t.Fatalf("value log GC: %v (files %v)", err, before)
	}
	if during == nil {
		_ = e.Close()
		t.Fatal("the GC rewrote nothing")
	}
	for _, f := range before {
		if !slices.Contains(during, f) {
			t.Errorf("value log file %s was deleted before the rewrite was synced (files before %v, after the rewrite %v)", f, before, during)
		}
	}
	after := enginetest.VlogFiles(t, dir)
	if !slices.ContainsFunc(before, func(f string) bool { return !slices.Contains(after, f) }) {
		t.Errorf("no value log file was deleted by the GC: before %v, after %v", before, after)
	}
	checkValues(t, e, "after the GC", want)
	// Writes go on after a GC.
	b := &Batch{}
	b.Set([]byte("after-gc"), bytes.Repeat([]byte("a"), 4096))
	if err := e.Do(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, dir, Options{})
	defer e.Close()
	checkValues(t, e, "after the GC and a reopen", want)
}

// A rewrite that holds every write longer than the GC's stall limit
// (Badger retries a failed memtable flush for ever) fails the engine, as
// a failed write does (vlog.go): the broker then stops and its streams
// fail over, instead of keeping its lease with a store that takes no
// write.
func TestValueLogGCThatHoldsWritesTooLongFailsTheEngine(t *testing.T) {
	failed := make(chan error, 1)
	e := openEngine(t, t.TempDir(), Options{OnFail: func(err error) { failed <- err }})
	defer e.Close()
	liveGarbage(t, e)
	e.hooks.GCStallLimit = 100 * time.Millisecond
	release := make(chan struct{})
	e.hooks.AfterGCRewrite = func() { <-release }
	done := make(chan error, 1)
	go func() { done <- e.RunValueLogGC() }()
	select {
	case err := <-failed:
		if err == nil {
			t.Error("OnFail with no error")
		}
	case <-time.After(20 * time.Second):
		t.Error("the engine did not fail while the GC held every write")
	}
	close(release)
	<-done
	b := &Batch{}
	b.Set([]byte("after-stall"), []byte("x"))
	if err := e.Do(context.Background(), b); !errors.Is(err, ErrClosed) {
		t.Fatalf("a write after the stall: %v, want ErrClosed", err)
	}
}
