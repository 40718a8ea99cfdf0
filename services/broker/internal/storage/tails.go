package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Tails entries. Every group commit writes the newest state of each stream
// its ops touched, after all of the group's entries (groupMeta): that write
// is what makes a durable record tail durable. Most of those changes are
// appends, which change only a stream's tails: the record tail, the chain,
// the cursor event tail, the bytes and the confirm watermark. Writing the
// whole metadata for them cost an entry of a few hundred bytes per stream
// and group on every copy, which with many streams each appending a record
// or two is an entry per record (about a fifth of a broker's CPU
// publishing across 1,000 streams, measured with the entries left out).
// So:
//
//   - A stream whose newest metadata differs from the last one written in
//     full only in its tails has its tails written in the group's tails
//     entries instead, keyed by the group's number:
//
//     t | group | chunk  ->  version (1) | (uvarint name length, name,
//     uvarint record tail, chain, cursor event tail, bytes, confirm
//     watermark)...
//
//     Each chunk stays below the engine's value threshold (engine.go, 512
//     bytes), so tails live in the LSM tree and its write-ahead log, as
//     small metadata does, and never in the value log, whose GC moves
//     values (torn.go).
//   - Any other change (an epoch, a seal, a log epoch, a cut, retention, the
//     producer checkpoints, a stream's first write) writes the whole
//     metadata, numbered with the group (meta.TailsSeq).
//   - A tails entry applies to a stream only when it is newer than the
//     stream's metadata: its group is above the metadata's TailsSeq. The
//     newest entry that names a stream wins.
//   - A checkpoint writes the whole metadata of every stream whose newest
//     state is only in tails entries and then deletes every tails entry (in
//     that order, so a group that Badger's transaction bound splits never
//     loses a tail): every tailsCheckpointChunks chunks, or once there are
//     as many chunks as such streams if there are more (so a checkpoint's
//     whole metadata are never more entries than the chunks they replace),
//     and at a clean Close, so a store closed cleanly holds no tails
//     entries. A checkpoint skips a closed stream (one being dropped: its
//     metadata written after the drop's marker would undo it), so DB.Drop
//     has the stream written whole before its marker.
//   - Open folds the tails entries into the metadata they are newer than and
//     deletes them (foldTails) before any stream is loaded, so everything
//     that reads metadata from Badger (loadStream, Streams, drops) reads
//     it whole. The recovery's markUnsure runs before, in the engine's
//     open, and reads only epochs and seals, which are never in tails
//     entries. A fold that a crash interrupts is repeated: a folded
//     metadata carries the entry's group, which then no longer applies to
//     it.
//
// The group numbers only grow: Open starts them above every number in use,
// in tails keys and in metadata.

// tailsCheckpointChunks is how many tails chunks are written at least
// between two checkpoints: about 450 KiB, the tails of some nine thousand
// appends, which Open reads back after a crash (more, up to a chunk per
// stream, on a broker with more streams whose tails are in them).
const tailsCheckpointChunks = 1024

// tailsChunkBytes bounds one chunk's value, below the engine's value
// threshold (512). One stream's tails take at most 1+255+5*10 bytes.
const tailsChunkBytes = 448

const tailsVersion byte = 1

// streamTails are the fields of a stream's metadata that appends change.
type streamTails struct {
	RecordTail, Chain, CursorEventTail, Bytes, ConfirmWatermark uint64
}

func tailsOf(m *meta) streamTails {
	return streamTails{
		RecordTail: m.RecordTail, Chain: m.Chain, CursorEventTail: m.CursorEventTail,
		Bytes: m.Bytes, ConfirmWatermark: m.ConfirmWatermark,
	}
}

func (t streamTails) applyTo(m *meta) {
	m.RecordTail, m.Chain, m.CursorEventTail = t.RecordTail, t.Chain, t.CursorEventTail
	m.Bytes, m.ConfirmWatermark = t.Bytes, t.ConfirmWatermark
}

// onlyTailsDiffer reports whether a and b are the same metadata but for
// their tails (and TailsSeq, which says where a metadata was written, not
// what it is). Every other field of meta must be compared here:
// TestOnlyTailsDifferComparesEveryField fails on one that is not, since a
// change this missed would be kept only as tails and lost at a restart.
func onlyTailsDiffer(a, b *meta) bool {
	return a.Incarnation == b.Incarnation && a.Epoch == b.Epoch &&
		slices.Equal(a.LogEpochs, b.LogEpochs) &&
		a.SealEpoch == b.SealEpoch && a.SealTransition == b.SealTransition &&
		slices.Equal(a.SealedLogEpochs, b.SealedLogEpochs) &&
		a.Head == b.Head && a.HeadChain == b.HeadChain && a.Purged == b.Purged &&
		a.CursorEventsPurged == b.CursorEventsPurged &&
		sameCut(a.Cut, b.Cut) && a.Dropping == b.Dropping &&
		slices.Equal(a.ProducerTables, b.ProducerTables) && a.ProducerGen == b.ProducerGen &&
		a.UnsureEpoch == b.UnsureEpoch
}

func sameCut(a, b *cutIntent) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// tailsKey is t | group | chunk.
func tailsKey(seq uint64, chunk int) []byte {
	k := make([]byte, 0, 11)
	k = append(k, kindTails)
	k = binary.BigEndian.AppendUint64(k, seq)
	return binary.BigEndian.AppendUint16(k, uint16(chunk))
}

// tailsKeySeq returns the group of a tails key.
func tailsKeySeq(k []byte) (uint64, bool) {
	if len(k) != 11 || k[0] != kindTails {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[1:9]), true
}

// tailsWriter packs one group's tails into chunks, in one buffer.
type tailsWriter struct {
	buf    []byte
	starts []int // where each chunk starts in buf
}

func (w *tailsWriter) reset() {
	w.buf, w.starts = w.buf[:0], w.starts[:0]
}

func (w *tailsWriter) add(name string, t streamTails) {
	need := binary.MaxVarintLen64*6 + len(name)
	if len(w.starts) == 0 || len(w.buf)-w.starts[len(w.starts)-1]+need > tailsChunkBytes {
		w.starts = append(w.starts, len(w.buf))
		w.buf = append(w.buf, tailsVersion)
	}
	w.buf = binary.AppendUvarint(w.buf, uint64(len(name)))
	w.buf = append(w.buf, name...)
	for _, v := range [...]uint64{t.RecordTail, t.Chain, t.CursorEventTail, t.Bytes, t.ConfirmWatermark} {
		w.buf = binary.AppendUvarint(w.buf, v)
	}
}

// entries appends the group's chunks under group seq to out, and their
// keys to keys. The values alias a fresh copy of the buffer: Badger may
// hold them until the group is written, and the writer is reused.
func (w *tailsWriter) entries(seq uint64, out []engine.Entry, keys [][]byte) ([]engine.Entry, [][]byte) {
	if len(w.starts) == 0 {
		return out, keys
	}
	buf := bytes.Clone(w.buf)
	for i, start := range w.starts {
		end := len(buf)
		if i+1 < len(w.starts) {
			end = w.starts[i+1]
		}
		k := tailsKey(seq, i)
		out = append(out, engine.Entry{Key: k, Value: buf[start:end:end]})
		keys = append(keys, k)
	}
	return out, keys
}

// decodeTails calls fn with every stream's tails in a chunk.
func decodeTails(v []byte, fn func(name string, t streamTails)) error {
	if len(v) == 0 || v[0] != tailsVersion {
		return fmt.Errorf("%w: tails entry: unknown version", ErrCorrupt)
	}
	v = v[1:]
	uvarint := func() (uint64, bool) {
		x, n := binary.Uvarint(v)
		if n <= 0 {
			return 0, false
		}
		v = v[n:]
		return x, true
	}
	for len(v) > 0 {
		n, ok := uvarint()
		if !ok || n == 0 || n > maxStreamName || n > uint64(len(v)) {
			return fmt.Errorf("%w: tails entry: bad stream name", ErrCorrupt)
		}
		name := string(v[:n])
		v = v[n:]
		var vals [5]uint64
		for i := range vals {
			if vals[i], ok = uvarint(); !ok {
				return fmt.Errorf("%w: tails entry of stream %q: truncated", ErrCorrupt, name)
			}
		}
		fn(name, streamTails{RecordTail: vals[0], Chain: vals[1], CursorEventTail: vals[2], Bytes: vals[3], ConfirmWatermark: vals[4]})
	}
	return nil
}

// latestTails is the newest tails entry naming each stream, and every tails
// key, in key order.
type latestTails struct {
	byName map[string]groupTails
	keys   [][]byte
	maxSeq uint64
}

type groupTails struct {
	seq uint64
	t   streamTails
}

// readTails reads every tails entry.
func readTails(v viewer) (latestTails, error) {
	lt := latestTails{byName: map[string]groupTails{}}
	err := v.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefix: []byte{kindTails}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			seq, ok := tailsKeySeq(item.Key())
			if !ok {
				return fmt.Errorf("%w: tails key %x", ErrCorrupt, item.Key())
			}
			lt.keys = append(lt.keys, bytes.Clone(item.Key()))
			lt.maxSeq = max(lt.maxSeq, seq)
			if err := item.Value(func(v []byte) error {
				return decodeTails(v, func(name string, t streamTails) {
					lt.byName[name] = groupTails{seq: seq, t: t}
				})
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return lt, err
}

// apply gives m the tails of the newest entry naming it, when that entry is
// newer than m, and reports whether it did.
func (lt latestTails) apply(name string, m *meta) bool {
	g, ok := lt.byName[name]
	if !ok || m.Dropping || g.seq <= m.TailsSeq {
		return false
	}
	g.t.applyTo(m)
	m.TailsSeq = g.seq
	return true
}

// foldTails, at Open before any stream is loaded, writes the tails entries
// into the metadata they are newer than, then deletes them, and starts the
// group numbers above every one in use. A stream the entries name that has
// no metadata was dropped; a stream being dropped keeps its metadata as it
// is (the drop deletes it), and is returned for Open to finish its drop:
// this is Open's one scan of every stream's metadata.
func (db *DB) foldTails() (dropping []string, err error) {
	lt, err := readTails(db.eng)
	if err != nil {
		return nil, fmt.Errorf("storage: reading tails entries: %w", err)
	}
	seq := lt.maxSeq
	o := &op{}
	err = eachMeta(db.eng, func(name string, key []byte, m meta) {
		seq = max(seq, m.TailsSeq)
		if m.Dropping {
			dropping = append(dropping, name)
		}
		if lt.apply(name, &m) {
			o.add(bytes.Clone(key), encodeMeta(&m))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("storage: scanning stream metadata: %w", err)
	}
	// The committer takes its first group after this (db.do below, or the
	// first op of a stream): the channel send orders this write before it.
	db.cm.seq = seq
	if len(lt.keys) == 0 {
		return dropping, nil
	}
	// Deleted after the metadata they were folded into, in queue order.
	for _, k := range lt.keys {
		o.del(k)
	}
	if err := db.do(context.Background(), o); err != nil {
		return nil, fmt.Errorf("storage: folding tails entries: %w", err)
	}
	return dropping, nil
}
