package storage

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
)

// TestOpenAfterAPowerLossBeforeTheFirstWrite builds, from a real store,
// every state a power loss can leave Badger's newest log files in when it
// came after an open and before the first write (the open created them,
// nothing synced them): an empty, short, zero-filled or missing newest
// write-ahead log (.mem) or value log (.vlog), and both empty at once. The
// store must open from each, on the same boot and on a new one (the
// recovery path, torn.go), keep every record that was durable before, and
// take appends.
func TestOpenAfterAPowerLossBeforeTheFirstWrite(t *testing.T) {
	boot := filepath.Join(t.TempDir(), "boot_id")
	setBoot := func(id string) {
		t.Helper()
		if err := os.WriteFile(boot, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(dir string) (*DB, error) {
		return Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, BootIDPath: boot})
	}
	setBoot("boot-1")

	// The durable records: small ones (in the LSM tree) and large ones (in
	// the value log), then a clean close.
	src := t.TempDir()
	db, err := open(src)
	if err != nil {
		t.Fatal(err)
	}
	s := ownerStream(t, db, "s", 1)
	want := mustAppend(t, s, 1, recs("small", 5))
	want = append(want, mustAppend(t, s, 1, sizedRecs("large", 5, 4096))...)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// The open creates a new memtable log and value log file, which
	// nothing synced before the power loss; the copy is taken while it is
	// open, so it holds them as the page cache did.
	db, err = open(src)
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	copyStoreFiles(t, src, base)
	if err := db.Close(); err != nil {
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
		{"short .mem", []change{{mem, truncate(badgerLogHeaderBytes - 1)}}},
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
				setBoot("boot-1")
				if newBoot {
					// A machine that lost power boots again.
					defer setBoot("boot-1")
					setBoot("boot-2")
				}
				dir := t.TempDir()
				copyStoreFiles(t, base, dir)
				for _, c := range tc.changes {
					c.do(t, filepath.Join(dir, c.file))
				}
				db, err := open(dir)
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				s := openStream(t, db, "s")
				sameRecords(t, "after the power loss", mustRead(t, s, 0, 0), want)
				more := mustAppend(t, s, 1, sizedRecs("after", 3, 4096))
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
				db, err = open(dir)
				if err != nil {
					t.Fatalf("Open after the appends: %v", err)
				}
				defer db.Close()
				sameRecords(t, "after the appends", mustRead(t, openStream(t, db, "s"), 0, 0), append(slices.Clone(want), more...))
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
