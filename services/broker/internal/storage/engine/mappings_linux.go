package engine

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Badger maps its write-ahead logs (.mem), value log (.vlog) and tables
// (.sst) into memory. It writes the write-ahead logs through the mapping;
// the value log it writes with pwrite (a patch in third_party/badger, which
// took page faults and per-page TLB shootdowns at every fsync off the append
// path) and, for a reader, reads with pread (another: pages a reader
// faulted in stayed mapped until paged out below, out of the page cache
// too, so a rejoin reading what a follower missed went to the disk a page
// at a time); only Badger's own walks over a value log file, the open's
// replay and the value log GC, read through the mapping. Two kernel
// behaviours make mappings costly for a store that appends and fsyncs small
// batches, and the advisor below, run by the committer, counters both on
// the mappings of this store's files:
//
//   - A fault on a file mapping reads around the faulting page, by the
//     device's readahead window, and the page cache may hold the file in
//     large folios. A folio is dirtied and written back whole, so an fsync
//     after a 64 KiB append can write megabytes (seen: 400-700 MB/s of
//     device writes for 30 MB/s of records on ext4 with an 8 MiB
//     readahead). MADV_RANDOM turns the read-around off for the mapping, so
//     faults bring in single pages and an fsync writes what changed.
//   - Pages of a file mapping stay mapped, and counted in the broker's
//     resident memory, until the kernel needs them back: a broker that has
//     written a few GiB of value log shows GiBs of RSS although only
//     Badger's caches and memtables are its own. MADV_DONTNEED on the
//     value log mappings drops them from the broker's page tables (the
//     page cache keeps them, so a later read faults them back cheaply),
//     which keeps the resident set flat as streams grow: what stays is the
//     memtables, what was appended or read since the last look (every
//     adviseEveryBytes written, at least every lookEvery), and the table
//     pages read since the last trim (tables hold keys and value pointers
//     only, and are paged out, see scan). The file Badger appends to is
//     dropped at every look too, not only once Badger moves on from it:
//     dropping a whole 64 MiB file's pages at once took the committer
//     3-15 ms (page table teardown), a stall every publish felt; a few MiB
//     at a time costs a fraction of a millisecond. Appends and readers map
//     nothing (pwrite, pread); what the drop clears is what the value log
//     GC's walk faulted in.
//
// Both are advice: they change no data and no durability. MADV_DONTNEED on
// a shared file mapping never discards data; dirty pages stay in the page
// cache for writeback. It would discard data on anonymous memory, though,
// so it is only given where no other mapping can have taken the range
// since /proc/self/maps was read: on the value log file Badger appends to
// (the newest), which Badger moves only while writing (rotation), and the
// advisor runs on the committer, between its writes, holding vlog.mu, which
// the value log GC, the other writer, also holds; the GC never rewrites,
// so never deletes, the newest file. Older value log files are unmapped by
// the GC's deletions, which Badger defers to whichever reader closes the
// last iterator, at any time; they, tables and memtables only get advice
// that is harmless whatever the range holds: MADV_RANDOM, and MADV_PAGEOUT
// for tables and older value log files (see scan).

const (
	// adviseEveryBytes: how much may be committed before the mappings are
	// looked at again (a new .mem file appears every memtable's worth of
	// writes, a new .vlog every value log file) and the active value log
	// file is dropped from the resident set. Each look reads
	// /proc/self/maps.
	adviseEveryBytes = 4 << 20
)

type mapAdvisor struct {
	dir      string // absolute, symlinks resolved, as /proc/self/maps shows it
	advised  map[mapping]bool
	written  int
	lastLook time.Time
	lastTrim time.Time
	// advise gives advice; madvise but in tests.
	advise func(m mapping, advice int)
}

type mapping struct {
	start, end uintptr
	inode      uint64
}

func newMapAdvisor(dir string) *mapAdvisor {
	abs, err := filepath.Abs(dir)
	if err == nil {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
	}
	a := &mapAdvisor{dir: abs + string(filepath.Separator), advised: map[mapping]bool{}, advise: madvise}
	a.scan(time.Now())
	return a
}

// wrote is called by the committer before each write with its size.
func (a *mapAdvisor) wrote(n int) {
	a.written += n
	now := time.Now()
	if a.written < adviseEveryBytes && now.Sub(a.lastLook) < lookEvery {
		return
	}
	a.scan(now)
}

func (a *mapAdvisor) scan(now time.Time) {
	a.written = 0
	a.lastLook = now
	trim := now.Sub(a.lastTrim) >= trimEvery
	if trim {
		a.lastTrim = now
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	var (
		active     mapping
		activeName string
	)
	seen := make(map[mapping]bool, len(a.advised))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, path, ok := parseMapsLine(sc.Bytes())
		if !ok || !strings.HasPrefix(path, a.dir) {
			continue
		}
		ext := filepath.Ext(path)
		if ext != ".vlog" && ext != ".mem" && ext != ".sst" {
			continue
		}
		seen[m] = true
		if ext == ".sst" {
			// Tables are written whole and read in order by
			// compactions: read-around helps them. Badger unmaps them
			// at any time, so they only get advice that is harmless to
			// whatever may have taken the range since: MADV_PAGEOUT
			// reclaims pages without discarding data (a table's pages
			// are clean and are read back from disk when needed;
			// anonymous pages are swapped out or kept), which keeps
			// tables, which grow with the log, out of the resident set.
			if trim {
				a.advise(m, unix.MADV_PAGEOUT)
			}
			continue
		}
		if !a.advised[m] {
			a.advised[m] = true
			a.advise(m, unix.MADV_RANDOM)
		}
		if ext != ".vlog" {
			continue
		}
		if name := filepath.Base(path); newerValueLog(name, activeName) {
			if activeName != "" && trim {
				a.advise(active, unix.MADV_PAGEOUT)
			}
			active, activeName = m, name
		} else if trim {
			// An older file: only what readers faulted back in is
			// resident (it was synced when Badger moved on from it, so
			// its pages are clean), and it may be unmapped at any time.
			a.advise(m, unix.MADV_PAGEOUT)
		}
	}
	// The file Badger appends to is dropped at every look, so little is
	// mapped when Badger moves on from it.
	if activeName != "" {
		a.advise(active, unix.MADV_DONTNEED)
	}
	for m := range a.advised {
		if !seen[m] {
			delete(a.advised, m)
		}
	}
}

// newerValueLog reports whether value log file name a (Badger's %06d.vlog,
// wider past a million files) is newer than b; any name is newer than "".
func newerValueLog(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a > b
}

// parseMapsLine reads "start-end perms offset dev inode path".
func parseMapsLine(line []byte) (mapping, string, bool) {
	fields := bytes.Fields(line)
	if len(fields) < 6 {
		return mapping{}, "", false
	}
	rng := bytes.SplitN(fields[0], []byte("-"), 2)
	if len(rng) != 2 {
		return mapping{}, "", false
	}
	start, err1 := strconv.ParseUint(string(rng[0]), 16, 64)
	end, err2 := strconv.ParseUint(string(rng[1]), 16, 64)
	inode, err3 := strconv.ParseUint(string(fields[4]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || end <= start {
		return mapping{}, "", false
	}
	return mapping{start: uintptr(start), end: uintptr(end), inode: inode}, string(bytes.Join(fields[5:], []byte(" "))), true
}

// madvise advises a range of this process's address space by address: the
// mapping belongs to Badger, which holds the slice, so no Go pointer to it
// exists here. Errors (the file was unmapped since the scan) are ignored:
// the advice is only an optimisation.
func madvise(m mapping, advice int) {
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, m.start, m.end-m.start, uintptr(advice))
}
