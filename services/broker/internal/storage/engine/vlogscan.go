package engine

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4/y"
)

// Reading Badger's value log files directly.
//
// Why: a power loss during the value log GC (see the comment on
// rewriteValueLogFile in vlog.go, "Known limit") can leave the LSM pointing
// the newest version of a moved record at a rewritten value that never
// reached disk, while the old value log file, which still holds an entry of
// the very same key and version, is kept on disk. valueLogEntries reads such
// old files without Badger, so that those values can be recovered.
//
// The format is Badger v4.9.6's (the version go.mod pins), and the parsing
// mirrors v4.9.6's own reader: logFile.iterate (memtable.go), safeRead.Entry
// and hashReader (value.go), header.DecodeFrom (structs.go). A file is
//
//	keyID (8 bytes, big endian; 0 = not encrypted) | baseIV (12 bytes) | entry...
//
// and an entry is
//
//	meta | userMeta | uvarint klen | uvarint vlen | uvarint expiresAt |
//	key (klen) | value (vlen) | crc32 Castagnoli, big endian, of all before it
//
// where key is the versioned key (y.KeyWithTs). Files are preallocated and
// zero padded, so a file's entries end at the first entry that does not
// decode or whose checksum does not match (zeros never match), as in
// iterate. vlogscan_test.go checks all of this against a real Badger, and
// pins the Badger version: re-read the Badger code above when it changes.
//
// Deliberate differences from iterate, none of which changes what a valid
// file yields: where iterate fails (a varint that overflows 64 bits) or
// could allocate or slice past the file (a value length near 4 GiB, whose
// klen+vlen wraps a uint32), the file simply ends there, like any other
// torn tail; and the value log is read through a bufio.Reader over the file
// rather than Badger's mapping of it.

// Badger v4.9.6 value log constants (value.go, structs.go, y).
const (
	vlogFileHeaderSize = 20      // vlogHeaderSize: keyID (8) + baseIV (12)
	vlogMaxKeyLen      = 1 << 16 // safeRead.Entry: a longer key is a torn entry

	vlogBitDelete byte = 1 << 0 // bitDelete
	vlogBitTxn    byte = 1 << 6 // bitTxn
	vlogBitFinTxn byte = 1 << 7 // bitFinTxn
)

// valueLogEntries scans the value log files %06d.vlog in dir whose file id is below belowFid
// and returns the value of every entry whose versioned key (the key as Badger stores it in the
// value log: user key + 8-byte big-endian (math.MaxUint64 - version), i.e. y.KeyWithTs) is in want.
// Entries whose checksum does not match, and everything after the first such entry in a file
// (a torn tail), are not returned. Transaction markers and deleted/expired entries are skipped.
// Values are copies (not aliases of a mapping). A key found in several files: the one in the highest file id wins.
//
// Within one file a later entry wins over an earlier one of the same key.
// Entries of a transaction (bitTxn) count only once its closing marker
// (bitFinTxn) is read, as in iterate; Badger v4.9.6 strips both bits before
// writing to the value log, so its value log files hold neither. A file
// removed between listing dir and opening it is skipped, as if it had gone
// before. An error is returned if dir cannot be listed, a .vlog name does
// not parse (Badger refuses to open such a dir too), a file cannot be read,
// or a file is encrypted (keyID not 0; never the case in this project).
func valueLogEntries(dir string, belowFid uint32, want map[string]struct{}) (map[string][]byte, error) {
	out := make(map[string][]byte)
	if len(want) == 0 {
		return out, nil
	}
	fids, err := valueLogFids(dir, belowFid)
	if err != nil {
		return nil, err
	}
	now := uint64(time.Now().Unix())
	// Newest file first: a key found there is final.
	for _, fid := range slices.Backward(fids) {
		if len(out) == len(want) {
			break
		}
		path := filepath.Join(dir, fmt.Sprintf("%06d.vlog", fid))
		inFile := make(map[string][]byte)
		err := scanValueLogFile(path, now, want, func(key string, value []byte) {
			if _, ok := out[key]; !ok {
				inFile[key] = value
			}
		})
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for k, v := range inFile {
			out[k] = v
		}
	}
	return out, nil
}

// versionedKey returns the value log form of key at version (Badger's y.KeyWithTs).
func versionedKey(key []byte, version uint64) []byte {
	return y.KeyWithTs(key, version)
}

// valueLogFids returns, in ascending order, the ids of the value log files in
// dir below belowFid, named as Badger's populateFilesMap parses them.
func valueLogFids(dir string, belowFid uint32) ([]uint32, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("storage: listing value log files: %w", err)
	}
	var fids []uint32
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".vlog") || e.IsDir() {
			continue
		}
		fid, err := strconv.ParseUint(strings.TrimSuffix(name, ".vlog"), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("storage: value log file %s: unable to parse its id: %w",
				filepath.Join(dir, name), err)
		}
		if uint32(fid) < belowFid {
			fids = append(fids, uint32(fid))
		}
	}
	slices.Sort(fids)
	return fids, nil
}

// scanValueLogFile calls found, in file order, with the versioned key and a
// copy of the value of each entry of the value log file at path that
// Badger's iterate would hand on, whose key is in want, and that is neither
// deleted nor expired at now (isDeletedOrExpired, iterator.go).
func scanValueLogFile(path string, now uint64, want map[string]struct{}, found func(key string, value []byte)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("storage: value log file %s: %w", path, err)
	}
	if fi.Size() < vlogFileHeaderSize {
		// Badger (logFile.open) leaves such a file to be rebuilt: no entries.
		return nil
	}
	src := &vlogSource{f: f}
	r := &vlogReader{
		br:   bufio.NewReaderSize(src, 64<<10),
		src:  src,
		left: fi.Size(),
		crc:  crc32.New(y.CastagnoliCrcTable),
	}
	var fh [vlogFileHeaderSize]byte
	if _, err := io.ReadFull(r.br, fh[:]); err != nil {
		return fmt.Errorf("storage: value log file %s: reading its header: %w", path, err)
	}
	r.left -= vlogFileHeaderSize
	if keyID := binary.BigEndian.Uint64(fh[:8]); keyID != 0 {
		return fmt.Errorf("storage: value log file %s is encrypted (key id %d): not supported", path, keyID)
	}

	type kv struct {
		key   string
		value []byte
	}
	wanted := func(e *vlogEntry) (kv, bool) {
		if _, ok := want[string(e.key)]; !ok {
			return kv{}, false
		}
		if e.meta&vlogBitDelete > 0 || (e.expiresAt != 0 && e.expiresAt <= now) {
			return kv{}, false
		}
		return kv{string(e.key), bytes.Clone(e.value)}, true
	}

	// The loop of logFile.iterate.
	var lastCommit uint64
	var txn []kv // the wanted entries of the transaction being read
	for {
		e, ok, err := r.next()
		if err != nil {
			return fmt.Errorf("storage: value log file %s: %w", path, err)
		}
		if !ok || len(e.key) == 0 { // a torn or zero entry: the file ends
			return nil
		}
		switch {
		case e.meta&vlogBitTxn > 0:
			txnTs := y.ParseTs(e.key)
			if lastCommit == 0 {
				lastCommit = txnTs
			}
			if lastCommit != txnTs {
				return nil
			}
			if w, ok := wanted(&e); ok {
				txn = append(txn, w)
			}
		case e.meta&vlogBitFinTxn > 0:
			txnTs, err := strconv.ParseUint(string(e.value), 10, 64)
			if err != nil || lastCommit != txnTs {
				return nil
			}
			lastCommit = 0
			for _, w := range txn {
				found(w.key, w.value)
			}
			txn = txn[:0]
		default:
			if lastCommit != 0 {
				return nil
			}
			if w, ok := wanted(&e); ok {
				found(w.key, w.value)
			}
		}
	}
}

// vlogSource reads a value log file, remembering the first error other
// than io.EOF: a failed read, as opposed to the end of the file.
type vlogSource struct {
	f   *os.File
	err error
}

func (s *vlogSource) Read(p []byte) (int, error) {
	n, err := s.f.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// vlogEntry is one decoded entry. key and value alias vlogReader's buffer
// until the next call to next.
type vlogEntry struct {
	key, value []byte
	meta       byte
	expiresAt  uint64
}

// vlogReader decodes a value log file's entries, as safeRead.Entry does.
type vlogReader struct {
	br   *bufio.Reader
	src  *vlogSource
	left int64 // bytes of the file not yet read
	crc  hash.Hash32
	buf  []byte
}

// ReadByte reads one header byte into the checksum (hashReader).
func (r *vlogReader) ReadByte() (byte, error) {
	b, err := r.br.ReadByte()
	if err != nil {
		return 0, err
	}
	r.left--
	r.crc.Write([]byte{b})
	return b, nil
}

// next decodes the next entry. ok is false where iterate stops reading the
// file (io.EOF, io.ErrUnexpectedEOF, errTruncate: a torn or zero tail); err
// is a failed read of the file.
func (r *vlogReader) next() (e vlogEntry, ok bool, err error) {
	r.crc.Reset()
	// header.DecodeFrom.
	var klen, vlen uint64
	if e.meta, err = r.ReadByte(); err != nil {
		return r.stop()
	}
	if _, err = r.ReadByte(); err != nil { // userMeta
		return r.stop()
	}
	if klen, err = binary.ReadUvarint(r); err != nil {
		return r.stop()
	}
	if vlen, err = binary.ReadUvarint(r); err != nil {
		return r.stop()
	}
	if e.expiresAt, err = binary.ReadUvarint(r); err != nil {
		return r.stop()
	}
	// safeRead.Entry; Badger keeps the lengths as uint32.
	kl, vl := int64(uint32(klen)), int64(uint32(vlen))
	if kl > vlogMaxKeyLen {
		return r.stop()
	}
	if kl+vl+crc32.Size > r.left {
		return r.stop() // would read past the end of the file
	}
	n := int(kl + vl)
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	buf := r.buf[:n]
	if _, err := io.ReadFull(r.br, buf); err != nil {
		return r.stop()
	}
	r.crc.Write(buf)
	var crcBuf [crc32.Size]byte
	if _, err := io.ReadFull(r.br, crcBuf[:]); err != nil {
		return r.stop()
	}
	r.left -= kl + vl + crc32.Size
	if binary.BigEndian.Uint32(crcBuf[:]) != r.crc.Sum32() {
		return r.stop()
	}
	e.key, e.value = buf[:kl], buf[kl:]
	return e, true, nil
}

// stop ends the file: where reading failed, with that error.
func (r *vlogReader) stop() (vlogEntry, bool, error) {
	if r.src.err != nil {
		return vlogEntry{}, false, r.src.err
	}
	return vlogEntry{}, false, nil
}
