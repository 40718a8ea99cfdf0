package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Producer table checkpoints (doc.go, "Idempotent publish"). A checkpoint is
// the table as of a record offset, its boundary, stored in chunks under
// p | len | name | generation | chunk. The meta lists the checkpoints it
// uses (ProducerTables, at most two, oldest first); chunks of a checkpoint
// are written with or before the meta that names it, and deleted only after
// a durable meta stopped naming it, so every checkpoint a durable meta names
// is whole.

// producerChunkBytes bounds one chunk's value, far below Badger's entry limit.
const producerChunkBytes = 256 << 10

// producerRebuildRecords bounds the replay when no checkpoint is usable: a
// cut below both checkpoints, or a copy written before checkpoints existed.
// The table is then rebuilt from at most this many records before the
// point, so producers that published only before them are forgotten.
const producerRebuildRecords = 1 << 16

// producerGen is one persisted checkpoint.
type producerGen struct {
	Gen      uint64 `json:"gen"`
	Boundary uint64 `json:"boundary"`
	Chunks   int    `json:"chunks"`
}

func (s *Stream) producerChunkKey(gen uint64, chunk int) []byte {
	k := binary.BigEndian.AppendUint64(slices.Clip(s.prodPrefix), gen)
	return binary.BigEndian.AppendUint32(k, uint32(chunk))
}

// producerCheckpointDueLocked reports whether enough records follow the last
// checkpoint (or rebuild base) to write another: at least the configured
// interval and at least the table's size in runs, so writing checkpoints
// costs O(1) per record however large the table grows.
func (s *Stream) producerCheckpointDueLocked() bool {
	return s.assigned.m.RecordTail-min(s.assigned.prodBoundary, s.assigned.m.RecordTail) >= max(uint64(s.db.producerCheckpointEvery), uint64(s.assigned.producers.runs))
}

// addProducerCheckpointLocked adds to o a checkpoint of t at boundary and
// names it in the assigned meta, keeping at most one older checkpoint that
// keep accepts. It returns the checkpoints the meta no longer names: the
// caller hands them to retireProducerGens once o is durable. With collect,
// o also deletes the chunks of checkpoints retired earlier; taken are those,
// to give back if o is not enqueued.
func (s *Stream) addProducerCheckpointLocked(o *op, t *producerTable, boundary uint64, keep func(producerGen) bool, collect bool) (dropped, taken []producerGen) {
	if collect {
		taken = s.prodGarbage.take()
		for _, g := range taken {
			for c := range g.Chunks {
				o.del(s.producerChunkKey(g.Gen, c))
			}
		}
	}
	s.assigned.m.ProducerGen++
	chunks := t.encode(producerChunkBytes)
	g := producerGen{Gen: s.assigned.m.ProducerGen, Boundary: boundary, Chunks: len(chunks)}
	for c, v := range chunks {
		o.add(s.producerChunkKey(g.Gen, c), v)
	}
	var kept []producerGen
	for _, old := range s.assigned.m.ProducerTables {
		if keep(old) {
			kept = append(kept, old)
		} else {
			dropped = append(dropped, old)
		}
	}
	if n := len(kept); n > 1 {
		dropped = append(dropped, kept[:n-1]...)
		kept = kept[n-1:]
	}
	// A new slice: op snapshots of the meta share the old one.
	s.assigned.m.ProducerTables = append(slices.Clone(kept), g)
	s.assigned.prodBoundary = boundary
	return dropped, taken
}

// retireProducerGens queues checkpoints that a durable meta no longer names
// for deletion with the next checkpoint. It runs on the committer (op
// apply), so it takes only prodGarbage's leaf lock.
func (s *Stream) retireProducerGens(gens []producerGen) {
	if len(gens) == 0 {
		return
	}
	s.prodGarbage.add(gens)
}

// checkpointGarbage holds producer checkpoints that no durable meta names
// any more, whose chunks the next checkpoint deletes. Its lock is a leaf,
// so the committer may take it under anything.
type checkpointGarbage struct {
	mu   sync.Mutex
	gens []producerGen
}

func (g *checkpointGarbage) add(gens []producerGen) {
	g.mu.Lock()
	g.gens = append(g.gens, gens...)
	g.mu.Unlock()
}

// take returns every checkpoint held and holds none.
func (g *checkpointGarbage) take() []producerGen {
	g.mu.Lock()
	defer g.mu.Unlock()
	gens := g.gens
	g.gens = nil
	return gens
}

func keepAll(producerGen) bool { return true }

// maybeCheckpointProducersLocked enqueues a checkpoint of the assigned table
// behind the op just enqueued, when one is due. Nobody waits for it; if it
// cannot be enqueued now, the next append tries again.
func (s *Stream) maybeCheckpointProducersLocked(ctx context.Context) {
	if !s.producerCheckpointDueLocked() {
		return
	}
	prev, prevBoundary := s.assigned.m, s.assigned.prodBoundary
	o := &op{s: s}
	dropped, taken := s.addProducerCheckpointLocked(o, s.assigned.producers, s.assigned.m.RecordTail, keepAll, true)
	o.meta, o.version = s.assigned.snapshotMeta()
	o.apply = func() { s.retireProducerGens(dropped) }
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.prodBoundary = prevBoundary
		s.retireProducerGens(taken)
	}
}

// ensureProducerCheckpoint makes a checkpoint at or past atLeast durable.
// Retention calls it before moving the head there, so the newest checkpoint
// never lies below the head, where the records to replay after it are gone.
func (s *Stream) ensureProducerCheckpoint(ctx context.Context, atLeast uint64) error {
	s.assigned.mu.Lock()
	if s.assigned.closed {
		s.assigned.mu.Unlock()
		return s.closedErr()
	}
	if n := len(s.assigned.m.ProducerTables); n > 0 && s.assigned.m.ProducerTables[n-1].Boundary >= atLeast {
		s.assigned.mu.Unlock()
		return nil
	}
	if s.assigned.m.Cut != nil {
		s.assigned.mu.Unlock()
		return fmt.Errorf("%w: stream %q: cut in progress", ErrFenced, s.name)
	}
	prev, prevBoundary := s.assigned.m, s.assigned.prodBoundary
	o := &op{s: s, done: make(chan error, 1)}
	dropped, taken := s.addProducerCheckpointLocked(o, s.assigned.producers, s.assigned.m.RecordTail, keepAll, true)
	o.meta, o.version = s.assigned.snapshotMeta()
	o.apply = func() { s.retireProducerGens(dropped) }
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.prodBoundary = prevBoundary
		s.retireProducerGens(taken)
		s.assigned.mu.Unlock()
		return err
	}
	s.assigned.mu.Unlock()
	return wait(ctx, o)
}

// loadProducers runs when a stream is opened: it deletes chunks of
// checkpoints the meta does not name (left by a crash, or retired and not
// yet deleted) and, unless a completed cut already rebuilt the table, sets
// it to the newest usable checkpoint plus the records after it.
func (s *Stream) loadProducers(ctx context.Context, rebuild bool) error {
	named := make(map[uint64]bool, len(s.assigned.m.ProducerTables))
	for _, g := range s.assigned.m.ProducerTables {
		named[g.Gen] = true
	}
	var stale [][]byte
	err := s.db.eng.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefix: s.prodPrefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != len(s.prodPrefix)+12 || !named[binary.BigEndian.Uint64(k[len(s.prodPrefix):])] {
				stale = append(stale, it.Item().KeyCopy(nil))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: loading producers of stream %q: %w", s.name, err)
	}
	for len(stale) > 0 {
		n := min(len(stale), 1024)
		o := &op{}
		for _, k := range stale[:n] {
			o.del(k)
		}
		if err := s.db.do(ctx, o); err != nil {
			return fmt.Errorf("storage: loading producers of stream %q: %w", s.name, err)
		}
		stale = stale[n:]
	}
	if !rebuild {
		return nil
	}
	t, base, err := s.rebuildProducers(s.assigned.m.ProducerTables, s.assigned.m.Head, s.assigned.m.RecordTail)
	if err != nil {
		return err
	}
	s.assigned.producers, s.assigned.prodBoundary = t, base
	return nil
}

// rebuildProducers returns the producer table as of record offset at (in
// [head, record tail]) and the offset its replay started from: the newest
// readable checkpoint in [head, at] plus the records after it, or, with
// none, the records of [max(head, at-producerRebuildRecords), at).
func (s *Stream) rebuildProducers(gens []producerGen, head, at uint64) (*producerTable, uint64, error) {
	t := newProducerTable(s.db.maxProducers, s.db.producerWindow, s.db.producerBatches)
	from := max(head, at-min(at, producerRebuildRecords))
	for i := len(gens) - 1; i >= 0; i-- {
		g := gens[i]
		if g.Boundary < head || g.Boundary > at {
			continue
		}
		if err := s.readProducerGen(t, g); err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, engine.ErrNotFound) {
				return nil, 0, err
			}
			// A checkpoint that cannot be read (a value log GC rewrite
			// torn by a power loss and found nowhere, torn.go): the older
			// one, or the records, give the same table, from further back.
			s.db.log.Warn().Err(err).Str(logging.Stream, s.name).Msg("producer table checkpoint unreadable; rebuilding from an earlier one")
			t = newProducerTable(s.db.maxProducers, s.db.producerWindow, s.db.producerBatches)
			continue
		}
		from = g.Boundary
		break
	}
	if err := s.replayProducers(t, from, at); err != nil {
		return nil, 0, err
	}
	return t, from, nil
}

// readProducerGen decodes checkpoint g into t.
func (s *Stream) readProducerGen(t *producerTable, g producerGen) error {
	err := s.db.eng.View(func(txn *engine.Txn) error {
		for c := range g.Chunks {
			item, err := txn.Get(s.producerChunkKey(g.Gen, c))
			if err != nil {
				return fmt.Errorf("chunk %d: %w", c, err)
			}
			if err := item.Value(t.decodeChunk); err != nil {
				return fmt.Errorf("chunk %d: %w", c, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: stream %q: producer table %d at %d: %w", s.name, g.Gen, g.Boundary, err)
	}
	return nil
}

// replayProducers applies the records of [from, to) to t.
func (s *Stream) replayProducers(t *producerTable, from, to uint64) error {
	if from >= to {
		return nil
	}
	err := s.db.eng.View(func(txn *engine.Txn) error {
		return s.scanRecords(txn, from, to, false, ErrCorrupt, func(rec Record, _ int) bool {
			if sequenced(&rec) {
				t.apply(rec.ProducerID, rec.Sequence, rec.Offset)
			}
			return true
		})
	})
	if err != nil {
		return fmt.Errorf("storage: stream %q: replaying producers: %w", s.name, err)
	}
	return nil
}

// deletePrefix deletes every key under prefix, in bounded batches.
func (db *DB) deletePrefix(ctx context.Context, prefix []byte) error {
	return db.eng.DeleteRange(ctx, prefix, prefix, nil)
}
