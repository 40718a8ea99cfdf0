package storage

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/clustertest"
)

func TestDropDeletesEverything(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	s := ownerStream(t, db, "gone", 1)
	mustAppend(t, s, 1, recs("a", 50))
	if _, err := s.CommitCursor(ctx, 1, "c", 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	producerKeys := 0
	if err := s.scanKeys(s.prodPrefix, func([]byte) { producerKeys++ }); err != nil || producerKeys == 0 {
		t.Fatalf("no producer table checkpoint before the drop: %v", err)
	}
	keep := ownerStream(t, db, "gone2", 1) // a name sharing the prefix
	mustAppend(t, keep, 1, recs("b", 5))
	wait := s.WaitTail(100)
	if err := db.Drop("gone"); err != nil {
		t.Fatal(err)
	}
	<-wait // closed by the drop
	if _, err := s.Append(ctx, 1, recs("x", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append to a dropped stream: %v", err)
	}
	names, err := db.Streams()
	if err != nil || !slices.Equal(names, []string{"gone2"}) {
		t.Fatalf("Streams() = %v, %v", names, err)
	}
	n := 0
	for _, kind := range []byte{kindMeta, kindRecord, kindEvent, kindSnapshot, kindProducers} {
		if err := keep.scanKeys(streamKey(kind, "gone"), func([]byte) { n++ }); err != nil {
			t.Fatal(err)
		}
	}
	if n != 0 {
		t.Fatalf("%d keys of the dropped stream left", n)
	}
	if got := mustRead(t, keep, 0, 0); len(got) != 5 {
		t.Fatalf("the other stream lost records: %d", len(got))
	}
	// A recreated stream starts empty.
	s = openStream(t, db, "gone")
	if st := s.State(); st.RecordTail != 0 || st.Epoch != 0 || st.CursorEventTail != 0 {
		t.Fatalf("recreated stream %+v", st)
	}
	if _, ok := s.Cursor("c"); ok {
		t.Fatal("recreated stream has the old cursor")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Drop("gone"); !errors.Is(err, ErrClosed) {
		t.Fatalf("drop on a closed db: %v", err)
	}
}

func TestBadNames(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	for _, name := range []string{"", string(make([]byte, 256))} {
		if _, err := db.Open(name); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Open(%d bytes): %v", len(name), err)
		}
	}
}

// A failed write stops the DB and is reported once through OnFail (the
// broker stops on it, so the streams it owns fail over); the batch is not
// confirmed and nothing later is written.
func TestFailedWriteIsReportedOnce(t *testing.T) {
	var fault atomic.Bool
	var mu sync.Mutex
	var reported []error
	db, err := Open(Options{Dir: t.TempDir(), Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20,
		WriteFault: func() error {
			if fault.Load() {
				return errors.New("injected: no space left on device")
			}
			return nil
		},
		OnFail: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	ctx := context.Background()
	mustAppend(t, s, 1, recs("a", 2))
	fault.Store(true)
	if _, err := s.Append(ctx, 1, recs("b", 1)); err == nil {
		t.Fatal("an append whose write failed was confirmed")
	}
	fault.Store(false)
	if _, err := s.Append(ctx, 1, recs("c", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("an append after a failed write: %v, want ErrClosed", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 1 || !strings.Contains(reported[0].Error(), "injected") {
		t.Fatalf("OnFail got %v, want the one injected error", reported)
	}
	if tail := s.State().RecordTail; tail > 3 {
		t.Fatalf("record tail %d after a failed write and a refused one", tail)
	}
}

// Closed tells a loop over a stream's waits that they will return at once
// from now on: the stream was dropped (or its DB closed).
func TestClosedAfterDrop(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	if s.Closed() {
		t.Fatal("an open stream reports closed")
	}
	if err := db.Drop("s"); err != nil {
		t.Fatal(err)
	}
	if !s.Closed() {
		t.Fatal("a dropped stream does not report closed")
	}
	select {
	case <-s.WaitTail(s.Tails().Record):
	default:
		t.Fatal("a dropped stream's wait does not return at once")
	}
}

// A drop a crash interrupts is finished by the next Open, even when an op
// of the stream queued before the drop was written in the same batch as
// the drop's marker: the committer wrote that op's metadata last, without
// the marker, so the next Open found a stream whose records were deleted
// and whose metadata still named them, and refused it for ever.
func TestDropInterruptedAfterAQueuedOpIsFinishedOnOpen(t *testing.T) {
	dir := t.TempDir()
	// The hooks are set before anything is written and steered by atomics:
	// the committer reads them on every batch.
	var failFrom atomic.Int32 // fail every write from this one on (0: none)
	var writes atomic.Int32
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20,
		WriteFault: func() error {
			n := writes.Add(1)
			if from := failFrom.Load(); from > 0 && n >= from {
				return errors.New("injected: crash")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var hold atomic.Bool
	inSync, release := make(chan struct{}), make(chan struct{})
	db.hooks.BeforeSync = func() {
		if hold.CompareAndSwap(true, false) {
			close(inSync)
			<-release
		}
	}
	ctx := context.Background()
	s := ownerStream(t, db, "x", 1)
	mustAppend(t, s, 1, recs("a", 10))
	if _, err := s.CommitCursor(ctx, 1, "c", 3); err != nil {
		t.Fatal(err)
	}
	// CommitCursor returns before its fsync: wait for it, or its batch
	// could be the one held below and the append queue behind it.
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Hold the committer at the sync of an append, so the next ops queue.
	hold.Store(true)
	go func() { _, _ = s.Append(ctx, 1, recs("b", 1)) }()
	<-inSync
	if _, err := s.CommitCursor(ctx, 1, "c", 5); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan error, 1)
	go func() { dropped <- db.Drop("x") }()
	clustertest.Eventually(t, 10*time.Second, "the cursor commit and the drop's marker queued", func() bool {
		return db.eng.Queued() == 2
	})
	// Then the drop is cut short after it deleted the records: the writes
	// after the batch with its marker and the record delete fail, as a
	// crash there would leave the store.
	failFrom.Store(writes.Load() + 3)
	close(release)
	if err := <-dropped; err == nil {
		t.Fatal("the drop finished; the test needs it cut short")
	}
	_ = db.Close()

	db = openDB(t, dir)
	defer db.Close()
	names, err := db.Streams()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, "x") {
		_, err := db.Open("x")
		t.Fatalf("after reopening, the dropped stream is still listed (opening it: %v)", err)
	}
}
