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
//     read a few GiB through Badger's mappings shows GiBs of RSS although
//     only Badger's caches and memtables are its own. Appends and readers
//     of the value log map nothing (pwrite, pread), so what is left to
//     clear is what Badger's own walks fault in: the value log GC's and the
//     open's over older value log files, and compactions' over tables
//     (tables hold keys and value pointers only). Every trimEvery those
//     get MADV_PAGEOUT (see scan), which keeps the resident set flat as
//     streams grow.
//
// Both are advice: they change no data and no durability, and both are
// harmless whatever holds a range by the time it is given. That matters:
// Badger unmaps files at any time (the value log GC's deletions are
// deferred to whichever reader closes the last iterator, tables go with
// compactions), so a range read from /proc/self/maps may hold another
// mapping, or anonymous memory, by the time the advice reaches it.
// MADV_RANDOM only turns read-around off, and MADV_PAGEOUT reclaims pages
// without discarding data (file pages are written back or read back
// later, anonymous ones swapped out or kept). MADV_DONTNEED is never
// given: on anonymous memory it discards the data, and nothing here needs
// it (the file Badger appends to is written with pwrite, so nothing maps
// its pages to drop).

const (
	// adviseEveryBytes: how much may be committed before the mappings are
	// looked at again (a new .mem file appears every memtable's worth of
	// writes, a new .vlog every value log file). Each look reads
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
		newest     mapping
		newestName string
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
		// Older files get MADV_PAGEOUT: what the GC's or the open's walk
		// faulted in (they were synced when Badger moved on from them, so
		// their pages are clean). The file Badger appends to (the newest)
		// needs none: nothing maps its pages but its header's.
		if name := filepath.Base(path); newerValueLog(name, newestName) {
			if newestName != "" && trim {
				a.advise(newest, unix.MADV_PAGEOUT)
			}
			newest, newestName = m, name
		} else if trim {
			a.advise(m, unix.MADV_PAGEOUT)
		}
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
