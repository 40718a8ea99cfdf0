package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

const fullDiskWriters = 4

// A disk that fills up under the writers: a child process (RLIMIT_FSIZE is
// the whole process's) writes the ledger (helpers_test.go) from several
// writers with Do, with every write(2) past 1 MiB of a file refused with
// EFBIG (the Go runtime ignores SIGXFSZ), as on a full disk; the value
// log, written with write(2), hits it first. The engine must fail cleanly
// (doc.go, "Durability contract"): the failed batches' Do return the
// write's error, OnFail is called once, every later Do fails with
// ErrClosed, Close returns, and the child exits without a panic. Reopened
// with room again, the store holds every batch acknowledged before the
// failure, whole, and no batch in part, and takes writes.
func TestFullDiskFailsCleanly(t *testing.T) {
	if dir, ok := asChild(t.Name()); ok {
		fullDiskChild(dir)
		return
	}
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot_id")
	writeBoot(t, boot, "boot-1")
	c := startChild(t, t.Name(), dir)
	var acked [fullDiskWriters]int
	for w := range acked {
		acked[w] = -1
	}
	var failed, fails, refused, closed []string
	deadline := time.Now().Add(time.Minute)
	for {
		line, ok := c.next(t, deadline)
		if !ok {
			break
		}
		kind, rest, _ := strings.Cut(line, " ")
		switch kind {
		case "A":
			var w, i int
			if _, err := fmt.Sscan(rest, &w, &i); err != nil || w < 0 || w >= fullDiskWriters {
				t.Fatalf("child reported %q", line)
			}
			acked[w] = max(acked[w], i)
		case "D": // a Do that failed with the write's error
			failed = append(failed, rest)
		case "F": // OnFail
			fails = append(fails, rest)
		case "R": // a Do after the failure
			refused = append(refused, rest)
		case "C": // Close returned
			closed = append(closed, rest)
		default:
			t.Fatalf("child reported %q", line)
		}
	}
	state, err := c.wait()
	if err != nil || !state.Success() {
		t.Fatalf("the child ended with %v\n%s", err, c.out)
	}
	if len(fails) != 1 || !strings.Contains(fails[0], syscall.EFBIG.Error()) {
		t.Fatalf("OnFail got %q, want one error naming %q", fails, syscall.EFBIG.Error())
	}
	if len(failed) == 0 {
		t.Fatal("no Do failed with the write's error")
	}
	for _, f := range failed {
		if !strings.Contains(f, syscall.EFBIG.Error()) {
			t.Fatalf("a failed Do returned %q, want the write's error", f)
		}
	}
	for _, r := range refused {
		if r != "closed" {
			t.Fatalf("a Do after the failure returned %q, want ErrClosed", r)
		}
	}
	if len(refused) != fullDiskWriters || len(closed) != 1 {
		t.Fatalf("%d refused writes (want one a writer), Close reported %q", len(refused), closed)
	}
	t.Logf("failed writes: %q; close: %q", failed, closed)
	e := openEngine(t, filepath.Join(dir, "db"), Options{BootIDPath: boot})
	if !e.Recovery().MayHaveLostWritten {
		t.Error("after a failed write the same boot is trusted")
	}
	total := 0
	for w := range fullDiskWriters {
		n := checkLedger(t, e, "d", w)
		if n < acked[w] {
			t.Fatalf("writer %d: latest batch %d, but %d was acknowledged", w, n, acked[w])
		}
		total += acked[w] + 1
		if err := e.Do(context.Background(), ledgerBatch("d", w, n+1)); err != nil {
			t.Fatalf("a write after the reopen: %v", err)
		}
		if got := checkLedger(t, e, "d", w); got != n+1 {
			t.Fatalf("writer %d: latest batch %d after a write, want %d", w, got, n+1)
		}
	}
	t.Logf("%d batches acknowledged before the disk filled", total)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// fullDiskChild is the child: it lowers RLIMIT_FSIZE once Badger's files
// exist (created at open, sized past the limit, and written through their
// mappings but for the value log), and writes until the engine fails.
func fullDiskChild(dir string) {
	exitAfter()
	rep := childReports()
	var failOnce sync.Mutex
	e, err := Open(Options{
		Dir: filepath.Join(dir, "db"), Logger: zerolog.Nop(),
		MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 16 << 20,
		BootIDPath: filepath.Join(dir, "boot_id"),
		OnFail: func(err error) {
			failOnce.Lock()
			defer failOnce.Unlock()
			report(rep, "F %s", strings.ReplaceAll(err.Error(), "\n", " "))
		},
	})
	if err != nil {
		panic(err)
	}
	if err := e.Settle(); err != nil {
		panic(err)
	}
	lim := unix.Rlimit{Cur: 1 << 20}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		panic(err)
	}
	lim.Max = old.Max
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for w := range fullDiskWriters {
		wg.Go(func() {
			// 1 MiB of value log is a few hundred batches.
			for i := range 10_000 {
				err := e.Do(context.Background(), ledgerBatch("d", w, i))
				if err == nil {
					report(rep, "A %d %d", w, i)
					continue
				}
				if !errors.Is(err, ErrClosed) {
					report(rep, "D %s", strings.ReplaceAll(err.Error(), "\n", " "))
				}
				err = e.Do(context.Background(), ledgerBatch("d", w, i+1))
				if errors.Is(err, ErrClosed) {
					report(rep, "R closed")
				} else {
					report(rep, "R %v", err)
				}
				return
			}
			panic("the disk never filled")
		})
	}
	wg.Wait()
	report(rep, "C %v", e.Close())
}
