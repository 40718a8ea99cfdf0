package storage

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
)

// Value encodings. Records and cursor events are binary (they are most of the
// bytes written); meta and the cursor snapshot are JSON (small, written once
// per commit batch or snapshot, and readable with badger's tools).

const (
	recordVersion byte = 1
	eventVersion  byte = 1
)

// unixNanos maps a publish time to the integer the codec and the chain use;
// the zero time, whose UnixNano is undefined, maps to math.MinInt64.
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	return t.UnixNano()
}

func fromUnixNanos(n int64) time.Time {
	if n == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// encodeRecord appends rec's value encoding to dst:
//
//	version(1) | uvarint offset | uvarint epoch | varint publish nanos |
//	uvarint sequence | chain (8, big-endian) | uvarint len, producer id |
//	uvarint header count | (uvarint len, key, uvarint len, value)... sorted by key |
//	payload (the rest)
func encodeRecord(dst []byte, rec *Record) []byte {
	dst = append(dst, recordVersion)
	dst = binary.AppendUvarint(dst, rec.Offset)
	dst = binary.AppendUvarint(dst, rec.Epoch)
	dst = binary.AppendVarint(dst, unixNanos(rec.PublishTime))
	dst = binary.AppendUvarint(dst, rec.Sequence)
	dst = binary.BigEndian.AppendUint64(dst, rec.Chain)
	dst = appendString(dst, rec.ProducerID)
	dst = binary.AppendUvarint(dst, uint64(len(rec.Headers)))
	for _, k := range sortedKeys(rec.Headers) {
		dst = appendString(dst, k)
		dst = appendString(dst, rec.Headers[k])
	}
	return append(dst, rec.Payload...)
}

// recordSize is the length of rec's encoding: the unit of Bytes and of
// byte-based retention.
func recordSize(rec *Record) int {
	n := 1 + uvarintLen(rec.Offset) + uvarintLen(rec.Epoch) + varintLen(unixNanos(rec.PublishTime)) +
		uvarintLen(rec.Sequence) + 8 + uvarintLen(uint64(len(rec.ProducerID))) + len(rec.ProducerID) +
		uvarintLen(uint64(len(rec.Headers))) + len(rec.Payload)
	for k, v := range rec.Headers {
		n += uvarintLen(uint64(len(k))) + len(k) + uvarintLen(uint64(len(v))) + len(v)
	}
	return n
}

// decodeRecord decodes a record value. The payload is copied, so the result
// does not alias b (Badger values are only valid inside their transaction).
func decodeRecord(b []byte) (Record, error) {
	return decodeRecordFields(b, payloadCopy)
}

// decodeRecordAliased decodes a record whose payload stays a slice of b.
func decodeRecordAliased(b []byte) (Record, error) {
	return decodeRecordFields(b, payloadAlias)
}

// How decodeRecordFields takes the payload.
const (
	payloadNone = iota
	payloadCopy
	payloadAlias
)

func decodeRecordFields(b []byte, payload int) (Record, error) {
	d := decoder{b: b}
	if v := d.byte(); v != recordVersion {
		return Record{}, fmt.Errorf("%w: record version %d", ErrCorrupt, v)
	}
	var rec Record
	rec.Offset = d.uvarint()
	rec.Epoch = d.uvarint()
	rec.PublishTime = fromUnixNanos(d.varint())
	rec.Sequence = d.uvarint()
	rec.Chain = d.uint64()
	rec.ProducerID = d.string()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %d headers in %d bytes", ErrCorrupt, n, len(d.b))
	}
	if n > 0 && d.err == nil {
		rec.Headers = make(map[string]string, n)
		prev := ""
		for i := uint64(0); i < n && d.err == nil; i++ {
			k, v := d.string(), d.string()
			if i > 0 && k <= prev {
				d.err = fmt.Errorf("%w: header keys out of order", ErrCorrupt)
			}
			rec.Headers[k], prev = v, k
		}
	}
	if d.err != nil {
		return Record{}, d.err
	}
	switch payload {
	case payloadNone:
		return rec, nil
	case payloadCopy:
		rec.Payload = slices.Clone(d.b)
	default:
		rec.Payload = d.b[:len(d.b):len(d.b)]
	}
	if rec.Payload == nil {
		rec.Payload = []byte{}
	}
	return rec, nil
}

// encodeEvent: version(1) | uvarint offset | uvarint epoch | uvarint position |
// cursor name (the rest).
func encodeEvent(dst []byte, ev *CursorEvent) []byte {
	dst = append(dst, eventVersion)
	dst = binary.AppendUvarint(dst, ev.Offset)
	dst = binary.AppendUvarint(dst, ev.Epoch)
	dst = binary.AppendUvarint(dst, ev.Position)
	return append(dst, ev.Cursor...)
}

func decodeEvent(b []byte) (CursorEvent, error) {
	d := decoder{b: b}
	if v := d.byte(); v != eventVersion {
		return CursorEvent{}, fmt.Errorf("%w: cursor event version %d", ErrCorrupt, v)
	}
	var ev CursorEvent
	ev.Offset = d.uvarint()
	ev.Epoch = d.uvarint()
	ev.Position = d.uvarint()
	if d.err != nil {
		return CursorEvent{}, d.err
	}
	ev.Cursor = string(d.b)
	return ev, nil
}

// sortedKeys returns a record's header keys in order (nil for none): the
// order both the encoding and the chain cover them in.
func sortedKeys(h map[string]string) []string {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}

// decoder reads a value front to back and keeps the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", ErrCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail("version")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.fail("uint64")
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail("string")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// meta is a stream's durable metadata, stored at its meta key. It is written
// in the same Badger transaction as the entries that move its tails, so the
// tails never claim entries that are not there (doc.go, "Durability").
type meta struct {
	// Incarnation is the assignment's stream incarnation this copy belongs to.
	Incarnation     string     `json:"incarnation,omitempty"`
	Epoch           uint64     `json:"epoch"`
	LogEpochs       []LogEpoch `json:"log_epochs,omitempty"`
	SealEpoch       uint64     `json:"seal_epoch,omitempty"`
	SealTransition  string     `json:"seal_transition,omitempty"`
	SealedLogEpochs []LogEpoch `json:"sealed_log_epochs,omitempty"`
	// Head is the retained head; HeadChain the chain of the prefix below it.
	Head      uint64 `json:"head"`
	HeadChain uint64 `json:"head_chain"`
	// Purged: record keys below it are deleted. Purged <= Head; the range
	// between is being deleted by retention or ResetTo.
	Purged          uint64 `json:"purged"`
	RecordTail      uint64 `json:"record_tail"`
	Chain           uint64 `json:"chain"`
	CursorEventTail uint64 `json:"cursor_event_tail"`
	// CursorEventsPurged: cursor event keys below it are deleted. It is at
	// most the boundary of the durable cursor snapshot; the events between
	// are being compacted away (compact.go).
	CursorEventsPurged uint64 `json:"cursor_events_purged,omitempty"`
	Bytes              uint64 `json:"bytes"`
	// ConfirmWatermark is written lazily: on restart it may be lower than
	// the value last set, never higher than the record tail.
	ConfirmWatermark uint64 `json:"confirm_watermark"`
	// Cut is the intent of an unfinished Cut (cut.go); Open completes it.
	Cut *cutIntent `json:"cut,omitempty"`
	// Dropping marks a Drop in progress; DB Open completes it.
	Dropping bool `json:"dropping,omitempty"`
	// ProducerTables are the producer table checkpoints in use, oldest
	// first, at most two; ProducerGen is the last checkpoint number used
	// (checkpoint.go).
	ProducerTables []producerGen `json:"producer_tables,omitempty"`
	ProducerGen    uint64        `json:"producer_gen,omitempty"`
	// UnsureEpoch is the epoch the copy was at when its store was opened
	// after a stop that may have lost written records (engine/boot.go); 0 when
	// none. It is cleared when the copy moves to a later epoch
	// (AdvanceEpoch) or ClearUnsure says the copy may go on.
	UnsureEpoch uint64 `json:"unsure_epoch,omitempty"`
	// TailsSeq is the group (commit.go) that wrote this metadata: a tails
	// entry of that group or an earlier one does not apply to it
	// (tails.go). 0 in metadata written before tails entries existed.
	TailsSeq uint64 `json:"tails_seq,omitempty"`
}

type cutIntent struct {
	RecordTail      uint64 `json:"record_tail"`
	CursorEventTail uint64 `json:"cursor_event_tail"`
	// Chain and Bytes after the cut, computed before anything is deleted.
	Chain uint64 `json:"chain"`
	Bytes uint64 `json:"bytes"`
	// ResetCursors: the cut went below the copy's retained cursor events,
	// so the cursor event log restarts empty at offset 0 (CursorEventTail
	// is then 0) and the copy takes the new owner's cursor state when it
	// next follows (cut.go).
	ResetCursors bool `json:"reset_cursors,omitempty"`
}

func encodeMeta(m *meta) []byte { return appendMeta(nil, m) }

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, fmt.Errorf("%w: meta: %v", ErrCorrupt, err)
	}
	return m, nil
}

// snapshot is the cursor state folded up to Boundary (the cursor event
// offset it covers, exclusive).
type snapshot struct {
	Boundary uint64            `json:"boundary"`
	Cursors  map[string]uint64 `json:"cursors,omitempty"`
}

func encodeSnapshot(s *snapshot) []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("storage: encoding snapshot: %v", err))
	}
	return b
}

func decodeSnapshot(b []byte) (snapshot, error) {
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return snapshot{}, fmt.Errorf("%w: cursor snapshot: %v", ErrCorrupt, err)
	}
	return s, nil
}
