package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Record is one record as the log holds it.
type Record struct {
	Offset      uint64
	Epoch       uint64
	Payload     []byte
	Headers     map[string]string
	PublishTime time.Time
	ProducerID  string
	Sequence    uint64
	// Chain is the running checksum over every record up to and including
	// this one (see the function Chain for what it covers).
	Chain uint64
}

// LogEpoch says from which offsets of both logs entries came from an epoch.
type LogEpoch struct {
	Epoch            uint64
	RecordStart      uint64
	CursorEventStart uint64
}

// State is a snapshot of a copy's metadata and tails.
type State struct {
	// Incarnation is the stream incarnation the copy belongs to ("" until set).
	Incarnation      string
	Epoch            uint64
	LogEpochs        []LogEpoch
	SealEpoch        uint64
	SealTransition   string
	SealedLogEpochs  []LogEpoch
	Head             uint64
	RecordTail       uint64
	CursorEventTail  uint64
	Chain            uint64
	Bytes            uint64
	ConfirmWatermark uint64
	// UnsureEpoch: the copy was at this epoch when its store was opened
	// after an unclean stop on a new boot, so records written but not
	// synced then may be missing (DB.MayHaveLostWritten); 0 when not, or
	// once the copy moved past that epoch. Kept across restarts.
	UnsureEpoch uint64
}

// Sealed reports whether the copy is sealed.
func (st State) Sealed() bool { return st.SealEpoch != 0 }

// Stream is one stream copy. Its methods are safe for concurrent use.
//
// Two views of the copy are kept, each a type of its own with the one lock
// that guards it (doc.go, "Locks"). The assigned view (assignedView, under
// its mu) is the metadata after every op handed to the committer: the next
// offsets to assign, the epochs, the cursor state, the producer table. The
// durable view (durableView, under its dmu) is what the committer has
// synced: the tails State reports, readers are bounded by and waiters
// watch. Lock order: admin, then assigned.mu, then durable.dmu;
// prodGarbage's lock (checkpointGarbage.mu) is a leaf. The committer only
// takes durable.dmu (and the leaf), so a caller may block on a full queue
// while holding assigned.mu. A method that needs both views (State, read)
// stays on Stream and takes the locks in that order.
type Stream struct {
	db   *DB
	name string

	metaKey, snapKey       []byte
	recPrefix, eventPrefix []byte
	prodPrefix             []byte

	// admin serialises the multi-step operations (Cut, ResetTo, retention)
	// against each other. It guards no state: what those operations change
	// is under assigned.mu and durable.dmu, taken after admin.
	admin sync.Mutex

	// The assigned view, under assigned.mu.
	assigned assignedView
	// closedFlag is set with assigned.closed and durable.dclosed (Closed).
	closedFlag atomic.Bool

	// prodGarbage: checkpoints no durable meta names any more, whose
	// chunks the next checkpoint deletes (its own leaf lock).
	prodGarbage checkpointGarbage

	// The durable and written views, under durable.dmu.
	durable durableView
	// onDurable is told each new durable record tail (OnDurable).
	onDurable durableHook

	// Owned by the committer goroutine. cmFull is the newest metadata
	// written whole; cmInTails: the stream's newest state since is in
	// tails entries only, cmListed: it is in db.cm.dirty (tails.go).
	cmMeta    *meta
	cmVersion uint64
	cmTouched bool
	cmFull    *meta
	cmInTails bool
	cmListed  bool
}

// assignedView is a copy's assigned view (the metadata after every op
// handed to the committer) with the lock that guards it, mu. Only callers
// take mu, never the committer (commit.go), so one may wait for room in the
// queue while holding it.
type assignedView struct {
	mu      sync.Mutex
	m       meta   // assigned view
	version uint64 // of m; see op.version
	cursors map[string]uint64
	// snapBoundary is the boundary of the newest snapshot handed to the
	// committer, snapBytes its encoded size, evBytes the encoded bytes of
	// the cursor events assigned after it (the snapshot rule, cursor.go).
	snapBoundary uint64
	snapBytes    int
	evBytes      int
	// producers is the producer table of the assigned view (producers.go);
	// prodBoundary the record offset of the newest checkpoint handed to the
	// committer, or where the table's rebuild started.
	producers    *producerTable
	prodBoundary uint64
	closed       bool
	// roleFence is the epoch of a role change under way (FenceBelow): owner
	// writes below it and replicated batches while the copy's epoch is
	// below it are refused. In memory only.
	roleFence uint64
}

// durableView is a copy's durable view (what the committer has synced) and
// written view (what Badger has taken), with the lock that guards them,
// dmu: the tails State reports, readers are bounded by and waiters watch.
// Stream holds it as its durable field; the committer takes only dmu.
type durableView struct {
	dmu    sync.Mutex
	dTail  uint64
	dChain uint64
	// wTail and wChain are the written view: records Badger has taken
	// (they are in the OS page cache) but not necessarily fsynced yet, at
	// or ahead of the durable view (see WrittenTail).
	wTail   uint64
	wChain  uint64
	dEvTail uint64
	// dEvHead is the lowest cursor event ReadCursorEvents serves: events
	// below it are compacted (or being compacted) away; dSnap is the
	// durable cursor snapshot, whose boundary is at or above dEvHead and
	// which stands for the events below it (compact.go).
	dEvHead   uint64
	dSnap     *snapshot
	watermark uint64
	// wmDirty: the watermark was raised and the stream is queued for the
	// next watermark flush; wmPersisted is the highest watermark written
	// with metadata.
	wmDirty     bool
	wmPersisted uint64
	dclosed     bool
	waiters     map[waitKey]chan struct{}
	// tail holds the newest written records (tailcache.go).
	tail tailCache
}

// Name returns the stream's name.
func (s *Stream) Name() string { return s.name }

// State returns the copy's metadata with its durable tails.
func (s *Stream) State() State {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	return State{
		Incarnation:      s.assigned.m.Incarnation,
		Epoch:            s.assigned.m.Epoch,
		LogEpochs:        slices.Clone(s.assigned.m.LogEpochs),
		SealEpoch:        s.assigned.m.SealEpoch,
		SealTransition:   s.assigned.m.SealTransition,
		SealedLogEpochs:  slices.Clone(s.assigned.m.SealedLogEpochs),
		Head:             s.assigned.m.Head,
		RecordTail:       s.durable.dTail,
		CursorEventTail:  s.durable.dEvTail,
		Chain:            s.durable.dChain,
		Bytes:            s.assigned.m.Bytes,
		ConfirmWatermark: s.durable.watermark,
		UnsureEpoch:      s.assigned.m.UnsureEpoch,
	}
}

// Status is what a copy's heartbeat reports of its stream (Stream.Status).
type Status struct {
	Epoch, SealEpoch, Head, RecordTail, CursorEventTail uint64
	// Incarnation is State's: a string, so no copy.
	Incarnation string
}

// Status returns the epochs and log ends without State's copies of the
// log epochs: the heartbeat reads it for every copy each interval, and at
// thousands of copies State's two slice copies each were most of what an
// idle broker allocated.
func (s *Stream) Status() Status {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	return Status{
		Incarnation:     s.assigned.m.Incarnation,
		Epoch:           s.assigned.m.Epoch,
		SealEpoch:       s.assigned.m.SealEpoch,
		Head:            s.assigned.m.Head,
		RecordTail:      s.durable.dTail,
		CursorEventTail: s.durable.dEvTail,
	}
}

func (db *DB) newStream(name string) *Stream {
	return &Stream{
		db:          db,
		name:        name,
		metaKey:     streamKey(kindMeta, name),
		snapKey:     streamKey(kindSnapshot, name),
		recPrefix:   streamKey(kindRecord, name),
		eventPrefix: streamKey(kindEvent, name),
		prodPrefix:  streamKey(kindProducers, name),
		assigned: assignedView{
			producers: newProducerTable(db.maxProducers, db.producerWindow, db.producerBatches),
			cursors:   map[string]uint64{},
		},
		durable: durableView{
			waiters: map[waitKey]chan struct{}{},
			tail:    tailCache{max: db.tailCacheBytes, total: &db.tailCacheUsed, limit: db.tailCacheLimit},
		},
	}
}

// loadStream reads a stream's metadata (creating it when absent), completes
// an interrupted cut or purge, drops entries past the durable tails and
// rebuilds the cursor state from the snapshot and the events after it.
func (db *DB) loadStream(name string) (*Stream, error) {
	s := db.newStream(name)
	ctx := context.Background()
	var (
		m        meta
		snap     snapshot
		snapSize int
		found    bool
	)
	err := db.eng.View(func(txn *engine.Txn) error {
		item, err := txn.Get(s.metaKey)
		if errors.Is(err, engine.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		if err := item.Value(func(v []byte) (err error) {
			m, err = decodeMeta(v)
			return err
		}); err != nil {
			return err
		}
		item, err = txn.Get(s.snapKey)
		if errors.Is(err, engine.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) (err error) {
			snapSize = len(v)
			snap, err = decodeSnapshot(v)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: loading stream %q: %w", name, err)
	}
	if m.Dropping {
		return nil, fmt.Errorf("%w: stream %q is being dropped", ErrClosed, name)
	}
	s.assigned.m = m
	s.cmMeta = &m
	if found {
		s.cmFull = s.cmMeta
	}
	s.durable.dTail, s.durable.dChain, s.durable.dEvTail = m.RecordTail, m.Chain, m.CursorEventTail
	s.durable.wTail, s.durable.wChain = s.durable.dTail, s.durable.dChain
	s.durable.watermark = min(m.ConfirmWatermark, m.RecordTail)
	s.durable.wmPersisted = s.durable.watermark
	s.durable.dSnap = &snapshot{}
	if !found {
		s.assigned.m = meta{}
		// A new copy's first metadata is queued, not waited for: an empty
		// copy lost to a crash is the same as none, and its assignment
		// opens it again. Waiting here would hold the caller (the broker's
		// assignment watch, taking in thousands of new streams) for one
		// group commit per stream. Every later write of the stream is
		// queued behind it, and Drop waits for it (DB.Drop).
		if err := s.queueMeta(ctx); err != nil {
			return nil, err
		}
		return s, nil
	}

	// Entries past the tails were never acknowledged: a batch split by
	// Badger's transaction bound that crashed before its metadata.
	if err := s.truncateRecords(ctx, m.RecordTail); err != nil {
		return nil, fmt.Errorf("storage: loading stream %q: %w", name, err)
	}
	if err := db.deleteRange(ctx, s.eventPrefix, m.CursorEventTail, maxOffset); err != nil {
		return nil, fmt.Errorf("storage: loading stream %q: %w", name, err)
	}
	// A snapshot is written with (or before, in a batch split by Badger's
	// transaction bound) the metadata that counts its events, so it may
	// claim a boundary past a tail a crash left: it then stands for the
	// events up to the tail.
	snap.Boundary = min(snap.Boundary, m.CursorEventTail)
	s.assigned.snapBoundary, s.assigned.snapBytes = snap.Boundary, snapSize
	s.durable.dSnap = &snapshot{Boundary: snap.Boundary, Cursors: maps.Clone(snap.Cursors)}
	s.durable.dEvHead = min(m.CursorEventsPurged, snap.Boundary)
	if err := s.rebuildCursors(snap); err != nil {
		return nil, fmt.Errorf("storage: loading stream %q: %w", name, err)
	}
	if db.checkAll && m.Cut == nil {
		// torn.go: records a value log GC moved before a power loss,
		// found nowhere, though the metadata claims them.
		if err := s.cutTornTail(ctx); err != nil {
			return nil, err
		}
	}
	s.assigned.mu.Lock()
	cutting := s.assigned.m.Cut != nil
	s.assigned.mu.Unlock()
	if cutting {
		// finishCut also rebuilds the producer table at the cut.
		if err := s.finishCut(ctx); err != nil {
			return nil, err
		}
	}
	if s.assigned.m.Purged < s.assigned.m.Head {
		if err := s.purge(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.loadProducers(ctx, !cutting); err != nil {
		return nil, err
	}
	// A compaction a stop interrupted (between the durable snapshot and
	// the last delete, or inside the deletes) is finished here.
	if err := s.compactCursorEvents(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// rebuildCursors sets the cursor state to snap plus the events after its
// boundary up to the assigned cursor event tail.
func (s *Stream) rebuildCursors(snap snapshot) error {
	cursors := make(map[string]uint64, len(snap.Cursors))
	for k, v := range snap.Cursors {
		cursors[k] = v
	}
	from := min(snap.Boundary, s.assigned.m.CursorEventTail)
	bytes := 0
	err := s.scanEvents(from, s.assigned.m.CursorEventTail, func(ev CursorEvent) bool {
		cursors[ev.Cursor] = ev.Position
		bytes += len(encodeEvent(nil, &ev))
		return true
	})
	if err != nil {
		return err
	}
	s.assigned.cursors = cursors
	s.assigned.evBytes = bytes
	return nil
}

// commitMeta writes the assigned metadata after applying change to it, and
// waits until it is durable. change runs under assigned.mu; an error from it
// aborts with nothing changed.
func (s *Stream) commitMeta(ctx context.Context, change func(m *meta) error) error {
	return s.commitOp(ctx, change, nil)
}

// queueMeta queues the assigned metadata as it is and returns without
// waiting for it to be durable: nobody waits on the op (op.done is nil).
func (s *Stream) queueMeta(ctx context.Context) error {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	if s.assigned.closed {
		return s.closedErr()
	}
	o := &op{s: s}
	o.meta, o.version = s.assigned.snapshotMeta()
	return s.enqueueLocked(ctx, o, s.assigned.m)
}

// commitOp is commitMeta with build, which may add entries and an apply
// function to the op (under assigned.mu, after change).
func (s *Stream) commitOp(ctx context.Context, change func(m *meta) error, build func(o *op)) error {
	// A context already done changes nothing: enqueue's select would
	// otherwise pick the queue or the cancellation at random.
	if err := ctx.Err(); err != nil {
		return err
	}
	s.assigned.mu.Lock()
	if s.assigned.closed {
		s.assigned.mu.Unlock()
		return s.closedErr()
	}
	prev := s.assigned.m
	if change != nil {
		if err := change(&s.assigned.m); err != nil {
			s.assigned.m = prev
			s.assigned.mu.Unlock()
			return err
		}
	}
	o := &op{s: s, done: make(chan error, 1)}
	if build != nil {
		build(o)
	}
	o.meta, o.version = s.assigned.snapshotMeta()
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.mu.Unlock()
		return err
	}
	s.assigned.mu.Unlock()
	return wait(ctx, o)
}

// enqueueLocked enqueues o (built under assigned.mu); if it cannot, the
// assigned metadata goes back to prev.
func (s *Stream) enqueueLocked(ctx context.Context, o *op, prev meta) error {
	if err := s.db.enqueue(ctx, o); err != nil {
		s.assigned.m = prev
		// Status may have shown the change between the two assignments.
		s.db.statusGen.Add(1)
		return err
	}
	return nil
}

func (s *Stream) closedErr() error {
	return fmt.Errorf("%w: stream %q", ErrClosed, s.name)
}

// close marks the stream closed and wakes every waiter.
func (s *Stream) close() {
	s.assigned.mu.Lock()
	s.assigned.closed = true
	s.assigned.mu.Unlock()
	s.closedFlag.Store(true)
	s.durable.dmu.Lock()
	s.durable.dclosed = true
	s.durable.tail.clear()
	s.durable.wakeAllLocked()
	s.durable.dmu.Unlock()
}

// checkOwnerLocked is the gate for owner writes (Append, CommitCursor).
func (s *Stream) checkOwnerLocked(epoch uint64) error {
	if s.assigned.closed {
		return s.closedErr()
	}
	if s.assigned.m.Cut != nil {
		return fmt.Errorf("%w: stream %q: cut in progress", ErrFenced, s.name)
	}
	if s.assigned.m.SealEpoch != 0 {
		if epoch < s.assigned.m.SealEpoch {
			return fmt.Errorf("%w: %w: epoch %d below fence epoch %d", ErrSealed, ErrFenced, epoch, s.assigned.m.SealEpoch)
		}
		return fmt.Errorf("%w: at epoch %d (transition %q)", ErrSealed, s.assigned.m.SealEpoch, s.assigned.m.SealTransition)
	}
	if epoch < s.assigned.m.Epoch {
		return fmt.Errorf("%w: epoch %d below copy epoch %d", ErrFenced, epoch, s.assigned.m.Epoch)
	}
	if epoch < s.assigned.roleFence {
		return fmt.Errorf("%w: epoch %d: role change to epoch %d under way", ErrFenced, epoch, s.assigned.roleFence)
	}
	if epoch > s.assigned.m.Epoch {
		return fmt.Errorf("%w: epoch %d above copy epoch %d (role change not applied)", ErrFenced, epoch, s.assigned.m.Epoch)
	}
	return nil
}

// noteEpoch records in LogEpochs that entries from epoch start at the given
// tails, when epoch is above the last log epoch. Copy-on-write: op snapshots
// share the slice.
func noteEpoch(m *meta, epoch, recordStart, eventStart uint64) {
	if n := len(m.LogEpochs); n > 0 && m.LogEpochs[n-1].Epoch >= epoch {
		return
	}
	m.LogEpochs = addLogEpoch(m.LogEpochs, LogEpoch{Epoch: epoch, RecordStart: recordStart, CursorEventStart: eventStart})
}

// addLogEpoch returns a new slice with e appended; a last entry that starts
// at the same tails covers no entries and is replaced (collapse), so the
// list keeps one entry per epoch that holds entries, plus the current one.
// A last entry of the same epoch already covers e: les is returned as is.
func addLogEpoch(les []LogEpoch, e LogEpoch) []LogEpoch {
	if n := len(les); n > 0 && les[n-1].Epoch == e.Epoch {
		return les
	}
	out := slices.Clone(les)
	if n := len(out); n > 0 && out[n-1].RecordStart == e.RecordStart && out[n-1].CursorEventStart == e.CursorEventStart {
		out[n-1] = e
		return out
	}
	return append(out, e)
}

// Append appends recs as the owner at epoch: offsets from the record tail,
// the epoch stamped, PublishTime set to now where zero, the chain computed.
// It returns the stored records once they are fsynced. Concurrent appends
// share fsyncs (engine/commit.go). If ctx ends while waiting, the records may
// still become durable; the caller cannot tell, as with any lost reply.
//
// Records with a producer id and a sequence are deduplicated as
// AppendIdempotent says; a duplicate prefix of the batch is not stored
// again and not returned (AppendIdempotent reports where it is).
func (s *Stream) Append(ctx context.Context, epoch uint64, recs []Record) ([]Record, error) {
	res, err := s.AppendIdempotent(ctx, epoch, recs)
	if err != nil {
		return nil, err
	}
	return res.Stored, nil
}

// AppendResult is the outcome of AppendIdempotent.
type AppendResult struct {
	// Offsets[i] is where recs[i] is in the log: where this call stored
	// it, or for a duplicate where the original is.
	Offsets []uint64
	// Duplicate[i] reports that recs[i] was already in the log (its
	// producer id and sequence are in the dedupe window): nothing was
	// stored for it. Duplicates are always a prefix of the batch.
	Duplicate []bool
	// Stored are the records this call stored, as stored, in order.
	Stored []Record
}

// AppendIdempotent is Append for idempotent publish (doc.go, "Idempotent
// publish"). Under the lock that assigns offsets it checks every record
// that has a producer id and a sequence against the producer table: a
// duplicate within the window is answered with its original offset and not
// stored, the producer's next sequence (or any sequence of an unknown
// producer) is appended, anything else fails the whole batch with a
// *SequenceError and stores nothing. Duplicates may only form a prefix of
// the batch (a retry of a batch that partly reached this copy). It returns
// once everything it reports is durable: the stored records, and for a
// batch of duplicates only, the originals.
func (s *Stream) AppendIdempotent(ctx context.Context, epoch uint64, recs []Record) (AppendResult, error) {
	if len(recs) == 0 {
		return AppendResult{}, nil
	}
	now := time.Now()
	out := make([]Record, len(recs))
	estimate := 1 // newSegmentBuilder
	for i := range recs {
		out[i] = recs[i]
		if out[i].PublishTime.IsZero() {
			out[i].PublishTime = now
		}
		out[i].PublishTime = fromUnixNanos(out[i].PublishTime.UnixNano())
		size := recordSize(&out[i])
		if n := size + 32; n > s.db.maxEntryBytes {
			return AppendResult{}, fmt.Errorf("%w: record %d of %d bytes above the %d-byte limit", ErrTooLarge, i, n, s.db.maxEntryBytes)
		}
		estimate += size + segmentSlack
		if n := len(out[i].ProducerID); n > MaxProducerID {
			return AppendResult{}, fmt.Errorf("%w: record %d: producer id of %d bytes above the %d-byte limit", ErrInvalidArgument, i, n, MaxProducerID)
		}
	}

	s.assigned.mu.Lock()
	if err := s.checkOwnerLocked(epoch); err != nil {
		s.assigned.mu.Unlock()
		return AppendResult{}, err
	}
	dups, err := s.assigned.producers.classify(out)
	if err != nil {
		s.assigned.mu.Unlock()
		return AppendResult{}, err
	}
	res := AppendResult{Offsets: make([]uint64, len(out)), Duplicate: make([]bool, len(out))}
	for i, off := range dups {
		res.Offsets[i], res.Duplicate[i] = off, true
	}
	if len(dups) == len(out) {
		s.assigned.mu.Unlock()
		if err := s.waitOriginals(ctx, out, dups); err != nil {
			return AppendResult{}, err
		}
		return res, nil
	}
	fresh := out[len(dups):]
	prev := s.assigned.m
	noteEpoch(&s.assigned.m, epoch, s.assigned.m.RecordTail, s.assigned.m.CursorEventTail)
	o := &op{s: s}
	chain := s.assigned.m.Chain
	// Duplicates were counted in the estimate too: a buffer a little
	// larger than needed, never one grown by copying.
	seg := newSegmentBuilder(s.recPrefix, s.db.maxEntryBytes, estimate)
	for i := range fresh {
		r := &fresh[i]
		r.Offset = s.assigned.m.RecordTail + uint64(i)
		r.Epoch = epoch
		r.Chain = Chain(chain, r)
		chain = r.Chain
		s.assigned.m.Bytes += uint64(seg.add(o, r))
		res.Offsets[len(dups)+i] = r.Offset
	}
	seg.flush(o)
	s.assigned.m.RecordTail += uint64(len(fresh))
	s.assigned.m.Chain = chain
	o.meta, o.version = s.assigned.snapshotMeta()
	o.done = make(chan error, 1)
	tail := s.assigned.m.RecordTail
	o.written = func() { s.durable.advanceWritten(tail, chain, fresh) }
	o.apply = func() { s.advanceDurable(tail, chain) }
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.mu.Unlock()
		return AppendResult{}, err
	}
	// The table changes only once the records are queued: an op that could
	// not be enqueued leaves no trace.
	s.assigned.applyProducersLocked(fresh)
	s.maybeCheckpointProducersLocked(ctx)
	s.assigned.mu.Unlock()
	if err := wait(ctx, o); err != nil {
		return AppendResult{}, err
	}
	res.Stored = fresh
	return res, nil
}

// applyProducersLocked adds records queued for the log to the table.
func (a *assignedView) applyProducersLocked(recs []Record) {
	for i := range recs {
		if r := &recs[i]; sequenced(r) {
			a.producers.apply(r.ProducerID, r.Sequence, r.Offset)
		}
	}
}

// waitOriginals waits until the originals of a batch of duplicates are
// durable: the table takes a record when it is queued, so a retry can find
// it before the first attempt's fsync. Once durable, each original must
// still be where the table said (a cut may have removed it meanwhile).
func (s *Stream) waitOriginals(ctx context.Context, recs []Record, offs []uint64) error {
	need := slices.Max(offs) + 1
	for {
		if err := s.db.usable(); err != nil {
			return err
		}
		s.durable.dmu.Lock()
		closed, tail := s.durable.dclosed, s.durable.dTail
		s.durable.dmu.Unlock()
		if closed {
			return s.closedErr()
		}
		if tail >= need {
			break
		}
		select {
		case <-s.WaitTail(need - 1):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	for i, want := range offs {
		r := &recs[i]
		p := s.assigned.producers.byID[r.ProducerID]
		if p == nil {
			return fmt.Errorf("%w: stream %q: record %d (producer %q sequence %d) left the log while its retry waited", ErrFenced, s.name, want, r.ProducerID, r.Sequence)
		}
		if off, ok := p.offset(r.Sequence); !ok || off != want {
			return fmt.Errorf("%w: stream %q: record %d (producer %q sequence %d) left the log while its retry waited", ErrFenced, s.name, want, r.ProducerID, r.Sequence)
		}
	}
	return nil
}

// Sync waits until every entry handed to the committer for this stream
// before the call (cursor commits, the lazy confirm watermark) is durable.
func (s *Stream) Sync(ctx context.Context) error {
	s.assigned.mu.Lock()
	if s.assigned.closed {
		s.assigned.mu.Unlock()
		return s.closedErr()
	}
	o := &op{s: s, touchWM: true, done: make(chan error, 1)}
	if err := s.db.enqueue(ctx, o); err != nil {
		s.assigned.mu.Unlock()
		return err
	}
	s.assigned.mu.Unlock()
	return wait(ctx, o)
}

// snapshotMeta copies the assigned metadata for an op. Callers hold mu.
func (a *assignedView) snapshotMeta() (*meta, uint64) {
	a.version++
	m := a.m
	return &m, a.version
}

// AppendReplicated appends a follower's batch: records at the owner's
// offsets with their own epochs and chains, and cursor events at the
// owner's event offsets. Both must start exactly at this copy's tails and be
// dense (else ErrOffsetMismatch); each record's chain must follow from the
// previous one (else ErrChainMismatch); no entry may carry an epoch above
// the copy's (else ErrFenced); a sealed copy takes nothing (ErrFenced). On
// any error nothing is stored. It returns once the batch is fsynced.
func (s *Stream) AppendReplicated(ctx context.Context, recs []Record, evs []CursorEvent) error {
	o, err := s.enqueueReplicated(ctx, recs, evs, nil)
	if err != nil || o == nil {
		return err
	}
	return wait(ctx, o)
}

// EnqueueReplicated is AppendReplicated without the wait: the batch is
// checked and queued behind every earlier one, so a follower can receive
// its next batch while this one is being synced and the committer writes
// both with one fsync. The durable tail moves over the batch only once it
// is synced, in queue order (doc.go, "Ordering invariants").
//
// onDurable, when set, is called with the batch's outcome once the durable
// tails moved over it (err nil) or the write failed, exactly once for a
// batch that was queued (never when EnqueueReplicated returns an error or
// the batch is empty). It runs on the committer, between the group's other
// batches, so it must only hand the outcome on (a follower's
// acknowledgement is raised by the committer rather than by a goroutine
// per stream waiting for it): it may read the stream's Tails, and must not
// block, take the stream's other locks, or enqueue.
func (s *Stream) EnqueueReplicated(ctx context.Context, recs []Record, evs []CursorEvent, onDurable func(error)) error {
	_, err := s.enqueueReplicated(ctx, recs, evs, onDurable)
	return err
}

// enqueueReplicated is EnqueueReplicated; the op it returns (nil for an
// empty batch) has a done channel to wait on when onDurable is nil.
func (s *Stream) enqueueReplicated(ctx context.Context, recs []Record, evs []CursorEvent, onDurable func(error)) (*op, error) {
	if len(recs) == 0 && len(evs) == 0 {
		return nil, nil
	}
	for i := range evs {
		if err := validCursorName(evs[i].Cursor); err != nil {
			return nil, fmt.Errorf("cursor event %d: %w", evs[i].Offset, err)
		}
	}
	estimate := 1 // newSegmentBuilder
	for i := range recs {
		size := recordSize(&recs[i])
		if n := size + 32; n > s.db.maxEntryBytes {
			return nil, fmt.Errorf("%w: record %d of %d bytes above the %d-byte limit", ErrTooLarge, recs[i].Offset, n, s.db.maxEntryBytes)
		}
		estimate += size + segmentSlack
	}

	s.assigned.mu.Lock()
	if err := s.checkReplicatedLocked(recs, evs); err != nil {
		s.assigned.mu.Unlock()
		return nil, err
	}
	chain := s.assigned.m.Chain
	if n := len(recs); n > 0 {
		chain = recs[n-1].Chain
	}
	et := s.assigned.m.CursorEventTail
	prev := s.assigned.m
	prevCursors := make(map[string]uint64, len(evs))
	prevSnap := s.assigned.snapState()
	evBytes := 0
	o := &op{s: s}
	seg := newSegmentBuilder(s.recPrefix, s.db.maxEntryBytes, estimate)
	for i := range recs {
		r := &recs[i]
		noteEpoch(&s.assigned.m, r.Epoch, r.Offset, et)
		s.assigned.m.Bytes += uint64(seg.add(o, r))
	}
	seg.flush(o)
	s.assigned.m.RecordTail += uint64(len(recs))
	s.assigned.m.Chain = chain
	for i := range evs {
		ev := &evs[i]
		noteEpoch(&s.assigned.m, ev.Epoch, s.assigned.m.RecordTail, ev.Offset)
		enc := encodeEvent(nil, ev)
		o.add(offsetKey(s.eventPrefix, ev.Offset), enc)
		evBytes += len(enc)
		if _, ok := prevCursors[ev.Cursor]; !ok {
			old, had := s.assigned.cursors[ev.Cursor]
			prevCursors[ev.Cursor] = old
			if !had {
				prevCursors[ev.Cursor] = noCursor
			}
		}
		s.assigned.cursors[ev.Cursor] = ev.Position
	}
	s.assigned.m.CursorEventTail += uint64(len(evs))
	s.assigned.evBytes += evBytes
	s.maybeSnapshotLocked(o)
	o.meta, o.version = s.assigned.snapshotMeta()
	// Nobody waits on done when the outcome goes to onDurable: the
	// follower's path, a batch at a time, makes no channel for it.
	if o.onDurable = onDurable; onDurable == nil {
		o.done = make(chan error, 1)
	}
	tail, evTail := s.assigned.m.RecordTail, s.assigned.m.CursorEventTail
	o.written = func() { s.durable.advanceWritten(tail, chain, recs) }
	o.apply = func() {
		s.advanceDurable(tail, chain)
		s.durable.advanceDurableEvents(evTail)
	}
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.restoreSnapState(prevSnap)
		for k, v := range prevCursors {
			if v == noCursor {
				delete(s.assigned.cursors, k)
			} else {
				s.assigned.cursors[k] = v
			}
		}
		s.assigned.mu.Unlock()
		return nil, err
	}
	// The same table the owner built: a promoted copy deduplicates what
	// the old owner stored (doc.go, "Idempotent publish").
	s.assigned.applyProducersLocked(recs)
	s.maybeCheckpointProducersLocked(ctx)
	s.assigned.mu.Unlock()
	return o, nil
}

// checkReplicatedLocked validates a replicated batch against the assigned
// view without changing anything.
func (s *Stream) checkReplicatedLocked(recs []Record, evs []CursorEvent) error {
	if s.assigned.closed {
		return s.closedErr()
	}
	if s.assigned.m.Cut != nil {
		return fmt.Errorf("%w: stream %q: cut in progress", ErrFenced, s.name)
	}
	if s.assigned.m.SealEpoch != 0 {
		return fmt.Errorf("%w: sealed at fence epoch %d (transition %q)", ErrFenced, s.assigned.m.SealEpoch, s.assigned.m.SealTransition)
	}
	if s.assigned.m.Epoch < s.assigned.roleFence {
		return fmt.Errorf("%w: copy at epoch %d: role change to epoch %d under way", ErrFenced, s.assigned.m.Epoch, s.assigned.roleFence)
	}
	rt, et := s.assigned.m.RecordTail, s.assigned.m.CursorEventTail
	chain := s.assigned.m.Chain
	for i := range recs {
		r := &recs[i]
		if r.Offset != rt+uint64(i) {
			return fmt.Errorf("%w: record %d at position %d of the batch, want %d (record tail %d)", ErrOffsetMismatch, r.Offset, i, rt+uint64(i), rt)
		}
		if r.Epoch > s.assigned.m.Epoch {
			return fmt.Errorf("%w: record %d has epoch %d above copy epoch %d", ErrFenced, r.Offset, r.Epoch, s.assigned.m.Epoch)
		}
		if want := Chain(chain, r); want != r.Chain {
			return fmt.Errorf("%w: record %d carries chain %#x, this copy computes %#x", ErrChainMismatch, r.Offset, r.Chain, want)
		}
		chain = r.Chain
	}
	for i := range evs {
		ev := &evs[i]
		if ev.Offset != et+uint64(i) {
			return fmt.Errorf("%w: cursor event %d at position %d of the batch, want %d (cursor event tail %d)", ErrOffsetMismatch, ev.Offset, i, et+uint64(i), et)
		}
		if ev.Epoch > s.assigned.m.Epoch {
			return fmt.Errorf("%w: cursor event %d has epoch %d above copy epoch %d", ErrFenced, ev.Offset, ev.Epoch, s.assigned.m.Epoch)
		}
	}

	return nil
}

// noCursor marks "absent" when rolling back cursor state.
const noCursor = ^uint64(0)

// maxOffset is the end of every offset range.
const maxOffset = ^uint64(0)

// advanceWritten moves the written record tail over recs (committer, once
// Badger took them, before the sync) and keeps them in the tail cache.
func (d *durableView) advanceWritten(tail, chain uint64, recs []Record) {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if tail > d.wTail {
		if !d.dclosed {
			d.tail.add(recs)
		}
		d.wTail, d.wChain = tail, chain
		d.wakeLocked()
	}
}

// advanceDurable moves the durable record tail (committer, after sync)
// and reports whether it moved. The written step of the same op
// (advanceWritten) ran before it, so the written view is already at or
// past tail.
func (d *durableView) advanceDurable(tail, chain uint64) bool {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if tail <= d.dTail {
		return false
	}
	d.dTail, d.dChain = tail, chain
	d.wakeLocked()
	return true
}

// advanceDurable moves the copy's durable record tail (committer, after
// sync) and tells the OnDurable function, outside durable.dmu.
func (s *Stream) advanceDurable(tail, chain uint64) {
	if s.durable.advanceDurable(tail, chain) {
		s.onDurable.call(tail)
	}
}

// OnDurable has fn told the durable record tail: once now, then each time
// the committer moves it up, after the sync (a Cut or ResetTo, which lower
// it, tell nothing). One function at a time; a later call replaces it.
// Once stop returns fn is not running and is never called again. fn runs
// on the committer: it must not wait for a write of this DB, and it may
// take durable.dmu (SetConfirmWatermark), which the committer does not
// hold while calling it. The owner's confirm tracker counts its own copy
// toward W with it, whoever waited for the records (a publish whose caller
// went away reports nothing), without a goroutine per owned stream.
func (s *Stream) OnDurable(fn func(tail uint64)) (stop func()) {
	h := &s.onDurable
	h.mu.Lock()
	h.fn = fn
	h.gen++
	gen := h.gen
	s.durable.dmu.Lock()
	tail := s.durable.dTail
	s.durable.dmu.Unlock()
	fn(tail)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.gen == gen {
			h.fn = nil
		}
	}
}

// durableHook is the function OnDurable registered, with the lock that
// guards it and is held while it runs, so stop waits out a call under way.
// Lock order: mu before whatever fn takes (durable.dmu included).
type durableHook struct {
	mu  sync.Mutex
	fn  func(tail uint64)
	gen uint64
}

func (h *durableHook) call(tail uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fn != nil {
		h.fn(tail)
	}
}

// advanceDurableEvents moves the durable cursor event tail.
func (d *durableView) advanceDurableEvents(tail uint64) {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if tail > d.dEvTail {
		d.dEvTail = tail
		d.wakeLocked()
		// WaitTail also wakes on new durable cursor events, so a sender
		// shipping both logs can wait on it alone.
		for k, ch := range d.waiters {
			if k.what == waitRecordTail {
				close(ch)
				delete(d.waiters, k)
			}
		}
	}
}

// setDurable replaces the durable view (after Cut and ResetTo, which lower
// it) and wakes every waiter so readers re-check.
func (d *durableView) setDurable(tail, chain, evTail, watermark uint64) {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	d.dTail, d.dChain, d.dEvTail = tail, chain, evTail
	d.dEvHead = min(d.dEvHead, evTail)
	d.wTail, d.wChain = tail, chain
	d.watermark = min(watermark, tail)
	d.wmPersisted = min(d.wmPersisted, d.watermark)
	// The log changed under the cached records: the tail cache holds only
	// what the log holds at each offset.
	d.tail.clear()
	d.wakeAllLocked()
}

// bounds returns the retained head and the durable record tail.
func (s *Stream) bounds() (head, tail uint64) {
	s.assigned.mu.Lock()
	head = s.assigned.m.Head
	s.assigned.mu.Unlock()
	s.durable.dmu.Lock()
	tail = s.durable.dTail
	s.durable.dmu.Unlock()
	return head, tail
}

// Read returns records from offset from, in order, up to the durable tail:
// at most maxRecords records and maxBytes encoded bytes, but at least one
// record when from is below the tail even if it alone is larger. A bound of
// 0 or less is no bound. from must be in [head, tail] (else ErrOutOfRange).
// Filtering by the confirm watermark is the caller's job.
func (s *Stream) Read(from uint64, maxRecords, maxBytes int) ([]Record, error) {
	return s.read(from, maxRecords, maxBytes, false)
}

// ReadWritten is Read bounded by the written record tail instead of the
// durable one: an owner ships records to its followers from here, so their
// fsyncs run alongside its own (see WrittenTail).
func (s *Stream) ReadWritten(from uint64, maxRecords, maxBytes int) ([]Record, error) {
	return s.read(from, maxRecords, maxBytes, true)
}

func (s *Stream) read(from uint64, maxRecords, maxBytes int, written bool) ([]Record, error) {
	s.assigned.mu.Lock()
	head := s.assigned.m.Head
	s.assigned.mu.Unlock()
	// The bound and the cache under one hold of dmu: the cache holds
	// exactly the log at the tail read here.
	s.durable.dmu.Lock()
	tail := s.durable.dTail
	if written {
		tail = s.durable.wTail
	}
	if from < head || from > tail {
		s.durable.dmu.Unlock()
		return nil, fmt.Errorf("%w: read from %d outside [%d, %d]", ErrOutOfRange, from, head, tail)
	}
	end := tail
	if maxRecords > 0 && uint64(maxRecords) < end-from {
		end = from + uint64(maxRecords)
	}
	cached, ok := s.durable.tail.read(from, end, maxBytes)
	s.durable.dmu.Unlock()
	if from == tail {
		return nil, nil
	}
	if ok {
		return cached, nil
	}
	var (
		out   []Record
		bytes int
	)
	err := s.db.readLog(func(txn *engine.Txn) error {
		return s.scanRecords(txn, from, end, true, ErrOutOfRange, func(rec Record, size int) bool {
			if maxBytes > 0 && len(out) > 0 && bytes+size > maxBytes {
				return false
			}
			out = append(out, rec)
			bytes += size
			return true
		})
	})
	if err != nil {
		if errors.Is(err, ErrOutOfRange) {
			// Retention or a reset moved the head while we read.
			if h, _ := s.bounds(); h > from {
				return nil, fmt.Errorf("%w: read from %d below head %d", ErrOutOfRange, from, h)
			}
			if written {
				// A cut lowered the written tail while we read.
				return nil, fmt.Errorf("%w: read from %d: the log was cut while reading", ErrOutOfRange, from)
			}
			return nil, fmt.Errorf("%w: stream %q: %w", ErrCorrupt, s.name, err)
		}
		return nil, fmt.Errorf("storage: reading stream %q: %w", s.name, err)
	}
	return out, nil
}

// logReadSlots bounds the log reads (records past the tail cache, a
// record's chain) that go to the engine at once. When a broker rejoins,
// every stream it follows starts at once, and each owner reads, for each
// of them, what the broker missed: thousands of read transactions begun
// together queue on the engine's one read timestamp lock and keep the
// owner's goroutines waiting to run for seconds, long enough to starve its
// own etcd keep-alives, so its lease ends as though it had stopped and
// every stream it owns fails over (docs/limits.md, "A rejoin is paced").
// A read holds its slot only while it reads and waits on nothing else, so
// a few more slots than cores keep the engine busy; a read the tail cache
// answers takes none, so the follows a failover starts, which read near
// the tail, do not queue here.
const logReadSlots = 8

// readLog runs fn in a read view of the engine, in one of the log read
// slots.
func (db *DB) readLog(fn func(*engine.Txn) error) error {
	db.logReads <- struct{}{}
	defer func() { <-db.logReads }()
	return db.eng.View(fn)
}

// recordChain reads the chain value stored with record off.
func (s *Stream) recordChain(off uint64) (uint64, error) {
	var chain uint64
	err := s.db.readLog(func(txn *engine.Txn) error {
		return s.scanRecords(txn, off, off+1, false, ErrCorrupt, func(r Record, _ int) bool {
			chain = r.Chain
			return true
		})
	})
	if err != nil {
		return 0, fmt.Errorf("storage: stream %q record %d: %w", s.name, off, err)
	}
	return chain, nil
}

// ChainAt returns the chain value of the prefix ending at offset (exclusive):
// the chain of record offset-1, or at the head the chain persisted below it
// (0 for a log never trimmed or reset). offset must be in [head, tail].
func (s *Stream) ChainAt(offset uint64) (uint64, error) {
	s.durable.dmu.Lock()
	tail, chain := s.durable.dTail, s.durable.dChain
	s.durable.dmu.Unlock()
	return s.chainAt(offset, tail, chain)
}

// WrittenChainAt is ChainAt for offsets up to the written record tail.
func (s *Stream) WrittenChainAt(offset uint64) (uint64, error) {
	tail, chain := s.WrittenTail()
	return s.chainAt(offset, tail, chain)
}

func (s *Stream) chainAt(offset, tail, chain uint64) (uint64, error) {
	s.assigned.mu.Lock()
	head, headChain := s.assigned.m.Head, s.assigned.m.HeadChain
	s.assigned.mu.Unlock()
	switch {
	case offset < head || offset > tail:
		return 0, fmt.Errorf("%w: chain at %d outside [%d, %d]", ErrOutOfRange, offset, head, tail)
	case offset == tail:
		return chain, nil
	case offset == head:
		return headChain, nil
	}
	return s.recordChain(offset - 1)
}

// scanEvents calls fn for the stored cursor events in [from, to) in order
// until fn returns false.
func (s *Stream) scanEvents(from, to uint64, fn func(CursorEvent) bool) error {
	if from >= to {
		return nil
	}
	return s.db.eng.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefetch: 64, Prefix: s.eventPrefix})
		defer it.Close()
		next := from
		for it.Seek(offsetKey(s.eventPrefix, from)); it.Valid() && next < to; it.Next() {
			item := it.Item()
			if off := keyOffset(item.Key()); off != next {
				return fmt.Errorf("%w: cursor event %d missing (found %d)", ErrCorrupt, next, off)
			}
			var ev CursorEvent
			if err := item.Value(func(v []byte) (err error) {
				ev, err = decodeEvent(v)
				return err
			}); err != nil {
				return fmt.Errorf("cursor event %d: %w", next, err)
			}
			ev.Offset = next
			if !fn(ev) {
				return nil
			}
			next++
		}
		if next < to {
			return fmt.Errorf("%w: cursor event %d missing", ErrCorrupt, next)
		}
		return nil
	})
}

// deleteRange deletes the keys under prefix with offsets in [from, to), in
// bounded batches, waiting for each.
func (db *DB) deleteRange(ctx context.Context, prefix []byte, from, to uint64) error {
	return db.eng.DeleteRange(ctx, prefix, offsetKey(prefix, from), offsetKey(prefix, to))
}
