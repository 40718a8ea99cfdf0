package storage

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Records are stored in segments: one Badger entry per appended batch (or
// per DB.maxEntryBytes of it), keyed by the offset of its last record,
//
//	r | len | name | last offset  ->  version (2) | (uvarint len, record)...
//
// with each record in its codec.go encoding, in offset order. One entry per
// batch instead of one per record is what keeps Badger's per-entry costs
// (memtable inserts, value log headers, memtable flushes and compactions,
// which stall a broker's fsyncs while they write) off the publish path:
// the memtable fills about a hundred times slower.
//
// Keying by the last offset lets a forward seek to any offset land on the
// segment that holds it: the first key at or above the offset. Segments of
// a copy tile its log without overlap, so the record tail, a cut or a reset
// always falls on a segment boundary once the segment that straddled it is
// rewritten (truncateRecords). Retention leaves the segment that straddles
// the head in place; the records in it below the head are not part of the
// log (scans start at the head) and go with the segment once the head has
// passed its last record (purge).
//
// The version is 2: the layout before segments stored one record per key,
// whose value starts with recordVersion (1), so a store written by it is
// refused as corrupt rather than misread.
const segmentVersion byte = 2

// segmentBuilder packs a batch's records into segments of at most limit
// bytes (a record alone may reach it) and adds them to an op.
type segmentBuilder struct {
	prefix []byte
	limit  int
	// left is what the records still to come are expected to take: each
	// segment's buffer is allocated once at its final size instead of
	// growing by doubling (copies that were most of a broker's allocation
	// on the publish path).
	left int
	buf  []byte
	last uint64
}

// segmentSlack is what a record may take in a segment beyond its
// recordSize before its offset and epoch are assigned: room for both
// varints and the segment's length prefix.
const segmentSlack = 2*binary.MaxVarintLen64 + binary.MaxVarintLen32

// newSegmentBuilder starts segments for records about to be added in
// order, expected to take estimate bytes in all: 1 (the version) plus, per
// record, its recordSize and segmentSlack. Callers sum it in the loop that
// checks each record's size, so the publish path sizes a record once
// before it is encoded.
func newSegmentBuilder(prefix []byte, limit, estimate int) *segmentBuilder {
	return &segmentBuilder{prefix: prefix, limit: limit, left: estimate}
}

// segmentEstimate is newSegmentBuilder's estimate for recs, for callers
// that have not sized them already.
func segmentEstimate(recs []Record) int {
	n := 1
	for i := range recs {
		n += recordSize(&recs[i]) + segmentSlack
	}
	return n
}

// add appends rec to the current segment, first adding that segment to o
// when rec would take it over the limit. It returns rec's encoded size (the
// unit of Bytes and of byte-based retention).
func (b *segmentBuilder) add(o *op, rec *Record) int {
	n := recordSize(rec)
	if len(b.buf) > 1 && len(b.buf)+uvarintLen(uint64(n))+n > b.limit {
		b.flush(o)
	}
	b.append(rec, n)
	return n
}

// append adds rec, of encoded size n, to the current segment.
func (b *segmentBuilder) append(rec *Record, n int) {
	if len(b.buf) == 0 {
		b.buf = append(make([]byte, 0, max(min(b.limit, b.left), 1+binary.MaxVarintLen32+n)), segmentVersion)
	}
	before := len(b.buf)
	b.buf = binary.AppendUvarint(b.buf, uint64(n))
	b.buf = encodeRecord(b.buf, rec)
	b.left -= len(b.buf) - before
	b.last = rec.Offset
}

// flush adds the current segment, if any, to o.
func (b *segmentBuilder) flush(o *op) {
	if len(b.buf) == 0 {
		return
	}
	o.add(offsetKey(b.prefix, b.last), b.buf)
	b.buf = nil
}

// EncodeSegment encodes recs, in order, as one record segment: how an
// owner ships records to its followers (FollowResponse.record_segment), in
// the encoding its store keeps them in. Nil for no records.
func EncodeSegment(recs []Record) []byte {
	b := newSegmentBuilder(nil, math.MaxInt, segmentEstimate(recs))
	for i := range recs {
		b.append(&recs[i], recordSize(&recs[i]))
	}
	return b.buf
}

// DecodeSegment decodes a record segment made by EncodeSegment. The
// records' payloads are slices of seg, which the caller must not change
// afterwards. It checks the encoding only: offsets and chains are the
// caller's to check (AppendReplicated does). Nil for an empty seg.
func DecodeSegment(seg []byte) ([]Record, error) {
	if len(seg) == 0 {
		return nil, nil
	}
	var out []Record
	err := eachSegmentRecord(seg, func(enc []byte) (bool, error) {
		rec, err := decodeRecordAliased(enc)
		if err != nil {
			return false, fmt.Errorf("record %d of the segment: %w", len(out), err)
		}
		out = append(out, rec)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachSegmentRecord calls fn with each record encoding in seg, in order,
// until fn returns false or an error.
func eachSegmentRecord(seg []byte, fn func(enc []byte) (bool, error)) error {
	if len(seg) == 0 || seg[0] != segmentVersion {
		return fmt.Errorf("%w: record segment version", ErrCorrupt)
	}
	seg = seg[1:]
	for len(seg) > 0 {
		n, k := binary.Uvarint(seg)
		if k <= 0 || n > uint64(len(seg)-k) {
			return fmt.Errorf("%w: truncated record segment", ErrCorrupt)
		}
		more, err := fn(seg[k : k+int(n)])
		if err != nil || !more {
			return err
		}
		seg = seg[k+int(n):]
	}
	return nil
}

// recordOffset reads the offset at the front of a record encoding.
func recordOffset(enc []byte) (uint64, error) {
	if len(enc) < 2 || enc[0] != recordVersion {
		return 0, fmt.Errorf("%w: record version", ErrCorrupt)
	}
	off, k := binary.Uvarint(enc[1:])
	if k <= 0 {
		return 0, fmt.Errorf("%w: record offset", ErrCorrupt)
	}
	return off, nil
}

// scanRecords calls fn with the stored records in [from, to) in order, each
// with its encoded size, until fn returns false. The payload is decoded
// only when payload is set. A record of the range that is not stored is
// reported with missing (ErrCorrupt or ErrOutOfRange, whichever the caller
// takes it for).
func (s *Stream) scanRecords(txn *engine.Txn, from, to uint64, payload bool, missing error, fn func(rec Record, size int) bool) error {
	if from >= to {
		return nil
	}
	mode := payloadNone
	if payload {
		mode = payloadCopy
	}
	it := txn.NewIterator(engine.IterOptions{Prefix: s.recPrefix})
	defer it.Close()
	next := from
	done := false
	for it.Seek(offsetKey(s.recPrefix, from)); it.Valid() && next < to && !done; it.Next() {
		item := it.Item()
		err := item.Value(func(seg []byte) error {
			return eachSegmentRecord(seg, func(enc []byte) (bool, error) {
				off, err := recordOffset(enc)
				if err != nil {
					return false, err
				}
				if off < next {
					return true, nil // below the range (or the head)
				}
				if off != next {
					return false, fmt.Errorf("%w: record %d missing (found %d)", missing, next, off)
				}
				rec, err := decodeRecordFields(enc, mode)
				if err != nil {
					return false, fmt.Errorf("record %d: %w", off, err)
				}
				if !fn(rec, len(enc)) {
					done = true
					return false, nil
				}
				next++
				return next < to, nil
			})
		})
		if err != nil {
			return err
		}
	}
	if next < to && !done {
		return fmt.Errorf("%w: record %d missing", missing, next)
	}
	return nil
}

// truncateRecords removes every record at or above from: segments that
// start there or later are deleted, and the one that straddles from is
// rewritten with its records below from (its key becomes from-1). The new
// segment is written before the old one is deleted, in one op, so however
// Badger splits the op's transaction no record below from is ever missing;
// a crash in between leaves the old segment, which the next call (a cut or
// a reset is completed on open, and open truncates past the tail) rewrites
// again. Bounded batches of segments per op.
func (s *Stream) truncateRecords(ctx context.Context, from uint64) error {
	const batch = 1024
	for {
		o := &op{}
		n := 0
		err := s.db.eng.View(func(txn *engine.Txn) error {
			it := txn.NewIterator(engine.IterOptions{Prefix: s.recPrefix})
			defer it.Close()
			for it.Seek(offsetKey(s.recPrefix, from)); it.Valid() && n < batch; it.Next() {
				item := it.Item()
				key := item.KeyCopy(nil)
				var kept []byte
				err := item.Value(func(seg []byte) error {
					return eachSegmentRecord(seg, func(enc []byte) (bool, error) {
						off, err := recordOffset(enc)
						if err != nil || off >= from {
							return false, err
						}
						if kept == nil {
							kept = []byte{segmentVersion}
						}
						kept = binary.AppendUvarint(kept, uint64(len(enc)))
						kept = append(kept, enc...)
						return true, nil
					})
				})
				if err != nil && (n > 0 || s.segmentStartsAt(txn, from)) {
					// A segment whose value cannot be read (torn.go) that
					// lies wholly at or above from: it goes whole. Segments
					// after the first tile the log above it.
					err, kept = nil, nil
				}
				if err != nil {
					return fmt.Errorf("segment %d: %w", keyOffset(key), err)
				}
				if kept != nil {
					o.add(offsetKey(s.recPrefix, from-1), kept)
				}
				o.del(key)
				n++
			}
			return nil
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if err := s.db.do(ctx, o); err != nil {
			return err
		}
		if n < batch {
			return nil
		}
	}
}
