package storage

import (
	"context"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Ops. Every write of the model is an op handed to the engine's committer
// (engine/commit.go: one transaction and one fsync per group of queued
// batches). Callers build an op under their stream's lock, so ops of one
// stream enter the queue in the order their offsets were assigned, and
// wait for it outside the lock. The committer writes each stream's newest
// metadata once per group, after every entry of the group (groupMeta), and
// reports each op, in queue order, once Badger has it (opWritten) and once
// it is durable (opDone): only then are the ops applied to the streams'
// durable state and their callers released. Ops that nobody waits for
// (cursor commits, lazy watermark writes) are made durable by the same
// sync, just not waited for.

// op is one unit of work for the committer.
type op struct {
	b engine.Batch
	s *Stream
	// meta, when set, is the stream's metadata after this op, numbered by
	// version (assigned under the stream's lock, so versions follow queue
	// order). The committer writes the newest one of each stream once per
	// group, after every entry of the group.
	meta    *meta
	version uint64
	// touchWM asks for the stream's newest metadata to be rewritten with the
	// current confirm watermark (SetConfirmWatermark's lazy persistence).
	touchWM bool
	// checkpoint asks for a tails checkpoint in the op's group (tails.go).
	checkpoint bool
	// whole is a stream being dropped, closed, whose newest state may be
	// only in tails entries: its metadata is written whole in the op's
	// group, before the drop writes its marker (DB.Drop).
	whole *Stream
	// written runs on the committer once Badger has taken the op, before
	// the fsync, in queue order (Stream.WrittenTail).
	written func()
	// apply runs on the committer after the op is durable, in queue order.
	apply func()
	// snap, when set, is the cursor snapshot the op writes: once durable it
	// is the copy's durable snapshot and the events below its boundary may
	// go (compact.go).
	snap *snapshot
	// done receives the outcome; nil when nobody waits.
	done chan error
	// onDurable, when set, is told the outcome on the committer, after
	// apply (Stream.EnqueueReplicated).
	onDurable func(error)
}

func (o *op) add(key, val []byte) { o.b.Set(key, val) }

func (o *op) del(key []byte) { o.b.Delete(key) }

// enqueue hands o to the committer. Ops of one stream must be enqueued under
// that stream's lock to keep their order.
func (db *DB) enqueue(ctx context.Context, o *op) error {
	o.b.Tag = o
	return db.eng.Enqueue(ctx, &o.b)
}

// tryEnqueue enqueues o unless the queue is full.
func (db *DB) tryEnqueue(o *op) bool {
	o.b.Tag = o
	return db.eng.TryEnqueue(&o.b)
}

// wait waits for an enqueued op. Cancelling ctx stops the wait, not the op:
// the op may still become durable.
func wait(ctx context.Context, o *op) error {
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// do enqueues o and waits until it is durable.
func (db *DB) do(ctx context.Context, o *op) error {
	o.done = make(chan error, 1)
	if err := db.enqueue(ctx, o); err != nil {
		return err
	}
	return wait(ctx, o)
}

// opWritten is the engine's OnWritten: Badger has the op.
func opWritten(b *engine.Batch) {
	if o, ok := b.Tag.(*op); ok && o.written != nil {
		o.written()
	}
}

// opDone is the engine's OnDone: the op is durable (err nil) or failed.
func opDone(b *engine.Batch, err error) {
	o, ok := b.Tag.(*op)
	if !ok {
		return
	}
	if err == nil && o.apply != nil {
		o.apply()
	}
	if err == nil && o.snap != nil {
		o.s.snapshotDurable(o.snap)
	}
	if err != nil && o.s != nil {
		// Waiters on durable state (a duplicate publish waiting for its
		// original) re-check and find the DB stopped.
		o.s.durable.wakeAll()
	}
	if o.onDurable != nil {
		o.onDurable(err)
	}
	if o.s != nil {
		// After apply: a Status read after this sees what the op did.
		o.s.db.statusGen.Add(1)
	}
	if o.done != nil {
		o.done <- err
	}
}

// metaEncodingGuess is about the size of a stream's metadata encoding
// with a log epoch or two: what groupMeta reserves per stream.
const metaEncodingGuess = 320

// groupMeta is the engine's OnGroup: the newest state of each stream the
// group's ops changed (or whose watermark they touch), written after every
// entry of the group, so a group split by Badger's transaction bound may
// leave entries past a durable tail (ignored and cleaned on open), never a
// tail past its entries. A stream whose state changed only in its tails
// has them written in the group's tails entries, any other its whole
// metadata (tails.go). It runs on the committer only, which owns the
// streams' cm fields and db.cm.
func (db *DB) groupMeta(group []*engine.Batch) []engine.Entry {
	db.cm.seq++
	seq := db.cm.seq
	// A checkpoint writes the streams in dirty whole: waiting for as many
	// chunks as there are such streams keeps its entries at most as many
	// as the chunks it saved them from, however many streams there are.
	checkpoint := len(db.cm.live) >= max(db.tailsCheckpointChunks, len(db.cm.dirty))
	var wholeAfterClose []*Stream
	touched := db.cm.touched[:0]
	for _, b := range group {
		o, ok := b.Tag.(*op)
		if !ok {
			continue
		}
		checkpoint = checkpoint || o.checkpoint
		if w := o.whole; w != nil && w.cmInTails {
			wholeAfterClose = append(wholeAfterClose, w)
		}
		s := o.s
		// A closed stream's metadata is not written: the stream is being
		// dropped (DB.Close stops the committer before it closes streams),
		// and an op queued before the drop, in the same group as the drop's
		// marker, would otherwise rewrite its metadata without the marker,
		// last, and a crash later in the drop would leave a stream whose
		// entries are gone and whose metadata still names them: Open would
		// refuse it for ever instead of finishing the drop.
		if s == nil || (o.meta == nil && !o.touchWM) || s.Closed() {
			continue
		}
		if !s.cmTouched {
			s.cmTouched = true
			touched = append(touched, s)
		}
		if o.meta != nil && o.version > s.cmVersion {
			s.cmMeta, s.cmVersion = o.meta, o.version
		}
	}
	// Both slices are the committer's, kept between groups: the engine is
	// done with the entries of a group before it asks for the next.
	out := db.cm.entries[:0]
	// One buffer holds the group's encodings (a few hundred bytes each),
	// instead of an allocation per stream: fresh per group, as Badger may
	// hold the values until the group is written.
	var buf []byte
	full := func(s *Stream) {
		if buf == nil {
			buf = make([]byte, 0, metaEncodingGuess*len(touched))
		}
		m := *s.cmMeta
		m.ConfirmWatermark = s.durable.persistedWatermark(m.RecordTail)
		m.TailsSeq = seq
		start := len(buf)
		buf = appendMeta(buf, &m)
		out = append(out, engine.Entry{Key: s.metaKey, Value: buf[start:len(buf):len(buf)]})
		s.cmFull, s.cmInTails = s.cmMeta, false
	}
	tw := &db.cm.tails
	tw.reset()
	for _, s := range touched {
		s.cmTouched = false
		if s.cmMeta == nil {
			continue
		}
		if checkpoint || s.cmFull == nil || !onlyTailsDiffer(s.cmFull, s.cmMeta) {
			full(s)
			continue
		}
		t := tailsOf(s.cmMeta)
		t.ConfirmWatermark = s.durable.persistedWatermark(t.RecordTail)
		tw.add(s.name, t)
		s.cmInTails = true
		if !s.cmListed {
			s.cmListed = true
			db.cm.dirty = append(db.cm.dirty, s)
		}
	}
	for _, s := range wholeAfterClose {
		if s.cmInTails {
			full(s)
		}
	}
	if checkpoint {
		// Every stream whose newest state is only in tails entries is
		// written whole, then every tails entry goes: after the metadata,
		// so a split group never deletes a tail before its stream's
		// metadata holds it. A closed stream is being dropped: its
		// metadata is not written again (see above; DB.Drop had it
		// written whole before its marker), and a tails entry naming it
		// applies to nothing once its metadata is gone.
		for _, s := range db.cm.dirty {
			if s.cmInTails && !s.Closed() {
				full(s)
			}
			s.cmListed = false
		}
		clear(db.cm.dirty)
		db.cm.dirty = db.cm.dirty[:0]
		for _, k := range db.cm.live {
			out = append(out, engine.Entry{Key: k, Delete: true})
		}
		clear(db.cm.live)
		db.cm.live = db.cm.live[:0]
	} else {
		out, db.cm.live = tw.entries(seq, out, db.cm.live)
	}
	clear(touched)
	db.cm.touched, db.cm.entries = touched, out
	return out
}
