package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/y"
)

// vlogscanBadgerVersion is the Badger whose value log format vlogscan.go
// mirrors. When go.mod moves Badger, re-read the code vlogscan.go names and
// update this.
const vlogscanBadgerVersion = "v4.9.6"

const vlogscanThreshold = 64

// vlogscanOpen opens a real Badger in dir whose values above 64 bytes live
// in 1 MiB value log files.
func vlogscanOpen(t *testing.T, dir string) *badger.DB {
	t.Helper()
	bdb, err := badger.Open(badger.DefaultOptions(dir).
		WithValueThreshold(vlogscanThreshold).
		WithValueLogFileSize(1 << 20).
		WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	return bdb
}

// vlogscanFiles reads every value log file in dir, by file id.
func vlogscanFiles(t *testing.T, dir string) map[uint32][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := make(map[uint32][]byte)
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".vlog")
		if !ok {
			continue
		}
		fid, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[uint32(fid)] = b
	}
	return files
}

// vlogscanLoc is where an entry's key and value lie in a value log file.
type vlogscanLoc struct {
	fid uint32
	off int // of the key
}

// vlogscanLocate finds, independently of the code under test, the file (the
// highest one) and offset holding versioned key vk right before value.
func vlogscanLocate(files map[uint32][]byte, vk, value []byte) (vlogscanLoc, bool) {
	kv := append(slices.Clip(vk), value...)
	for _, fid := range slices.Backward(slices.Sorted(maps.Keys(files))) {
		if off := bytes.Index(files[fid], kv); off >= 0 {
			return vlogscanLoc{fid, off}, true
		}
	}
	return vlogscanLoc{}, false
}

// vlogscanCompare fails unless got holds exactly want.
func vlogscanCompare(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: key %q (version %d) missing", what, y.ParseKey([]byte(k)), y.ParseTs([]byte(k)))
		case !bytes.Equal(g, v):
			t.Errorf("%s: key %q (version %d): got %d bytes, want %d bytes, not equal",
				what, y.ParseKey([]byte(k)), y.ParseTs([]byte(k)), len(g), len(v))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: key %q (version %d) found, want absent", what, y.ParseKey([]byte(k)), y.ParseTs([]byte(k)))
		}
	}
}

// vlogscanEntry is one entry written to a real Badger: its versioned key
// and value.
type vlogscanEntry struct {
	vk, value []byte
}

// vlogscanWrite writes to a real Badger in dir: 80 keys in one transaction,
// then 400 keys in a transaction each, 4 KiB values, so more than one value
// log file. It returns the entries in write order, with their versions read
// back from Badger.
func vlogscanWrite(t *testing.T, dir string, rng *rand.Rand) []vlogscanEntry {
	t.Helper()
	bdb := vlogscanOpen(t, dir)
	defer bdb.Close()
	val := func() []byte {
		b := make([]byte, 4<<10)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	values := make(map[string][]byte)
	var keys []string
	if err := bdb.Update(func(txn *badger.Txn) error {
		for i := range 80 {
			k := fmt.Sprintf("batch/%03d", i)
			keys, values[k] = append(keys, k), val()
			if err := txn.Set([]byte(k), values[k]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 400 {
		k := fmt.Sprintf("single/%03d", i)
		keys, values[k] = append(keys, k), val()
		if err := bdb.Update(func(txn *badger.Txn) error { return txn.Set([]byte(k), values[k]) }); err != nil {
			t.Fatal(err)
		}
	}
	var out []vlogscanEntry
	if err := bdb.View(func(txn *badger.Txn) error {
		for _, k := range keys {
			item, err := txn.Get([]byte(k))
			if err != nil {
				return err
			}
			out = append(out, vlogscanEntry{versionedKey([]byte(k), item.Version()), values[k]})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// vlogscanWant returns the versioned keys of entries, for valueLogEntries.
func vlogscanWant(entries []vlogscanEntry, more ...[]byte) map[string]struct{} {
	want := make(map[string]struct{})
	for _, e := range entries {
		want[string(e.vk)] = struct{}{}
	}
	for _, vk := range more {
		want[string(vk)] = struct{}{}
	}
	return want
}

func TestValueLogEntriesBadgerVersion(t *testing.T) {
	// The module's go.mod, above the package dir go test runs in.
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod found")
		}
		dir = parent
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var versions, replaced []string
	for line := range strings.Lines(string(mod)) {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) == 4 && f[0] == "replace" && f[1] == "github.com/dgraph-io/badger/v4" && f[2] == "=>" {
			replaced = append(replaced, f[3])
			continue
		}
		if len(f) >= 2 && f[0] == "github.com/dgraph-io/badger/v4" {
			versions = append(versions, strings.Join(f[1:], " "))
		}
	}
	if len(versions) != 1 || versions[0] != vlogscanBadgerVersion {
		t.Fatalf("go.mod has Badger %q; vlogscan.go mirrors %s's value log format: re-read it against the new version",
			versions, vlogscanBadgerVersion)
	}
	// The build uses the patched copy go.mod replaces Badger with
	// (third_party/badger/README.md), which must be of the same version.
	if len(replaced) != 1 {
		t.Fatalf("go.mod replaces Badger with %q, want the one patched copy", replaced)
	}
	readme, err := os.ReadFile(filepath.Join(dir, replaced[0], "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(readme), "\n"); !strings.Contains(first, "Badger "+vlogscanBadgerVersion+",") {
		t.Fatalf("go.mod requires Badger %s but replaces it with %s, whose README begins %q", vlogscanBadgerVersion, replaced[0], first)
	}
}

func TestValueLogEntriesVersionedKey(t *testing.T) {
	vk := versionedKey([]byte("abc"), 7)
	want := append([]byte("abc"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf8)
	if !bytes.Equal(vk, want) || !bytes.Equal(vk, y.KeyWithTs([]byte("abc"), 7)) {
		t.Fatalf("versionedKey = %x, want %x", vk, want)
	}
	if y.ParseTs(vk) != 7 || string(y.ParseKey(vk)) != "abc" {
		t.Fatalf("ParseTs/ParseKey(%x) = %d, %q", vk, y.ParseTs(vk), y.ParseKey(vk))
	}
}

func TestValueLogEntries(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	live := vlogscanWrite(t, dir, rng)

	// An overwritten key, a deleted one, an expired one, a small one (kept
	// in the LSM, not the value log).
	bdb := vlogscanOpen(t, dir)
	big := func(s string) []byte { return bytes.Repeat([]byte(s), 100) }
	set := func(e *badger.Entry) {
		t.Helper()
		if err := bdb.Update(func(txn *badger.Txn) error { return txn.SetEntry(e) }); err != nil {
			t.Fatal(err)
		}
	}
	set(badger.NewEntry([]byte("over"), big("old-")))
	set(badger.NewEntry([]byte("over"), big("new-")))
	set(badger.NewEntry([]byte("gone"), big("gone")))
	if err := bdb.Update(func(txn *badger.Txn) error { return txn.Delete([]byte("gone")) }); err != nil {
		t.Fatal(err)
	}
	expired := badger.NewEntry([]byte("expired"), big("exp-"))
	expired.ExpiresAt = 1
	set(expired)
	set(badger.NewEntry([]byte("small"), []byte("tiny")))

	versions := make(map[string][]uint64) // newest first
	deleted := make(map[string]bool)      // by versioned key
	if err := bdb.View(func(txn *badger.Txn) error {
		for _, k := range []string{"over", "small"} {
			item, err := txn.Get([]byte(k))
			if err != nil {
				return err
			}
			versions[k] = append(versions[k], item.Version())
		}
		it := txn.NewIterator(badger.IteratorOptions{AllVersions: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k := string(item.Key())
			if k == "small" || (k == "over" && item.Version() == versions[k][0]) {
				continue
			}
			versions[k] = append(versions[k], item.Version())
			deleted[string(versionedKey(item.Key(), item.Version()))] = item.IsDeletedOrExpired()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	if len(versions["over"]) != 2 || len(versions["gone"]) != 2 || len(versions["expired"]) != 1 ||
		!deleted[string(versionedKey([]byte("gone"), versions["gone"][0]))] ||
		deleted[string(versionedKey([]byte("gone"), versions["gone"][1]))] ||
		!deleted[string(versionedKey([]byte("expired"), versions["expired"][0]))] {
		t.Fatalf("versions %v, deleted %v", versions, deleted)
	}
	vk := func(k string, i int) []byte { return versionedKey([]byte(k), versions[k][i]) }

	present := slices.Clone(live)
	present = append(present,
		vlogscanEntry{vk("over", 0), big("new-")},
		vlogscanEntry{vk("over", 1), big("old-")},
		// The version before the delete is a plain entry in the value log.
		vlogscanEntry{vk("gone", 1), big("gone")})
	absent := [][]byte{
		vk("gone", 0),    // the delete: no value, not in the value log
		vk("expired", 0), // in the value log, but expired
		vk("small", 0),   // below the value threshold
		versionedKey([]byte("never"), 1),
		versionedKey([]byte("single/000"), y.ParseTs(live[80].vk)+1000),
		y.ParseKey(live[0].vk), // a user key without its version
	}
	want := vlogscanWant(present, absent...)

	files := vlogscanFiles(t, dir)
	// Where each entry is, found independently.
	locs := make(map[string]vlogscanLoc)
	used := make(map[uint32]bool)
	for _, e := range present {
		loc, ok := vlogscanLocate(files, e.vk, e.value)
		if !ok {
			t.Fatalf("entry %q version %d not in any value log file", y.ParseKey(e.vk), y.ParseTs(e.vk))
		}
		locs[string(e.vk)], used[loc.fid] = loc, true
	}
	if _, ok := vlogscanLocate(files, vk("expired", 0), big("exp-")); !ok {
		t.Fatal("the expired entry is not in the value log: the test proves nothing about it")
	}
	if len(used) < 2 {
		t.Fatalf("entries in %d value log file(s) %v, want at least 2", len(used), slices.Sorted(maps.Keys(files)))
	}
	t.Logf("value log files %v, entries in %v", slices.Sorted(maps.Keys(files)), slices.Sorted(maps.Keys(used)))

	wantAll := make(map[string][]byte)
	for _, e := range present {
		wantAll[string(e.vk)] = e.value
	}
	got, err := valueLogEntries(dir, math.MaxUint32, want)
	if err != nil {
		t.Fatal(err)
	}
	vlogscanCompare(t, "all files", got, wantAll)

	// belowFid: only the files below it.
	maxFid := slices.Max(slices.Collect(maps.Keys(files)))
	for below := uint32(0); below <= maxFid+1; below++ {
		wantBelow := make(map[string][]byte)
		for _, e := range present {
			if locs[string(e.vk)].fid < below {
				wantBelow[string(e.vk)] = e.value
			}
		}
		got, err := valueLogEntries(dir, below, want)
		if err != nil {
			t.Fatal(err)
		}
		vlogscanCompare(t, fmt.Sprintf("belowFid %d", below), got, wantBelow)
	}

	// Values are copies: changing one changes nothing else.
	for k := range got {
		got[k][0] ^= 0xff
	}
	again, err := valueLogEntries(dir, math.MaxUint32, want)
	if err != nil {
		t.Fatal(err)
	}
	vlogscanCompare(t, "after changing returned values", again, wantAll)
}

func TestValueLogEntriesTornEntry(t *testing.T) {
	src := t.TempDir()
	entries := vlogscanWrite(t, src, rand.New(rand.NewPCG(3, 4)))
	files := vlogscanFiles(t, src)
	locs := make(map[string]vlogscanLoc)
	count := make(map[uint32]int)
	for _, e := range entries {
		loc, ok := vlogscanLocate(files, e.vk, e.value)
		if !ok {
			t.Fatalf("entry %q not in any value log file", y.ParseKey(e.vk))
		}
		locs[string(e.vk)] = loc
		count[loc.fid]++
	}
	if len(count) < 2 {
		t.Fatalf("entries in %d value log file(s), want at least 2", len(count))
	}
	// Damage the middle entry of the first file.
	fid := slices.Min(slices.Collect(maps.Keys(count)))
	var inFid []vlogscanEntry
	for _, e := range entries {
		if locs[string(e.vk)].fid == fid {
			inFid = append(inFid, e)
		}
	}
	slices.SortFunc(inFid, func(a, b vlogscanEntry) int { return locs[string(a.vk)].off - locs[string(b.vk)].off })
	victim := inFid[len(inFid)/2]
	at := locs[string(victim.vk)].off
	keyEnd := at + len(victim.vk)
	crcAt := keyEnd + len(victim.value)
	// The entry's header is right before its key: meta, userMeta, then
	// uvarint lengths, and expiresAt 0 (one byte).
	var hdr [2 + 3*binary.MaxVarintLen64]byte
	n := 2
	n += binary.PutUvarint(hdr[n:], uint64(len(victim.vk)))
	n += binary.PutUvarint(hdr[n:], uint64(len(victim.value)))
	n += binary.PutUvarint(hdr[n:], 0)
	hdrAt := at - n
	if raw := files[fid]; !bytes.Equal(raw[hdrAt+2:at], hdr[2:n]) {
		t.Fatalf("header before the key: %x, want %x", raw[hdrAt+2:at], hdr[2:n])
	}
	t.Logf("damaging entry %d of %d in file %d (%d entries there)", len(inFid)/2, len(inFid), fid, count[fid])

	for _, tc := range []struct {
		name   string
		damage func(path string) error
	}{
		{"value byte", func(path string) error { return vlogscanFlip(path, keyEnd+len(victim.value)/2) }},
		{"key byte", func(path string) error { return vlogscanFlip(path, at+1) }},
		{"last key byte (version)", func(path string) error { return vlogscanFlip(path, keyEnd-1) }},
		{"meta byte", func(path string) error { return vlogscanFlip(path, hdrAt) }},
		{"crc byte", func(path string) error { return vlogscanFlip(path, crcAt+3) }},
		{"zeroed entry", func(path string) error { return vlogscanZero(path, hdrAt, crcAt+4) }},
		{"truncated in the value", func(path string) error { return os.Truncate(path, int64(keyEnd+10)) }},
		{"truncated in the crc", func(path string) error { return os.Truncate(path, int64(crcAt+2)) }},
		{"truncated in the header", func(path string) error { return os.Truncate(path, int64(hdrAt+3)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for f, b := range files {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.vlog", f)), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.damage(filepath.Join(dir, fmt.Sprintf("%06d.vlog", fid))); err != nil {
				t.Fatal(err)
			}
			wantVals := make(map[string][]byte)
			for _, e := range entries {
				if loc := locs[string(e.vk)]; loc.fid != fid || loc.off < at {
					wantVals[string(e.vk)] = e.value
				}
			}
			got, err := valueLogEntries(dir, math.MaxUint32, vlogscanWant(entries))
			if err != nil {
				t.Fatal(err)
			}
			vlogscanCompare(t, tc.name, got, wantVals)
			if len(got) != len(entries)-(len(inFid)-len(inFid)/2) {
				t.Errorf("%d entries found, want %d", len(got), len(entries)-(len(inFid)-len(inFid)/2))
			}
		})
	}
}

func vlogscanFlip(path string, off int) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], int64(off)); err != nil {
		return err
	}
	b[0] ^= 0x5a
	_, err = f.WriteAt(b[:], int64(off))
	return err
}

func vlogscanZero(path string, from, to int) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt(make([]byte, to-from), int64(from))
	return err
}

// vlogscanEncode encodes an entry as Badger v4.9.6's logFile.encodeEntry
// does. Only for cases a real Badger does not write on demand; the format
// itself is checked against a real Badger above.
func vlogscanEncode(meta byte, vk, value []byte, expiresAt uint64) []byte {
	var b []byte
	b = append(b, meta, 0)
	b = binary.AppendUvarint(b, uint64(len(vk)))
	b = binary.AppendUvarint(b, uint64(len(value)))
	b = binary.AppendUvarint(b, expiresAt)
	b = append(b, vk...)
	b = append(b, value...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// vlogscanWriteFile writes a value log file of entries: a plain header,
// the entries, then zeros as Badger's preallocation leaves.
func vlogscanWriteFile(t *testing.T, dir string, fid uint32, entries ...[]byte) {
	t.Helper()
	b := make([]byte, vlogFileHeaderSize)
	for _, e := range entries {
		b = append(b, e...)
	}
	b = append(b, make([]byte, 4096)...)
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.vlog", fid)), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestValueLogEntriesEncodedFiles(t *testing.T) {
	vk := func(k string, v uint64) []byte { return versionedKey([]byte(k), v) }
	val := func(s string) []byte { return bytes.Repeat([]byte(s), 30) }
	txnEnd := func(ts uint64) []byte {
		return vlogscanEncode(vlogBitFinTxn, vk("!badger!txn", ts), []byte(strconv.FormatUint(ts, 10)), 0)
	}
	all := vlogscanWant(nil, vk("a", 1), vk("b", 2), vk("c", 3), vk("d", 5), vk("e", 5), vk("f", 6), vk("g", 7),
		vk("h", 8), vk("i", 9), vk("!badger!txn", 5))

	t.Run("newest file and later entry win", func(t *testing.T) {
		dir := t.TempDir()
		vlogscanWriteFile(t, dir, 1, vlogscanEncode(0, vk("a", 1), val("a1"), 0), vlogscanEncode(0, vk("b", 2), val("b1"), 0))
		vlogscanWriteFile(t, dir, 3, vlogscanEncode(0, vk("a", 1), val("a3"), 0), vlogscanEncode(0, vk("a", 1), val("a4"), 0))
		got, err := valueLogEntries(dir, 10, all)
		if err != nil {
			t.Fatal(err)
		}
		vlogscanCompare(t, "below 10", got, map[string][]byte{string(vk("a", 1)): val("a4"), string(vk("b", 2)): val("b1")})
		got, err = valueLogEntries(dir, 3, all)
		if err != nil {
			t.Fatal(err)
		}
		vlogscanCompare(t, "below 3", got, map[string][]byte{string(vk("a", 1)): val("a1"), string(vk("b", 2)): val("b1")})
	})

	t.Run("deleted, expired, transactions", func(t *testing.T) {
		dir := t.TempDir()
		vlogscanWriteFile(t, dir, 0,
			vlogscanEncode(vlogBitDelete, vk("a", 1), val("a"), 0),
			vlogscanEncode(0, vk("b", 2), val("b"), 1),             // expired in 1970
			vlogscanEncode(0, vk("c", 3), val("c"), math.MaxInt64), // expires far ahead
			vlogscanEncode(vlogBitTxn, vk("d", 5), val("d"), 0),
			vlogscanEncode(vlogBitTxn, vk("e", 5), val("e"), 0),
			txnEnd(5),
			vlogscanEncode(0, vk("f", 6), val("f"), 0),
			// A transaction never closed: what follows is not read.
			vlogscanEncode(vlogBitTxn, vk("g", 7), val("g"), 0),
			vlogscanEncode(0, vk("h", 8), val("h"), 0),
		)
		vlogscanWriteFile(t, dir, 1,
			// A marker of another transaction ends the file.
			vlogscanEncode(vlogBitTxn, vk("h", 8), val("h"), 0),
			txnEnd(9),
			vlogscanEncode(0, vk("i", 9), val("i"), 0),
		)
		got, err := valueLogEntries(dir, 10, all)
		if err != nil {
			t.Fatal(err)
		}
		vlogscanCompare(t, "entries", got, map[string][]byte{
			string(vk("c", 3)): val("c"),
			string(vk("d", 5)): val("d"),
			string(vk("e", 5)): val("e"),
			string(vk("f", 6)): val("f"),
		})
	})

	t.Run("lengths past the file", func(t *testing.T) {
		dir := t.TempDir()
		huge := []byte{0, 0}
		huge = binary.AppendUvarint(huge, 9)
		huge = binary.AppendUvarint(huge, math.MaxUint32) // klen+vlen wraps a uint32
		huge = binary.AppendUvarint(huge, 0)
		overflow := append([]byte{0, 0}, bytes.Repeat([]byte{0xff}, 11)...) // varint past 64 bits
		longKey := []byte{0, 0}
		longKey = binary.AppendUvarint(longKey, 1<<16+1)
		for i, tail := range [][]byte{huge, overflow, longKey} {
			vlogscanWriteFile(t, dir, uint32(i), vlogscanEncode(0, vk("a", uint64(i+1)), val("a"), 0), tail)
		}
		want := vlogscanWant(nil, vk("a", 1), vk("a", 2), vk("a", 3))
		got, err := valueLogEntries(dir, 10, want)
		if err != nil {
			t.Fatal(err)
		}
		vlogscanCompare(t, "entries", got, map[string][]byte{
			string(vk("a", 1)): val("a"), string(vk("a", 2)): val("a"), string(vk("a", 3)): val("a"),
		})
	})

	t.Run("short and encrypted files", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "000000.vlog"), make([]byte, vlogFileHeaderSize-1), 0o644); err != nil {
			t.Fatal(err)
		}
		vlogscanWriteFile(t, dir, 1, vlogscanEncode(0, vk("a", 1), val("a"), 0))
		got, err := valueLogEntries(dir, 10, all)
		if err != nil {
			t.Fatal(err)
		}
		vlogscanCompare(t, "entries", got, map[string][]byte{string(vk("a", 1)): val("a")})

		enc := make([]byte, vlogFileHeaderSize+100)
		binary.BigEndian.PutUint64(enc, 1)
		if err := os.WriteFile(filepath.Join(dir, "000002.vlog"), enc, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := valueLogEntries(dir, 10, all); err == nil || !strings.Contains(err.Error(), "encrypted") {
			t.Fatalf("encrypted file: err %v", err)
		}
		if _, err := valueLogEntries(dir, 2, all); err != nil {
			t.Fatalf("encrypted file not below belowFid: %v", err)
		}
	})

	t.Run("bad file name", func(t *testing.T) {
		dir := t.TempDir()
		vlogscanWriteFile(t, dir, 1, vlogscanEncode(0, vk("a", 1), val("a"), 0))
		if err := os.WriteFile(filepath.Join(dir, "x.vlog"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := valueLogEntries(dir, 10, all); err == nil {
			t.Fatal("no error for x.vlog")
		}
	})
}

func TestValueLogEntriesErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	want := map[string]struct{}{string(versionedKey([]byte("a"), 1)): {}}
	if got, err := valueLogEntries(missing, math.MaxUint32, want); err == nil {
		t.Fatalf("missing dir: %v, no error", got)
	}
	// An empty want reads nothing: not even the dir.
	for _, w := range []map[string]struct{}{nil, {}} {
		got, err := valueLogEntries(missing, math.MaxUint32, w)
		if err != nil || got == nil || len(got) != 0 {
			t.Fatalf("empty want: %v, %v; want an empty map", got, err)
		}
	}
	// A dir without value log files.
	got, err := valueLogEntries(t.TempDir(), math.MaxUint32, want)
	if err != nil || len(got) != 0 {
		t.Fatalf("empty dir: %v, %v", got, err)
	}
}
