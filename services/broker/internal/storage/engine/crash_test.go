package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

const (
	killRoundEnv = "STRAND_ENGINE_KILL_ROUND"
	killWriters  = 8
	// killRounds: each round's child writes over what the rounds before
	// it left, so the later rounds open a store a kill left.
	killRounds = 3
)

// A process killed (SIGKILL) while its writers are in the middle of their
// batches (doc.go, "Durability contract"): a child process writes the
// ledger (helpers_test.go) from several writers with Do and reports each
// batch once OnWritten saw it (written: in Badger's files) and once Do
// returned (acknowledged); the parent kills it at a random point. On the
// same boot nothing written is lost: the reopened store holds every batch
// reported written or acknowledged, whole, and no batch in part. Rounds
// repeat on the same store, the last reopened as after a reboot, whose
// recovery must find nothing torn (the page cache held it all) and roll
// nothing back.
//
// That no batch is seen in part holds here because a group (one batch of
// each writer at most) stays far below Badger's transaction bound, so it
// is one transaction; the contract promises wholeness only to
// acknowledged batches, since a larger group may be split (commit.go).
func TestKillDuringBatchesKeepsEveryWrittenBatchWhole(t *testing.T) {
	if dir, ok := asChild(t.Name()); ok {
		killChild(dir, os.Getenv(killRoundEnv))
		return
	}
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot_id")
	writeBoot(t, boot, "boot-1")
	db := filepath.Join(dir, "db")
	prev := map[string][killWriters]int{} // each earlier round's latest batches
	for round := range killRounds {
		p := fmt.Sprint("r", round)
		c := startChild(t, t.Name(), dir, killRoundEnv+"="+p)
		var acked, written [killWriters]int
		for w := range killWriters {
			acked[w], written[w] = -1, -1
		}
		acks, killAt := 0, 200+rand.IntN(300)
		deadline := time.Now().Add(time.Minute)
		for {
			line, ok := c.next(t, deadline)
			if !ok {
				break
			}
			var kind string
			var w, i int
			if _, err := fmt.Sscan(line, &kind, &w, &i); err != nil || w < 0 || w >= killWriters {
				t.Fatalf("child reported %q", line)
			}
			switch kind {
			case "A":
				acked[w] = max(acked[w], i)
				acks++
				if acks == killAt {
					// Other writers are in the middle of their batches.
					if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
				}
			case "W":
				written[w] = max(written[w], i)
			}
		}
		state, err := c.wait()
		if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: the child ended with %v, not by the kill\n%s", round, err, c.out)
		}
		if acks < killAt {
			t.Fatalf("round %d: %d batches acknowledged before the child died, the kill was at %d", round, acks, killAt)
		}
		last := round == killRounds-1
		if last {
			// A reboot: the recovery reads what was written last back.
			writeBoot(t, boot, "boot-2")
		}
		e, err := Open(Options{Dir: db, Logger: zerolog.Nop(), MemTableBytes: 1 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20, BootIDPath: boot})
		if err != nil {
			t.Fatalf("round %d: open after the kill: %v", round, err)
		}
		if got := e.Recovery().MayHaveLostWritten; got != last {
			t.Errorf("round %d: MayHaveLostWritten = %v after a kill, rebooted: %v", round, got, last)
		}
		if err := e.Settle(); err != nil {
			t.Fatal(err)
		}
		if group := killWriters * ledgerBatch(p, 0, 1).size; 2*group > int(e.TxnBytes()) {
			t.Fatalf("a group of %d bytes may be split at Badger's transaction bound (%d): a batch could be seen in part", group, e.TxnBytes())
		}
		var latest [killWriters]int
		inFlight := 0
		for w := range killWriters {
			latest[w] = checkLedger(t, e, p, w)
			if latest[w] < max(acked[w], written[w]) {
				t.Errorf("round %d, writer %d: latest batch %d, but batch %d was acknowledged and %d written", round, w, latest[w], acked[w], written[w])
			}
			inFlight += latest[w] - acked[w]
		}
		// The rounds before are as their reopen found them.
		for q, want := range prev {
			for w := range killWriters {
				if n := checkLedger(t, e, q, w); n != want[w] {
					t.Errorf("round %d: %s's writer %d now at batch %d, was %d", round, q, w, n, want[w])
				}
			}
		}
		prev[p] = latest
		t.Logf("round %d: killed after %d acknowledged batches; %d written, not acknowledged, found whole", round, acks, inFlight)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// killChild is the child: it writes the ledger under prefix p from
// killWriters writers until it is killed.
func killChild(dir, p string) {
	exitAfter()
	rep := childReports()
	// Small memtables and value log files: the kill finds batches on both
	// sides of a rotation.
	e, err := Open(Options{
		Dir: filepath.Join(dir, "db"), Logger: zerolog.Nop(),
		MemTableBytes: 1 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20,
		BootIDPath: filepath.Join(dir, "boot_id"),
		OnWritten:  func(b *Batch) { report(rep, "W %s", b.Tag) },
	})
	if err != nil {
		panic(err)
	}
	if err := e.Settle(); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for w := range killWriters {
		wg.Go(func() {
			for i := range 100_000 {
				if err := e.Do(context.Background(), ledgerBatch(p, w, i)); err != nil {
					panic(err)
				}
				report(rep, "A %d %d", w, i)
			}
		})
	}
	wg.Wait()
	panic(errors.New("the writers ran out before the kill"))
}
