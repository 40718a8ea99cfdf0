package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
)

// StopWrites refuses every later batch, however it is handed in, and
// returns only once the committer wrote every batch accepted before it,
// durably, in queue order; reads go on until Close. Here the batches are
// accepted while the committer is held at the fsync of the first, and
// StopWrites is called before it is let go.
func TestStopWritesWritesEveryAcceptedBatch(t *testing.T) {
	const accepted = 50
	dir := t.TempDir()
	boot := filepath.Join(t.TempDir(), "boot_id")
	writeBoot(t, boot, "boot-1")
	var (
		mu    sync.Mutex
		dones []string
	)
	e := openEngine(t, dir, Options{BootIDPath: boot, OnDone: func(b *Batch, err error) {
		mu.Lock()
		dones = append(dones, fmt.Sprintf("%s %v", b.Tag, err))
		mu.Unlock()
	}})
	defer e.Close()
	ctx := context.Background()
	inSync, release := holdNextSync(e)
	if err := e.Enqueue(ctx, ledgerBatch("s", 0, 0)); err != nil {
		t.Fatal(err)
	}
	<-inSync
	for i := 1; i <= accepted; i++ {
		if err := e.Enqueue(ctx, ledgerBatch("s", 0, i)); err != nil {
			t.Fatal(err)
		}
	}
	stopped := make(chan struct{})
	go func() {
		e.StopWrites()
		close(stopped)
	}()
	clustertest.Eventually(t, 10*time.Second, "StopWrites refuses batches", func() bool { return e.Err() != nil })
	if err := e.Enqueue(ctx, ledgerBatch("s", 0, accepted+1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after StopWrites: %v, want ErrClosed", err)
	}
	if e.TryEnqueue(ledgerBatch("s", 0, accepted+1)) {
		t.Fatal("TryEnqueue after StopWrites took the batch")
	}
	if err := e.Do(ctx, ledgerBatch("s", 0, accepted+1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after StopWrites: %v, want ErrClosed", err)
	}
	close(release)
	<-stopped
	mu.Lock()
	got := slices.Clone(dones)
	mu.Unlock()
	var want []string
	for i := 0; i <= accepted; i++ {
		want = append(want, fmt.Sprintf("0 %d <nil>", i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("OnDone when StopWrites returned: %q, want every accepted batch durable, in order", got)
	}
	// Reads go on until Close.
	if n := checkLedger(t, e, "s", 0); n != accepted {
		t.Fatalf("latest batch %d after StopWrites, want %d", n, accepted)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, dir, Options{BootIDPath: boot})
	defer e.Close()
	if e.Recovery().MayHaveLostWritten {
		t.Error("a store closed after StopWrites claims written data may be lost")
	}
	if n := checkLedger(t, e, "s", 0); n != accepted {
		t.Fatalf("latest batch %d after a reopen, want %d", n, accepted)
	}
}
