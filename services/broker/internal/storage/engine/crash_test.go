package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
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
		killAtReport(t, c, "A", 200+rand.IntN(300), func(kind string, w, i int) {
			if w < 0 || w >= killWriters {
				t.Fatalf("child reported writer %d", w)
			}
			switch kind {
			case "A":
				acked[w] = max(acked[w], i)
			case "W":
				written[w] = max(written[w], i)
			}
		})
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
		t.Logf("round %d: %d batches written, not acknowledged, found whole", round, inFlight)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// killAtReport reads the child's reports ("kind w i"), handing each to
// note, and kills the child (SIGKILL) at its killAt-th report of kind on:
// while its writers are in the middle of their batches (killAt 0: the
// child kills itself). It fails t unless a kill ended the child.
func killAtReport(t *testing.T, c *child, on string, killAt int, note func(kind string, w, i int)) {
	t.Helper()
	seen := 0
	deadline := time.Now().Add(time.Minute)
	for {
		line, ok := c.next(t, deadline)
		if !ok {
			break
		}
		var kind string
		var w, i int
		if _, err := fmt.Sscan(line, &kind, &w, &i); err != nil {
			t.Fatalf("child reported %q", line)
		}
		note(kind, w, i)
		if kind != on {
			continue
		}
		if seen++; seen == killAt {
			if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	state, err := c.wait()
	if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, not by the kill\n%s", err, c.out)
	}
	if seen < killAt {
		t.Fatalf("%d %q reports before the child died, the kill was at %d", seen, on, killAt)
	}
	if killAt > 0 {
		t.Logf("killed at %q report %d", on, seen)
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

const (
	splitWriters = 8
	// splitEntries of 400 bytes a batch, in the LSM tree: a group of two
	// writers' batches outgrows Badger's transaction bound at 1 MiB
	// memtables, and is split, so a kill most likely lands between the
	// transactions of a group.
	splitEntries = 160
)

func splitKey(w, i, j int) []byte { return fmt.Appendf(nil, "g/%d/%06d/%02d", w, i, j) }

func splitValue(w, i, j int) []byte {
	v := fmt.Appendf(nil, "%d/%d/%d:", w, i, j)
	return append(v, bytes.Repeat([]byte{byte(i + j)}, 400-len(v))...)
}

// What OnGroup returns is written after every batch of its group, in the
// group's last transaction (Options.OnGroup): a group split at Badger's
// transaction bound may leave batches' entries past what its OnGroup
// entries name, never an OnGroup entry past its batches' entries. That is
// what the model's tails rest on. A child writes groups larger than the
// bound, its OnGroup naming each writer's latest batch of the group
// (tail/w), and kills itself (SIGKILL) right after one of the first
// transactions of a split group was synced (Hooks.AfterPartSync).
// Reopened, every batch up to each writer's tail is whole, some entries
// of the cut group are there past it, and the tail is at or past every
// batch acknowledged.
func TestKillDuringSplitGroupsKeepsTheirOnGroupEntriesLast(t *testing.T) {
	if dir, ok := asChild(t.Name()); ok {
		splitChild(dir)
		return
	}
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot_id")
	writeBoot(t, boot, "boot-1")
	c := startChild(t, t.Name(), dir, fmt.Sprintf("%s=%d", splitKillEnv, 2+rand.IntN(8)))
	var acked [splitWriters]int
	for w := range acked {
		acked[w] = -1
	}
	killAtReport(t, c, "", 0, func(kind string, w, i int) {
		if kind != "A" || w < 0 || w >= splitWriters {
			t.Fatalf("child reported %s %d %d", kind, w, i)
		}
		acked[w] = max(acked[w], i)
	})
	e := openEngine(t, filepath.Join(dir, "db"), Options{BootIDPath: boot, MemTableBytes: 1 << 20})
	defer e.Close()
	past := 0
	for w := range splitWriters {
		tail := -1
		if v, ok := readPrefix(t, e, fmt.Appendf(nil, "tail/%d", w))[fmt.Sprintf("tail/%d", w)]; ok {
			if _, err := fmt.Sscan(string(v), &tail); err != nil {
				t.Fatalf("tail/%d reads %q: %v", w, v, err)
			}
		}
		if tail < acked[w] {
			t.Fatalf("writer %d: tail %d, but batch %d was acknowledged", w, tail, acked[w])
		}
		got := readPrefix(t, e, fmt.Appendf(nil, "g/%d/", w))
		for i := 0; i <= tail; i++ {
			for j := range splitEntries {
				if v, ok := got[string(splitKey(w, i, j))]; !ok || !bytes.Equal(v, splitValue(w, i, j)) {
					t.Fatalf("writer %d: batch %d, at or below the tail %d its OnGroup entry names, lacks entry %d (present: %v)", w, i, tail, j, ok)
				}
				delete(got, string(splitKey(w, i, j)))
			}
		}
		past += len(got)
	}
	if past == 0 {
		t.Fatal("no entry of the cut group is past its tail: the kill did not land between its transactions")
	}
	t.Logf("%d entries of the cut group found past its tail", past)
}

// splitKillEnv holds after how many synced parts of split groups the
// child kills itself.
const splitKillEnv = "STRAND_ENGINE_SPLIT_KILL"

// splitChild is the child: splitWriters writers write batches of
// splitEntries until it kills itself.
func splitChild(dir string) {
	exitAfter()
	rep := childReports()
	var killAt int
	if _, err := fmt.Sscan(os.Getenv(splitKillEnv), &killAt); err != nil {
		panic(err)
	}
	var parts atomic.Int32
	e, err := Open(Options{
		Dir: filepath.Join(dir, "db"), Logger: zerolog.Nop(),
		MemTableBytes: 1 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20,
		BootIDPath: filepath.Join(dir, "boot_id"),
		OnGroup: func(group []*Batch) []Entry {
			tails := map[int]int{}
			for _, b := range group {
				var w, i int
				if _, err := fmt.Sscan(b.Tag.(string), &w, &i); err != nil {
					panic(err)
				}
				tails[w] = i
			}
			var out []Entry
			for w, i := range tails {
				out = append(out, Entry{Key: fmt.Appendf(nil, "tail/%d", w), Value: fmt.Append(nil, i)})
			}
			return out
		},
		Hooks: &Hooks{AfterPartSync: func() {
			if int(parts.Add(1)) == killAt {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}},
	})
	if err != nil {
		panic(err)
	}
	if err := e.Settle(); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for w := range splitWriters {
		wg.Go(func() {
			for i := range 100_000 {
				b := &Batch{Tag: fmt.Sprintf("%d %d", w, i)}
				for j := range splitEntries {
					b.Set(splitKey(w, i, j), splitValue(w, i, j))
				}
				if err := e.Do(context.Background(), b); err != nil {
					panic(err)
				}
				report(rep, "A %d %d", w, i)
			}
		})
	}
	wg.Wait()
	panic(errors.New("the writers ran out before the kill"))
}
