package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/rs/zerolog"
	"github.com/strandhq/strand/internal/clustertest"
	"golang.org/x/sys/unix"
)

// valueLogDB opens an engine with value log files of fileBytes and writes
// batches of 256 KiB (64 values of 4 KiB, all in the value log) through
// the committer; the returned function writes one more small batch.
func valueLogDB(t *testing.T, fileBytes int64, batches int) (string, *Engine, func()) {
	t.Helper()
	dir := t.TempDir()
	e, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: fileBytes})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Settle(); err != nil {
		t.Fatal(err)
	}
	for i := range batches {
		b := &Batch{}
		for j := range 64 {
			b.Set([]byte(fmt.Sprintf("r%06d-%02d", i, j)), bytes.Repeat([]byte{byte(i), byte(j)}, 2048))
		}
		if err := e.Do(context.Background(), b); err != nil {
			_ = e.Close()
			t.Fatal(err)
		}
	}
	n := 0
	more := func() {
		t.Helper()
		n++
		b := &Batch{}
		b.Set([]byte(fmt.Sprintf("tick%06d", n)), []byte("x"))
		if err := e.Do(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	return dir, e, more
}

type smapsEntry struct {
	path    string
	rssKB   int
	vmFlags []string
}

// smaps lists this process's mappings of files under dir.
func smaps(t *testing.T, dir string) []smapsEntry {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []smapsEntry
	var cur *smapsEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			// A mapping's header; anonymous mappings have no path.
			cur = nil
			if p := strings.Join(fields[5:], " "); strings.HasPrefix(p, real+"/") {
				out = append(out, smapsEntry{path: p})
				cur = &out[len(out)-1]
			}
		case cur != nil && len(fields) >= 2 && fields[0] == "Rss:":
			cur.rssKB, _ = strconv.Atoi(fields[1])
		case cur != nil && fields != nil && fields[0] == "VmFlags:":
			cur.vmFlags = fields[1:]
		}
	}
	return out
}

// Badger's write-ahead logs and value log files are advised MADV_RANDOM
// (no read-around, so fsyncs write only what changed), and value log files
// Badger no longer appends to leave the resident set.
func TestMappingsAdvised(t *testing.T) {
	// About 4 MiB of value log: several 1 MiB files.
	dir, db, more := valueLogDB(t, 1<<20, 16)
	defer db.Close()
	clustertest.Eventually(t, 3*trimEvery, "value log mappings advised", func() error {
		var problems []string
		vlogs := 0
		for _, m := range smaps(t, dir) {
			ext := filepath.Ext(m.path)
			if ext != ".vlog" && ext != ".mem" {
				continue
			}
			if !slices.Contains(m.vmFlags, "rr") {
				problems = append(problems, fmt.Sprintf("%s not advised random (VmFlags %v)", filepath.Base(m.path), m.vmFlags))
			}
			if ext == ".vlog" {
				vlogs++
			}
		}
		rss := map[string]int{}
		var last string
		for _, m := range smaps(t, dir) {
			if filepath.Ext(m.path) == ".vlog" {
				rss[filepath.Base(m.path)] += m.rssKB
				if filepath.Base(m.path) > last {
					last = filepath.Base(m.path)
				}
			}
		}
		for name, kb := range rss {
			if name != last && kb > 0 {
				problems = append(problems, fmt.Sprintf("%s (not the active file) holds %d KiB resident", name, kb))
			}
		}
		if vlogs < 2 {
			problems = append(problems, fmt.Sprintf("only %d value log mappings", vlogs))
		}
		if len(problems) == 0 {
			return nil
		}
		// Advice is given by the committer between writes: keep writing.
		more()
		return errors.New(strings.Join(problems, "; "))
	})
}

// The value log file Badger appends to holds next to nothing resident as it
// grows: appends write it with pwrite and reads use pread, so nothing but
// its header is ever mapped in (the advisor gives it no advice to drop it).
func TestActiveValueLogStaysSmall(t *testing.T) {
	// About 24 MiB into one 64 MiB value log file.
	dir, db, _ := valueLogDB(t, 64<<20, 96)
	defer db.Close()
	vlogKB := 0
	for _, m := range smaps(t, dir) {
		if filepath.Ext(m.path) == ".vlog" {
			vlogKB += m.rssKB
		}
	}
	// Its header, and a little slack.
	if limit := 256; vlogKB > limit {
		t.Fatalf("value log mappings hold %d KiB resident after 24 MiB of appends, want at most %d KiB", vlogKB, limit)
	}
}

// The advisor gives only advice that is harmless whatever holds a range
// by the time it is given (Badger unmaps files at any time): never
// MADV_DONTNEED, which would zero whatever anonymous memory took the range
// since /proc/self/maps was read. Older value log files, which only
// Badger's own walks read through their mappings, get MADV_PAGEOUT; the
// newest, which nothing maps, none.
func TestOnlyHarmlessAdviceOnValueLogs(t *testing.T) {
	dir, db, _ := valueLogDB(t, 1<<20, 12)
	defer db.Close()
	names := map[mapping]string{}
	f, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	newest := ""
	for line := range strings.SplitSeq(string(f), "\n") {
		m, path, ok := parseMapsLine([]byte(line))
		if ok && filepath.Ext(path) == ".vlog" {
			names[m] = filepath.Base(path)
			if newerValueLog(names[m], newest) {
				newest = names[m]
			}
		}
	}
	if len(names) < 3 {
		t.Fatalf("%d value log mappings, want several", len(names))
	}
	a := newMapAdvisor(dir)
	given := map[string][]int{}
	a.advise = func(m mapping, advice int) {
		if name, ok := names[m]; ok {
			given[name] = append(given[name], advice)
		}
	}
	a.scan(time.Now().Add(trimEvery))
	for name, advice := range given {
		for _, v := range advice {
			if v != unix.MADV_RANDOM && v != unix.MADV_PAGEOUT {
				t.Errorf("%s: advice %d given, want only MADV_RANDOM and MADV_PAGEOUT", name, v)
			}
		}
		if pageout := slices.Contains(advice, unix.MADV_PAGEOUT); pageout != (name != newest) {
			t.Errorf("%s (newest %s): advice %v, want MADV_PAGEOUT on the older files only", name, newest, advice)
		}
	}
	paged := 0
	for name, advice := range given {
		if name != newest && slices.Contains(advice, unix.MADV_PAGEOUT) {
			paged++
		}
	}
	if older := len(names) - 1; paged != older {
		t.Errorf("MADV_PAGEOUT for %d of the %d older value log mappings", paged, older)
	}
}

// The patched Badger (third_party/badger/README.md) writes value log entries
// with pwrite, so appending maps none of the value log into the process: a
// copy through the mapping would leave every page written resident in it
// (nothing here advises the mapping; this is Badger alone). Reads through the
// mapping still see every byte written.
func TestValueLogIsWrittenWithoutTheMapping(t *testing.T) {
	dir := t.TempDir()
	bdb := vlogscanOpen(t, dir) // 1 MiB value log files
	defer bdb.Close()
	readBack := writeValueLog(t, bdb)
	// Each file's header is written through the mapping when the file is
	// created (a page for each of 8 or 9 files); 8 MiB written through it
	// would be 8192 KiB.
	if kb := valueLogResidentKB(t, dir); kb > 256 {
		t.Fatalf("value log mappings hold %d KiB resident after 8 MiB of appends: Badger copies values into the mapping; is go.mod's replace of Badger (third_party/badger) in effect?", kb)
	}
	readBack()
}

// Values are read from the value log with pread in the patched Badger
// (third_party/badger): reading them back faults none of their pages into
// the broker, where they would stay resident until paged out, out of the
// page cache too, and the next read of them would go to the disk.
func TestValueLogIsReadWithoutTheMapping(t *testing.T) {
	dir := t.TempDir()
	bdb := vlogscanOpen(t, dir)
	defer bdb.Close()
	readBack := writeValueLog(t, bdb)
	readBack()
	// 8 MiB read through the mapping would be 8192 KiB.
	if kb := valueLogResidentKB(t, dir); kb > 256 {
		t.Fatalf("value log mappings hold %d KiB resident after 8 MiB of values were read: Badger reads values through the mapping; is go.mod's replace of Badger (third_party/badger) in effect?", kb)
	}
}

// writeValueLog writes 8 MiB of 4 KiB values to bdb, 32 to a transaction,
// each transaction synced, and returns a function that reads every one back
// and checks it.
func writeValueLog(t *testing.T, bdb *badger.DB) (readBack func()) {
	t.Helper()
	const txns, perTxn, size = 64, 32, 4096
	value := func(i, j int) []byte {
		return bytes.Repeat([]byte{byte(i), byte(j), 0xa5}, size/3)
	}
	for i := range txns {
		txn := bdb.NewTransaction(true)
		for j := range perTxn {
			if err := txn.Set(fmt.Appendf(nil, "k%03d-%02d", i, j), value(i, j)); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := bdb.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		t.Helper()
		err := bdb.View(func(txn *badger.Txn) error {
			for i := range txns {
				for j := range perTxn {
					item, err := txn.Get(fmt.Appendf(nil, "k%03d-%02d", i, j))
					if err != nil {
						return err
					}
					got, err := item.ValueCopy(nil)
					if err != nil {
						return err
					}
					if !bytes.Equal(got, value(i, j)) {
						return fmt.Errorf("k%03d-%02d reads back %d bytes that differ from what was written", i, j, len(got))
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// valueLogResidentKB is what this process's mappings of the value log
// files under dir hold resident.
func valueLogResidentKB(t *testing.T, dir string) int {
	t.Helper()
	kb := 0
	for _, m := range smaps(t, dir) {
		if strings.HasSuffix(m.path, ".vlog") {
			kb += m.rssKB
		}
	}
	return kb
}

// A value log write that fails (here past RLIMIT_FSIZE, as on a full disk)
// gives its offset back in the patched Badger (third_party/badger): the
// transactions committed after it follow the last good entry and are still
// there after a reopen. With a gap, the open would cut the newest value log
// file at the gap, and every later value would read back empty.
func TestFailedValueLogWriteLeavesNoGap(t *testing.T) {
	dir := t.TempDir()
	open := func() *badger.DB {
		bdb, err := badger.Open(badger.DefaultOptions(dir).
			WithValueThreshold(vlogscanThreshold).
			WithValueLogFileSize(64 << 20). // no rotation in this test
			WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		return bdb
	}
	bdb := open()
	value := func(i, j int) []byte { return bytes.Repeat([]byte{byte(i), byte(j), 0x5a}, 4096/3) }
	commit := func(i int) error {
		txn := bdb.NewTransaction(true)
		defer txn.Discard()
		for j := range 16 { // 64 KiB of values
			if err := txn.Set(fmt.Appendf(nil, "k%03d-%02d", i, j), value(i, j)); err != nil {
				return err
			}
		}
		if err := txn.Commit(); err != nil {
			return err
		}
		return bdb.Sync()
	}
	var committed []int
	failed := -1
	// Badger's files were all created at open, sized past the limit, and
	// only the value log is written with write(2).
	withFileSizeLimit(t, 1<<20, func() {
		for i := range 32 {
			err := commit(i)
			if err == nil {
				committed = append(committed, i)
				continue
			}
			if !errors.Is(err, syscall.EFBIG) {
				t.Fatalf("transaction %d: %v, want EFBIG from the value log write", i, err)
			}
			failed = i
			return
		}
	})
	if failed < 0 {
		t.Fatal("no value log write failed past RLIMIT_FSIZE")
	}
	for i := failed + 1; i < failed+4; i++ {
		if err := commit(i); err != nil {
			t.Fatalf("transaction %d after the failed write: %v", i, err)
		}
		committed = append(committed, i)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	// A crash would not truncate the file to its end either; reopening
	// after Close finds the valid end the same way.
	bdb = open()
	defer bdb.Close()
	err := bdb.View(func(txn *badger.Txn) error {
		for _, i := range committed {
			for j := range 16 {
				item, err := txn.Get(fmt.Appendf(nil, "k%03d-%02d", i, j))
				if err != nil {
					return fmt.Errorf("k%03d-%02d: %w", i, j, err)
				}
				got, err := item.ValueCopy(nil)
				if err != nil {
					return fmt.Errorf("k%03d-%02d: %w", i, j, err)
				}
				if !bytes.Equal(got, value(i, j)) {
					return fmt.Errorf("k%03d-%02d, committed after a failed write at transaction %d, reads back %d bytes that differ from what was written", i, j, failed, len(got))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The patched Badger (third_party/badger) keeps the value log's encoding
// buffer between writes. A new buffer per write grew from empty to each
// entry's size: about twice the entry allocated and copied on every commit,
// a third of a broker's allocation under load.
func TestValueLogWriteKeepsItsBuffer(t *testing.T) {
	bdb := vlogscanOpen(t, t.TempDir())
	defer bdb.Close()
	value := bytes.Repeat([]byte{0xa5}, 256<<10)
	perCommit := allocPerCommit(t, bdb, 32, func(int) [][]byte { return [][]byte{value} })
	// The value itself is not copied on the way in (Badger keeps the
	// caller's slice until the commit is written); what a commit allocates
	// besides the buffer is small.
	if perCommit > uint64(len(value))/2 {
		t.Fatalf("a commit of a %d KiB value allocates %d KiB: the value log write allocates its buffer again; is go.mod's replace of Badger (third_party/badger) in effect?", len(value)>>10, perCommit>>10)
	}
	t.Logf("a commit of a %d KiB value allocates %d KiB", len(value)>>10, perCommit>>10)
}

// Requests near the transaction bound, of 3 and 3.5 MiB in turn, are
// encoded into the kept buffer in the patched Badger (third_party/badger):
// it was doubled past what it kept, dropped, and allocated and cleared
// again at the next request.
func TestValueLogWriteKeepsALargeBuffer(t *testing.T) {
	bdb := vlogscanOpen(t, t.TempDir())
	defer bdb.Close()
	value := bytes.Repeat([]byte{0x5a}, 256<<10)
	const small = 12 // values of a commit: 3 MiB, and 3.5 MiB in turn
	sizes := func(i int) [][]byte { return slices.Repeat([][]byte{value}, small+2*(i%2)) }
	perCommit := allocPerCommit(t, bdb, 16, sizes)
	if perCommit > small*uint64(len(value))/2 {
		t.Fatalf("a commit of 3 to 3.5 MiB allocates %d KiB: the value log write allocates its buffer again; is go.mod's replace of Badger (third_party/badger) in effect?", perCommit>>10)
	}
	t.Logf("a commit of 3 to 3.5 MiB allocates %d KiB", perCommit>>10)
}

// allocPerCommit commits values(i) in transaction i, twice over to let the
// buffer grow, then commits more times and returns what each allocated.
func allocPerCommit(t *testing.T, bdb *badger.DB, commits int, values func(i int) [][]byte) uint64 {
	t.Helper()
	commit := func(i int) {
		txn := bdb.NewTransaction(true)
		defer txn.Discard()
		for j, v := range values(i) {
			if err := txn.Set(fmt.Appendf(nil, "k%03d-%02d", i, j), v); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	commit(0)
	commit(1)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range commits {
		commit(2 + i)
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(commits)
}

// writeSyscalls is how many write system calls (write, pwrite, ...) this
// process has made: syscw of /proc/self/io.
func writeSyscalls(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no syscw in /proc/self/io:\n%s", data)
	return 0
}

// A group commit of many small segments (a producer spread over many
// streams) is one Badger transaction; its values go to the value log in one
// write, not one system call each, and each is read back from where its
// pointer says (third_party/badger-patches/0004).
func TestValueLogWritesAGroupInOneSystemCall(t *testing.T) {
	bdb := vlogscanOpen(t, t.TempDir())
	defer bdb.Close()
	const entries = 64
	value := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 1024+i) }
	before := writeSyscalls(t)
	txn := bdb.NewTransaction(true)
	defer txn.Discard()
	for i := range entries {
		if err := txn.Set(fmt.Appendf(nil, "k%03d", i), value(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := txn.Commit(); err != nil {
		t.Fatal(err)
	}
	writes := writeSyscalls(t) - before
	// The value log write, and whatever else of the process wrote
	// meanwhile (the memtable's write-ahead log is a mapping, no write).
	if writes >= entries/4 {
		t.Fatalf("a commit of %d values above the value threshold made %d write system calls: one per value; is go.mod's replace of Badger (third_party/badger) in effect?", entries, writes)
	}
	t.Logf("a commit of %d values made %d write system calls", entries, writes)
	err := bdb.View(func(txn *badger.Txn) error {
		for i := range entries {
			item, err := txn.Get(fmt.Appendf(nil, "k%03d", i))
			if err != nil {
				return err
			}
			got, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, value(i)) {
				return fmt.Errorf("k%03d: %d bytes read back, not the %d written", i, len(got), len(value(i)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
