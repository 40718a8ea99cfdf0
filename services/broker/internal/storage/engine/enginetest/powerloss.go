// Package enginetest plays a machine crash on copies of a log engine's
// store, for the tests of package engine and of the stream-copy model on
// it (package storage): a crashed copy holds the value log files as the
// disk held them at a chosen moment (what the last fsync covered) and
// every other file as the page cache held it later (the kernel wrote the
// write-ahead log back, not the values), the state the engine's recovery
// is for (engine/doc.go, "What Open guarantees after a power loss"). It
// does not import the engine, so the engine's own tests can use it.
package enginetest

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// LogHeaderBytes is the header of Badger's write-ahead log and value log
// files: the encryption key id (8 bytes) and IV (12). Spelled out here
// rather than taken from the engine, so a wrong constant there fails.
const LogHeaderBytes = 20

// VlogFiles lists the value log files in dir, in Badger's order.
func VlogFiles(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".vlog") {
			out = append(out, e.Name())
		}
	}
	return out
}

// ValueLogs reads the value log files of dir: what the disk holds of them
// once the last fsync returned.
func ValueLogs(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range VlogFiles(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}

// HeaderOnly returns the value log files of dir as a power loss now would
// leave them if everything since onDisk was read (ValueLogs) had not
// reached the disk: files in onDisk as they were, files made since with
// their header only.
func HeaderOnly(t testing.TB, dir string, onDisk map[string][]byte) map[string][]byte {
	t.Helper()
	out := ValueLogs(t, dir)
	for name, b := range out {
		if old, ok := onDisk[name]; ok {
			out[name] = old
			continue
		}
		nb := make([]byte, len(b))
		copy(nb, b[:LogHeaderBytes])
		out[name] = nb
	}
	return out
}

// CrashCopy copies dir, the store of an open engine, into a new directory
// as the page cache holds it now, then puts back the value log files as
// vlogs held them: files made since are left empty. Badger may flush or
// remove a file meanwhile (a replayed memtable, on a recovery's open): the
// copy is made again until the directory held the same files before and
// after it.
func CrashCopy(t testing.TB, dir string, vlogs map[string][]byte) string {
	t.Helper()
	list := func() []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			if !e.IsDir() {
				names = append(names, e.Name())
			}
		}
		return names
	}
	for range 100 {
		out := t.TempDir()
		names := list()
		whole := true
		for _, name := range names {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if errors.Is(err, fs.ErrNotExist) {
				whole = false
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(name, ".vlog") {
				b = vlogs[name] // nil: none of it reached the disk
			}
			if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if whole && slices.Equal(names, list()) {
			return out
		}
	}
	t.Fatal("the store's files kept changing under the copy")
	return ""
}

// TearFirstWriteBack opens dir with open, whose recovery must write back,
// and returns a copy of dir as a power loss right after that first write
// back committed, before its fsync, leaves it: the write-ahead log written
// back, the value log not. beforeSync is the engine's
// Hooks.BeforeWriteBackSync of that open; it is cleared again.
func TearFirstWriteBack(t testing.TB, dir string, beforeSync *func(), open func() io.Closer) string {
	t.Helper()
	onDisk := ValueLogs(t, dir)
	var crashed string
	*beforeSync = func() {
		if crashed == "" {
			crashed = CrashCopy(t, dir, HeaderOnly(t, dir, onDisk))
		}
	}
	c := open()
	*beforeSync = nil
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if crashed == "" {
		t.Fatal("the recovery wrote nothing")
	}
	return crashed
}

// GCMarkerFile is the engine's marker of a value log GC rewrite not yet
// durable (engine/vlog.go), spelled out here so that a renamed file, which
// an upgraded broker would not find, fails the tests.
const GCMarkerFile = "STRAND_VLOG_GC"

// CrashDuringGC runs gc, a value log GC round of the open engine in dir,
// and returns a copy of dir as a power loss right after Badger's rewrite,
// before its sync, leaves it: the moved values' new pointers written back,
// the values not. afterRewrite is the engine's Hooks.AfterGCRewrite; it is
// cleared again. It fails t unless the GC rewrote a file, the copy holds
// the GC's marker and dir no longer does.
func CrashDuringGC(t testing.TB, dir string, afterRewrite *func(), gc func() error) string {
	t.Helper()
	onDisk := ValueLogs(t, dir)
	var crashed string
	*afterRewrite = func() { crashed = CrashCopy(t, dir, onDisk) }
	err := gc()
	*afterRewrite = nil
	if err != nil {
		t.Fatalf("value log GC: %v", err)
	}
	if crashed == "" {
		t.Fatal("the GC rewrote nothing")
	}
	if _, err := os.Stat(filepath.Join(dir, GCMarkerFile)); err == nil {
		t.Fatal("the GC marker outlived a durable rewrite")
	}
	if _, err := os.Stat(filepath.Join(crashed, GCMarkerFile)); err != nil {
		t.Fatalf("no GC marker while the rewrite was not durable: %v", err)
	}
	return crashed
}
