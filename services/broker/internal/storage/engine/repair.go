package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Pre-open repair. Badger creates a write-ahead log file (NNNNN.mem) for
// every new memtable and a value log file (NNNNNN.vlog) at every open: it
// extends the file with ftruncate, maps it and writes a 20-byte header
// (encryption key id and IV) through the mapping, none of it synced until
// the committer's first DB.Sync. A power loss before that can leave the
// file at any size with any prefix of its bytes. Badger opens a zero-filled
// or header-less file it finds, except an empty one: it opens existing
// files without O_CREATE, takes the empty file for a new one and refuses to
// open ("while opening memtables ... Create a new file", "Open existing
// file ... Create a new file"), on every start from then on.
//
// A file shorter than its header holds no entry that was ever synced: an
// entry sits after the header, and the DB.Sync that makes it durable
// msyncs the whole mapping, header included, with the file's size (the
// datasync of a changed size writes the size too). So such a file only
// ever held writes a power loss was allowed to lose, and removing it before
// Badger opens loses nothing the durability contract (doc.go,
// "Durability") promised. What it may have held but lost is the newest,
// unsynced transaction, which the recovery rolls back as a torn one
// (torn.go): a key whose value pointed into a removed value log file reads
// as unreadable, like one past a file's end. Badger handles every other
// state such a file can be left in: a missing file (it creates the next
// one), a zero-filled or short one (an empty header means no encryption,
// and the replay stops at the first entry that does not check out). The
// header is the same in both kinds of file (vlogFileHeaderSize).

// repairLogFiles removes every memtable write-ahead log and value log file
// in dir that is shorter than its header, and syncs dir if it removed any.
// It runs before Badger opens dir (Open, recoverStore), so no mapping of
// the files exists.
func repairLogFiles(dir string) (removed []string, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a new store
	}
	if err != nil {
		return nil, fmt.Errorf("storage: listing %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || (!strings.HasSuffix(name, ".mem") && !strings.HasSuffix(name, ".vlog")) {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return removed, fmt.Errorf("storage: reading the size of %s: %w", name, err)
		}
		if info.Size() >= vlogFileHeaderSize {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return removed, fmt.Errorf("storage: removing %s, which holds no entry: %w", name, err)
		}
		removed = append(removed, name)
	}
	if len(removed) > 0 {
		// Not needed for safety (a file that comes back is removed again),
		// but then the next open sees what this one did.
		if err := syncDir(dir); err != nil {
			return removed, err
		}
	}
	return removed, nil
}
