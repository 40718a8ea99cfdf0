package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The producer table: per stream copy, what idempotent publish (docs/api.md)
// needs to know about each producer, rebuilt from the record log. doc.go
// ("Idempotent publish") states the rules; this file keeps the table in
// memory and encodes it for the persisted checkpoints (checkpoint.go).

// Defaults for Options.
const (
	// DefaultMaxProducers is how many producers a stream copy tracks; the
	// least recently appended one is evicted beyond it.
	DefaultMaxProducers = 10000
	// DefaultProducerWindow is how many of a producer's latest records a
	// copy keeps the offsets of: the dedupe window. It is the broker's
	// largest publish (--max-batch-records), so a retry of any one batch
	// whose answer was lost can be answered as duplicates.
	DefaultProducerWindow = 1 << 16
	// DefaultProducerBatches is how many runs of a producer's records at
	// consecutive offsets (each batch is one; consecutive batches of a
	// producer merge into one) a copy keeps: the window ends at the
	// oldest. Memory is bounded by runs, not records (a run is 16 bytes),
	// as Kafka bounds its producer state by batches (five).
	DefaultProducerBatches = 256
	// DefaultProducerCheckpointRecords is how many records may follow the
	// persisted producer table before a new one is written (raised to the
	// table's size in runs, so writing it costs O(1) per record).
	DefaultProducerCheckpointRecords = 8192
)

// MaxProducerID is the longest producer id accepted, in bytes.
const MaxProducerID = 256

// sequenced reports whether a record takes part in deduplication: it needs a
// producer id and a sequence; sequence 0 is proto3's "not set".
func sequenced(r *Record) bool {
	return r.ProducerID != "" && r.Sequence != 0
}

// producerTable maps producer ids to their state, with an LRU list ordered by
// each producer's last appended record. Nothing but appends (and rebuilds)
// changes it, not even a duplicate lookup, so it is a function of the log:
// the owner, its followers and a reopened copy that replay the same records
// hold the same table. Callers hold the stream's assigned.mu.
type producerTable struct {
	maxProducers int
	window       uint64 // records per producer
	batches      int    // runs per producer

	byID           map[string]*producerState
	oldest, newest *producerState
	// runs is the number of runs held by every producer: the measure of
	// the table's size (memory and encoding).
	runs int
}

// producerState is one producer's last sequence and the offsets of its last
// count records (sequences last-count+1 .. last). A producer's sequences are
// dense from its first record on (a restart begins a new window), so the
// offsets are kept as runs of consecutive offsets: a batch of n records is
// one run. The window is the newest records within both limits: at most
// window records and at most batches runs.
type producerState struct {
	id    string
	last  uint64
	count uint64
	// runs is a ring of n runs from start, oldest first, whose lengths sum
	// to count. It grows up to batches runs and no further.
	runs     []seqRun
	start, n int

	older, newer *producerState
}

// run returns the i-th oldest run.
func (p *producerState) run(i int) *seqRun {
	j := p.start + i
	if j >= len(p.runs) {
		j -= len(p.runs)
	}
	return &p.runs[j]
}

// addRun appends r as the newest run, growing the ring up to limit runs.
func (p *producerState) addRun(r seqRun, limit int) {
	if p.n == len(p.runs) {
		buf := make([]seqRun, max(p.n+1, min(2*p.n, limit), 2))
		for i := range p.n {
			buf[i] = *p.run(i)
		}
		p.runs, p.start = buf, 0
	}
	*p.run(p.n) = r
	p.n++
}

// dropRun removes the oldest run.
func (p *producerState) dropRun() {
	if p.start++; p.start == len(p.runs) {
		p.start = 0
	}
	p.n--
}

// seqRun is n consecutive sequences stored at consecutive offsets from off.
type seqRun struct {
	off uint64
	n   uint64
}

func newProducerTable(maxProducers, window, batches int) *producerTable {
	return &producerTable{
		maxProducers: max(1, maxProducers),
		window:       uint64(max(1, window)),
		batches:      max(1, batches),
		byID:         make(map[string]*producerState),
	}
}

// empty returns a table with the same limits and no producers.
func (t *producerTable) empty() *producerTable {
	return newProducerTable(t.maxProducers, int(t.window), t.batches)
}

// apply records that the log holds a record of producer id with sequence
// seq at offset off. It is the one rule for owner appends, replicated
// appends and replay: a sequence that does not follow the producer's last
// one starts a new window (the owner took it as an unknown producer's first
// record, or the producer had been evicted there).
func (t *producerTable) apply(id string, seq, off uint64) {
	if p := t.newest; p != nil && p.id == id && seq == p.last+1 {
		// The producer appended last, continuing: a batch's second and
		// later records. No map lookup, no move in the LRU list.
		p.last = seq
		t.push(p, off)
		return
	}
	p := t.byID[id]
	switch {
	case p == nil:
		if len(t.byID) >= t.maxProducers {
			t.evict(t.oldest)
		}
		p = &producerState{id: id}
		t.byID[id] = p
	case seq == p.last+1:
		t.unlink(p)
	default:
		t.unlink(p)
		t.runs -= p.n
		p.start, p.n, p.count = 0, 0, 0
	}
	p.last = seq
	t.push(p, off)
	t.linkNewest(p)
}

// push adds the record at off as p's newest and trims the window.
func (t *producerTable) push(p *producerState, off uint64) {
	if p.n > 0 {
		if r := p.run(p.n - 1); r.off+r.n == off {
			r.n++
			p.count++
			t.trim(p, t.window, t.batches)
			return
		}
	}
	// Make room first, so the ring never needs more than batches runs.
	t.trim(p, t.window-1, t.batches-1)
	p.addRun(seqRun{off: off, n: 1}, t.batches)
	t.runs++
	p.count++
}

// trim drops p's oldest offsets beyond limit records, and its oldest runs
// beyond runs.
func (t *producerTable) trim(p *producerState, limit uint64, runs int) {
	for p.count > limit || p.n > runs {
		excess := p.count - min(limit, p.count)
		r := p.run(0)
		if p.n <= runs && r.n > excess {
			r.off += excess
			r.n -= excess
			p.count -= excess
			return
		}
		p.count -= r.n
		p.dropRun()
		t.runs--
	}
}

// offset returns where p's record with sequence seq is, if the window holds it.
func (p *producerState) offset(seq uint64) (uint64, bool) {
	if seq > p.last || p.last-seq >= p.count {
		return 0, false
	}
	end := p.last // the sequence of the last record of run i
	for i := p.n - 1; i >= 0; i-- {
		r := p.run(i)
		first := end - (r.n - 1)
		if seq >= first {
			return r.off + (seq - first), true
		}
		end = first - 1
	}
	return 0, false
}

// first is the lowest sequence in p's window.
func (p *producerState) first() uint64 { return p.last - p.count + 1 }

func (t *producerTable) evict(p *producerState) {
	if p == nil {
		return
	}
	t.unlink(p)
	delete(t.byID, p.id)
	t.runs -= p.n
}

func (t *producerTable) unlink(p *producerState) {
	if p.older != nil {
		p.older.newer = p.newer
	} else if t.oldest == p {
		t.oldest = p.newer
	}
	if p.newer != nil {
		p.newer.older = p.older
	} else if t.newest == p {
		t.newest = p.older
	}
	p.older, p.newer = nil, nil
}

func (t *producerTable) linkNewest(p *producerState) {
	p.older, p.newer = t.newest, nil
	if t.newest != nil {
		t.newest.newer = p
	} else {
		t.oldest = p
	}
	t.newest = p
}

// SequenceError says why records[Index] of an owner's batch was refused; it
// wraps ErrSequenceGap, ErrBelowWindow or ErrSequenceOrder. Nothing of the
// batch was stored.
type SequenceError struct {
	Err        error
	Index      int
	ProducerID string
	Sequence   uint64
	// Expected is the sequence that would have been accepted next (gap and
	// order errors); First is the lowest sequence in the window (below
	// window errors).
	Expected, First uint64
}

func (e *SequenceError) Error() string {
	return fmt.Sprintf("%v: record %d: %s", e.Err, e.Index, e.Detail())
}

// Detail explains the error in terms of the request, for the RPC edge.
func (e *SequenceError) Detail() string {
	switch {
	case errors.Is(e.Err, ErrSequenceGap):
		return fmt.Sprintf("sequence %d of producer %q skips ahead; the next sequence is %d", e.Sequence, e.ProducerID, e.Expected)
	case errors.Is(e.Err, ErrBelowWindow):
		return fmt.Sprintf("sequence %d of producer %q is older than the dedupe window, which starts at %d", e.Sequence, e.ProducerID, e.First)
	}
	return fmt.Sprintf("sequence %d of producer %q repeats an earlier record after records new to this publish; the next sequence is %d", e.Sequence, e.ProducerID, e.Expected)
}

func (e *SequenceError) Unwrap() error { return e.Err }

// classify checks an owner's batch against the table without changing it.
// It returns the original offsets of the batch's duplicate prefix: records
// [0, len(dups)) are already in the log, the rest are new. Any record that
// is neither (a gap, a sequence below the window, a duplicate after a new
// record, a sequence out of order inside the batch) fails the whole batch.
func (t *producerTable) classify(recs []Record) (dups []uint64, err error) {
	var (
		pending batchSeqs // producers with new records earlier in the batch
		newSeen bool
	)
	for i := range recs {
		r := &recs[i]
		if !sequenced(r) {
			newSeen = true
			continue
		}
		seqErr := func(e error, expected, first uint64) error {
			return &SequenceError{Err: e, Index: i, ProducerID: r.ProducerID, Sequence: r.Sequence, Expected: expected, First: first}
		}
		if last, ok := pending.get(r.ProducerID); ok {
			switch {
			case r.Sequence == last+1:
				pending.set(r.ProducerID, r.Sequence)
			case r.Sequence > last+1:
				return nil, seqErr(ErrSequenceGap, last+1, 0)
			default:
				return nil, seqErr(ErrSequenceOrder, last+1, 0)
			}
			continue
		}
		p := t.byID[r.ProducerID]
		switch {
		case p != nil && r.Sequence <= p.last:
			off, ok := p.offset(r.Sequence)
			if !ok {
				return nil, seqErr(ErrBelowWindow, 0, p.first())
			}
			if newSeen {
				return nil, seqErr(ErrSequenceOrder, p.last+1, 0)
			}
			dups = append(dups, off)
			continue
		case p != nil && r.Sequence > p.last+1:
			return nil, seqErr(ErrSequenceGap, p.last+1, 0)
		}
		// The producer's next sequence, or an unknown producer's first
		// record (any sequence: it may have been evicted, or be new).
		newSeen = true
		pending.set(r.ProducerID, r.Sequence)
	}
	return dups, nil
}

// batchSeqs maps producer ids to the last sequence seen in one batch; most
// batches come from one producer, which needs no map.
type batchSeqs struct {
	id   string
	last uint64
	more map[string]uint64
}

func (b *batchSeqs) get(id string) (uint64, bool) {
	if b.id == id && id != "" {
		return b.last, true
	}
	v, ok := b.more[id]
	return v, ok
}

func (b *batchSeqs) set(id string, seq uint64) {
	switch b.id {
	case "", id:
		b.id, b.last = id, seq
	default:
		if b.more == nil {
			b.more = make(map[string]uint64)
		}
		b.more[id] = seq
	}
}

// Encoding of the table for a checkpoint, split into chunks of about
// maxChunk bytes so that no value exceeds one Badger entry:
//
//	chunk:    version(1) | uvarint producer count | producer...
//	producer: uvarint len, id | uvarint last | uvarint count |
//	          uvarint run count | (uvarint offset delta, uvarint n)...
//
// Producers go oldest first, so decoding in chunk order restores the LRU
// order. A run's offset delta is from the end of the previous run (from 0
// for the first).
const producerTableVersion byte = 1

func (t *producerTable) encode(maxChunk int) [][]byte {
	var (
		chunks [][]byte
		cur    []byte
		n      uint64
	)
	flush := func() {
		hdr := append([]byte{producerTableVersion}, binary.AppendUvarint(nil, n)...)
		chunks = append(chunks, append(hdr, cur...))
		cur, n = nil, 0
	}
	for p := t.oldest; p != nil; p = p.newer {
		cur = appendString(cur, p.id)
		cur = binary.AppendUvarint(cur, p.last)
		cur = binary.AppendUvarint(cur, p.count)
		cur = binary.AppendUvarint(cur, uint64(p.n))
		end := uint64(0)
		for i := range p.n {
			r := p.run(i)
			cur = binary.AppendUvarint(cur, r.off-end)
			cur = binary.AppendUvarint(cur, r.n)
			end = r.off + r.n
		}
		n++
		if len(cur) >= maxChunk {
			flush()
		}
	}
	if n > 0 || len(chunks) == 0 {
		flush()
	}
	return chunks
}

// decodeChunk adds one chunk's producers to t as the newest ones, applying
// t's limits (which may be lower than when the chunk was written).
func (t *producerTable) decodeChunk(b []byte) error {
	d := decoder{b: b}
	if v := d.byte(); v != producerTableVersion {
		return fmt.Errorf("%w: producer table version %d", ErrCorrupt, v)
	}
	n := d.uvarint()
	for i := uint64(0); i < n && d.err == nil; i++ {
		p := &producerState{id: d.string(), last: d.uvarint(), count: d.uvarint()}
		nr := d.uvarint()
		if d.err == nil && nr > uint64(len(d.b)) {
			d.err = fmt.Errorf("%w: %d runs in %d bytes", ErrCorrupt, nr, len(d.b))
		}
		end, sum := uint64(0), uint64(0)
		for j := uint64(0); j < nr && d.err == nil; j++ {
			delta, n := d.uvarint(), d.uvarint()
			r := seqRun{off: end + delta, n: n}
			if n == 0 || n > p.count-min(sum, p.count) || r.off < end || r.off+n < r.off {
				d.err = fmt.Errorf("%w: producer %q: run %d of %d records at %d", ErrCorrupt, p.id, j, n, r.off)
				break
			}
			p.runs = append(p.runs, r)
			p.n++
			end, sum = r.off+r.n, sum+r.n
		}
		if d.err != nil {
			break
		}
		if sum != p.count || p.count == 0 || p.count > p.last || p.id == "" {
			return fmt.Errorf("%w: producer %q: %d sequences up to %d in runs of %d", ErrCorrupt, p.id, p.count, p.last, sum)
		}
		if old := t.byID[p.id]; old != nil {
			return fmt.Errorf("%w: producer %q twice", ErrCorrupt, p.id)
		}
		if len(t.byID) >= t.maxProducers {
			t.evict(t.oldest)
		}
		t.byID[p.id] = p
		t.runs += p.n
		t.trim(p, t.window, t.batches)
		t.linkNewest(p)
	}
	if d.err != nil {
		return fmt.Errorf("producer table: %w", d.err)
	}
	return nil
}
