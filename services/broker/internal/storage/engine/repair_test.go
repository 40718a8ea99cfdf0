package engine

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/services/broker/internal/storage/engine/enginetest"
)

// TestOpenAfterAPowerLossBeforeTheFirstWrite builds, from a real store,
// every state a power loss can leave Badger's newest log files in when it
// came after an open and before the first write (the open created them,
// nothing synced them): an empty, short, zero-filled or missing newest
// write-ahead log (.mem) or value log (.vlog), and both empty at once
// (doc.go, "What Open guarantees after a power loss"; repair.go). The
// engine must open from each, on the same boot and on a new one (the
// recovery path, torn.go), keep every batch that was durable before, and
// take batches.
func TestOpenAfterAPowerLossBeforeTheFirstWrite(t *testing.T) {
	boot := filepath.Join(t.TempDir(), "boot_id")
	open := func(dir string) (*Engine, error) {
		e, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, BootIDPath: boot})
		if err == nil {
			err = e.Settle()
		}
		return e, err
	}
	writeBoot(t, boot, "boot-1")

	// The durable batches: small values (in the LSM tree) and large ones
	// (in the value log), then a clean close.
	src := t.TempDir()
	e, err := open(src)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := e.Do(t.Context(), ledgerBatch("p", 0, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// The open creates a new memtable log and value log file, which
	// nothing synced before the power loss; the copy is taken while it is
	// open, so it holds them as the page cache did.
	e, err = open(src)
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	copyStoreFiles(t, src, base)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	mem, vlog := newestFile(t, base, ".mem"), newestFile(t, base, ".vlog")

	truncate := func(size int64) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			if err := os.Truncate(path, size); err != nil {
				t.Fatal(err)
			}
		}
	}
	zero := func(t *testing.T, path string) {
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		truncate(0)(t, path)
		truncate(info.Size())(t, path)
	}
	remove := func(t *testing.T, path string) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	type change struct {
		file string
		do   func(t *testing.T, path string)
	}
	cases := []struct {
		name    string
		changes []change
	}{
		{"empty .mem", []change{{mem, truncate(0)}}},
		{"short .mem", []change{{mem, truncate(enginetest.LogHeaderBytes - 1)}}},
		{"zero-filled .mem", []change{{mem, zero}}},
		{"missing .mem", []change{{mem, remove}}},
		{"empty .vlog", []change{{vlog, truncate(0)}}},
		{"short .vlog", []change{{vlog, truncate(7)}}},
		{"zero-filled .vlog", []change{{vlog, zero}}},
		{"missing .vlog", []change{{vlog, remove}}},
		{"empty .mem and .vlog", []change{{mem, truncate(0)}, {vlog, truncate(0)}}},
	}
	for _, tc := range cases {
		for _, newBoot := range []bool{false, true} {
			name := tc.name + "/same boot"
			if newBoot {
				name = tc.name + "/new boot"
			}
			t.Run(name, func(t *testing.T) {
				writeBoot(t, boot, "boot-1")
				if newBoot {
					// A machine that lost power boots again.
					defer writeBoot(t, boot, "boot-1")
					writeBoot(t, boot, "boot-2")
				}
				dir := t.TempDir()
				copyStoreFiles(t, base, dir)
				for _, c := range tc.changes {
					c.do(t, filepath.Join(dir, c.file))
				}
				e, err := open(dir)
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if n := checkLedger(t, e, "p", 0); n != 1 {
					_ = e.Close()
					t.Fatalf("after the power loss: latest batch %d, want 1", n)
				}
				for i := 2; i < 5; i++ {
					if err := e.Do(t.Context(), ledgerBatch("p", 0, i)); err != nil {
						_ = e.Close()
						t.Fatal(err)
					}
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				e, err = open(dir)
				if err != nil {
					t.Fatalf("Open after the writes: %v", err)
				}
				defer e.Close()
				if n := checkLedger(t, e, "p", 0); n != 4 {
					t.Fatalf("after the writes: latest batch %d, want 4", n)
				}
			})
		}
	}
}

// copyStoreFiles copies the files of the store in from (open or not, but
// for its lock) into to.
func copyStoreFiles(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "LOCK" {
			continue
		}
		if err := copyFile(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(from, to string) (err error) {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = io.Copy(out, in)
	return err
}

// newestFile names the file of dir with the highest number and suffix
// ext (Badger numbers its log files in creation order, zero-padded).
func newestFile(t *testing.T, dir, ext string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ext) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		t.Fatalf("no %s file in %s", ext, dir)
	}
	slices.Sort(names)
	return names[len(names)-1]
}
