package engine

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Helpers shared by the engine's test files: opening an engine, reading
// values back, the ledger of batches whose keys tell after any stop
// whether a batch is there whole, the boot and clean stop a crash test
// plays, and a child process to kill or starve. A power loss is played on
// copies of the store's files by package enginetest.

// openEngine opens an engine in dir with small memtables and 1 MiB value
// log files (unless opts says otherwise) and settles it.
func openEngine(t *testing.T, dir string, opts Options) *Engine {
	t.Helper()
	opts.Dir, opts.Logger = dir, zerolog.Nop()
	if opts.MemTableBytes == 0 {
		opts.MemTableBytes, opts.CacheBytes = 8<<20, 4<<20
	}
	if opts.ValueLogFileBytes == 0 {
		opts.ValueLogFileBytes = 1 << 20
	}
	e, err := Open(opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	return e
}

// checkValues fails t unless every key of want holds its value.
func checkValues(t *testing.T, e *Engine, what string, want map[string][]byte) {
	t.Helper()
	err := e.View(func(txn *Txn) error {
		for k, v := range want {
			item, err := txn.Get([]byte(k))
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			got, err := item.ValueCopy(nil)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			if !bytes.Equal(got, v) {
				return fmt.Errorf("%s: %d bytes differ from the %d written", k, len(got), len(v))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// liveGarbage writes values so that deleting most of them leaves every
// value log file mostly garbage with a few live values in each (a GC
// rewrite has values to move), deletes them and brings Badger's garbage
// counts up to date. It returns the live values.
func liveGarbage(t *testing.T, e *Engine) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	want := map[string][]byte{}
	for i := range 24 {
		b := &Batch{}
		for j := range 64 {
			b.Set(fmt.Appendf(nil, "s%04d-%02d", i, j), bytes.Repeat([]byte{byte(i), byte(j)}, 2048))
		}
		if i%4 == 0 {
			for j := range 8 {
				k, v := fmt.Sprintf("k%04d-%02d", i, j), bytes.Repeat([]byte{byte(j), byte(i)}, 2048)
				b.Set([]byte(k), v)
				want[k] = v
			}
		}
		if err := e.Do(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.DeleteRange(ctx, []byte("s"), []byte("s"), nil); err != nil {
		t.Fatal(err)
	}
	if err := e.FlushAndCompact(); err != nil {
		t.Fatal(err)
	}
	return want
}

// writeBoot writes id to the boot id file at path (Options.BootIDPath):
// a new id plays a reboot of the machine (boot.go).
func writeBoot(t *testing.T, path, id string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// removeClean removes the clean stop marker Close left in dir: what a
// crash of the process leaves, since only Close writes it (boot.go).
func removeClean(t *testing.T, dir string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, cleanFile)); err != nil {
		t.Fatal(err)
	}
}

// holdNextSync stops the committer at its next fsync (Hooks.BeforeSync),
// after the group's Badger commit: inSync is closed there, and the fsync
// waits for release. Set it while no write is in flight.
func holdNextSync(e *Engine) (inSync <-chan struct{}, release chan struct{}) {
	reached := make(chan struct{})
	release = make(chan struct{})
	var held atomic.Bool
	e.hooks.BeforeSync = func() {
		if held.CompareAndSwap(false, true) {
			close(reached)
			<-release
		}
	}
	return reached, release
}

// The ledger: batch i of writer w under prefix p sets p/w/i/0..3 (even j:
// 400 bytes, in the LSM tree; odd j: 2000 bytes, in the value log) and
// p/w/i/del, deletes p/w/(i-1)/del, and sets p/w/latest to i. A writer's
// batches go one after another (Do), so after any stop its keys must read
// as batches 0..n whole, n the latest, and nothing of a later one.
func ledgerBatch(p string, w, i int) *Batch {
	b := &Batch{Tag: fmt.Sprintf("%d %d", w, i)}
	for j := range 4 {
		b.Set(ledgerKey(p, w, i, fmt.Sprint(j)), ledgerValue(p, w, i, j))
	}
	b.Set(ledgerKey(p, w, i, "del"), ledgerValue(p, w, i, 4))
	if i > 0 {
		b.Delete(ledgerKey(p, w, i-1, "del"))
	}
	b.Set(fmt.Appendf(nil, "%s/%d/latest", p, w), fmt.Append(nil, i))
	return b
}

func ledgerKey(p string, w, i int, name string) []byte {
	return fmt.Appendf(nil, "%s/%d/%06d/%s", p, w, i, name)
}

// ledgerValue is the value of key j of batch i: its name, then a filler
// that differs from batch to batch.
func ledgerValue(p string, w, i, j int) []byte {
	size := 400
	if j%2 == 1 {
		size = 2000
	}
	v := fmt.Appendf(nil, "%s/%d/%d/%d:", p, w, i, j)
	return append(v, bytes.Repeat([]byte{byte(i + j)}, size-len(v))...)
}

// ledgerWant is what writer w's keys must hold when batch n is its latest
// (n < 0: none).
func ledgerWant(p string, w, n int) map[string][]byte {
	want := map[string][]byte{}
	if n < 0 {
		return want
	}
	for i := 0; i <= n; i++ {
		for j := range 4 {
			want[string(ledgerKey(p, w, i, fmt.Sprint(j)))] = ledgerValue(p, w, i, j)
		}
	}
	want[string(ledgerKey(p, w, n, "del"))] = ledgerValue(p, w, n, 4)
	want[fmt.Sprintf("%s/%d/latest", p, w)] = fmt.Append(nil, n)
	return want
}

// checkLedger reads writer w's keys under p and fails t unless they are
// exactly batches 0..n, n the latest batch they name; it returns n (-1:
// no batch). A batch seen in part, or a key of a batch past n, fails.
func checkLedger(t *testing.T, e *Engine, p string, w int) int {
	t.Helper()
	got := readPrefix(t, e, fmt.Appendf(nil, "%s/%d/", p, w))
	n := -1
	if v, ok := got[fmt.Sprintf("%s/%d/latest", p, w)]; ok {
		if _, err := fmt.Sscan(string(v), &n); err != nil {
			t.Fatalf("writer %d's latest batch reads %q: %v", w, v, err)
		}
	}
	sameContents(t, fmt.Sprintf("writer %d of %s, latest batch %d", w, p, n), got, ledgerWant(p, w, n))
	return n
}

// readPrefix reads every key under prefix and its value.
func readPrefix(t *testing.T, e *Engine, prefix []byte) map[string][]byte {
	t.Helper()
	got := map[string][]byte{}
	err := e.View(func(txn *Txn) error {
		it := txn.NewIterator(IterOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return fmt.Errorf("%s: %w", it.Item().Key(), err)
			}
			got[string(it.Item().Key())] = v
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// sameContents fails t unless got holds exactly the keys of want, each
// with its value.
func sameContents(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	var missing, extra, differ []string
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing = append(missing, k)
		case !bytes.Equal(g, v):
			differ = append(differ, k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(extra)+len(differ) > 0 {
		slices.Sort(missing)
		slices.Sort(extra)
		slices.Sort(differ)
		few := func(keys []string) []string { return keys[:min(len(keys), 5)] }
		t.Fatalf("%s: %d keys missing %q, %d not written %q, %d with other values %q (at most 5 of each)", what, len(missing), few(missing), len(extra), few(extra), len(differ), few(differ))
	}
}

// Child processes. A test that must kill the engine's process, or limit
// it (RLIMIT_FSIZE is the whole process's), runs its writer in a child: the
// test binary again, running only that test, which finds childEnv set and
// plays the child's part. The child reports on a pipe (its fd 3), a line a
// write(2), shorter than PIPE_BUF: lines of concurrent writers do not
// interleave, and every line written before the child died reaches the
// parent, on no file system the child may be starving.

// childEnv holds "TestName=dir" in a child.
const childEnv = "STRAND_ENGINE_TEST_CHILD"

// childLimit bounds a child's life, should its parent never end it.
const childLimit = 2 * time.Minute

// asChild returns the dir its parent gave, when this process is the child
// of test.
func asChild(test string) (string, bool) {
	name, dir, ok := strings.Cut(os.Getenv(childEnv), "=")
	return dir, ok && name == test
}

// child is a running child process of a test.
type child struct {
	cmd *exec.Cmd
	// lines are the child's reports; closed once it exited (the pipe's end).
	lines chan string
	out   *bytes.Buffer // its stdout and stderr, to read once it exited
}

// startChild runs the test binary as test's child in dir, with env added.
func startChild(t *testing.T, test, dir string, env ...string) *child {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), childEnv+"="+test+"="+dir), env...)
	cmd.ExtraFiles = []*os.File{w}
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The parent's copy of the write end goes, so the pipe ends when the
	// child does.
	_ = w.Close()
	c := &child{cmd: cmd, lines: make(chan string, 64), out: out}
	go func() {
		defer close(c.lines)
		defer func() { _ = r.Close() }()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		for range c.lines { // let the reader end
		}
	})
	return c
}

// next returns the child's next report, or false once the child exited;
// it fails t past deadline.
func (c *child) next(t *testing.T, deadline time.Time) (string, bool) {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		return line, ok
	case <-time.After(time.Until(deadline)):
		_ = c.cmd.Process.Kill()
		t.Fatal("the child neither reported nor exited in time")
		return "", false
	}
}

// wait waits for the child to exit, once its reports ended.
func (c *child) wait() (*os.ProcessState, error) {
	err := c.cmd.Wait()
	return c.cmd.ProcessState, err
}

// childReports is the child's end of the report pipe.
func childReports() *os.File { return os.NewFile(3, "reports") }

// report writes one line to the parent; a child that cannot report has
// no use going on.
func report(f *os.File, format string, args ...any) {
	if _, err := fmt.Fprintf(f, format+"\n", args...); err != nil {
		panic(err)
	}
}

// exitAfter ends a child that outlived childLimit.
func exitAfter() {
	time.AfterFunc(childLimit, func() {
		fmt.Fprintln(os.Stderr, "child outlived its limit")
		os.Exit(3)
	})
}
