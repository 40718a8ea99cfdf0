package storage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// crashChildEnv, when set, makes TestCrashKeepsAcknowledgedRecords run as
// the child that appends and SIGKILLs itself; its value is the directory.
const crashChildEnv = "STRAND_STORAGE_CRASH_CHILD"

const (
	crashWorkers   = 8
	crashKillAfter = 300 // acknowledged appends before the child kills itself
)

// TestCrashKeepsAcknowledgedRecords runs a child process that appends from
// several goroutines, writes every acknowledged offset to a file after its
// Append returns, and SIGKILLs itself while other appends are in flight.
// Reopening the store must find every acknowledged record with its bytes,
// dense offsets and an unbroken chain; the torn tail of the write that was
// in flight must not corrupt anything.
func TestCrashKeepsAcknowledgedRecords(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashKeepsAcknowledgedRecords$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child did not die: %v\n%s", err, out)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child exited with %v, want SIGKILL\n%s", err, out)
	}

	acked := readAcks(t, filepath.Join(dir, "acks"))
	if len(acked) < crashKillAfter {
		t.Fatalf("only %d acknowledged appends recorded", len(acked))
	}
	db := openDB(t, filepath.Join(dir, "db"))
	defer db.Close()
	s := openStream(t, db, "crash")
	st := s.State()
	got := mustRead(t, s, 0, 0)
	if uint64(len(got)) != st.RecordTail {
		t.Fatalf("read %d records, tail %d", len(got), st.RecordTail)
	}
	prev := uint64(0)
	for i, r := range got {
		if r.Offset != uint64(i) || r.Chain != Chain(prev, &r) {
			t.Fatalf("record %d: offset %d, chain broken: %v", i, r.Offset, r.Chain != Chain(prev, &r))
		}
		prev = r.Chain
	}
	if st.Chain != prev {
		t.Fatalf("state chain %#x, log chain %#x", st.Chain, prev)
	}
	for off, payload := range acked {
		if off >= st.RecordTail {
			t.Fatalf("acknowledged record %d lost: tail %d", off, st.RecordTail)
		}
		if string(got[off].Payload) != payload {
			t.Fatalf("record %d = %q, acknowledged %q", off, got[off].Payload, payload)
		}
	}
	t.Logf("%d acknowledged, %d recovered", len(acked), st.RecordTail)
	// The log continues where it stopped.
	more := mustAppend(t, s, 1, recs("after", 1))
	if more[0].Offset != st.RecordTail || more[0].Chain != Chain(prev, &more[0]) {
		t.Fatalf("append after recovery = %+v", more[0])
	}
}

func crashChild(dir string) {
	db, err := Open(Options{Dir: filepath.Join(dir, "db"), MemTableBytes: 4 << 20})
	if err != nil {
		panic(err)
	}
	s, err := db.Open("crash")
	if err != nil {
		panic(err)
	}
	if err := s.AdvanceEpoch(context.Background(), 1); err != nil {
		panic(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "acks"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(err)
	}
	var (
		mu    sync.Mutex
		acked int
		wg    sync.WaitGroup
	)
	for w := range crashWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				batch := make([]Record, 1+i%4)
				for j := range batch {
					// Large enough that batches span memtables and WAL growth.
					batch[j].Payload = []byte(fmt.Sprintf("w%d-%d-%d-%s", w, i, j, strings.Repeat("x", 2000)))
				}
				out, err := s.Append(context.Background(), 1, batch)
				if err != nil {
					panic(err)
				}
				var b strings.Builder
				for _, r := range out {
					fmt.Fprintf(&b, "%d %s\n", r.Offset, r.Payload)
				}
				mu.Lock()
				if _, err := f.WriteString(b.String()); err != nil {
					panic(err)
				}
				acked++
				if acked == crashKillAfter {
					// Other workers are mid-append right now.
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func readAcks(t *testing.T, path string) map[uint64]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	acked := map[uint64]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		off, payload, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("bad ack line %q", sc.Text())
		}
		n, err := strconv.ParseUint(off, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := acked[n]; dup {
			t.Fatalf("offset %d acknowledged twice", n)
		}
		acked[n] = payload
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return acked
}
