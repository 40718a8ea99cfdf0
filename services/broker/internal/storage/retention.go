package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Retention bounds the retained log; zero fields are unbounded.
type Retention struct {
	MaxRecords uint64
	MaxBytes   uint64
	MaxAge     time.Duration
}

// retentionWindow bounds how many records one step of ApplyRetention looks
// at and deletes, so a large backlog is trimmed in bounded transactions.
const retentionWindow = 4096

// ApplyRetention moves the head forward past records that exceed
// r.MaxRecords, r.MaxBytes (encoded bytes) or are older than r.MaxAge by
// publish time at now, and returns the new head. Only records below the
// confirm watermark are ever dropped: a record not yet confirmed must not be
// lost from any copy. The new head and the chain below it are made durable
// first, then the records below it are deleted in bounded batches (a crash
// in between is completed on open). Cursors below the new head read as the
// head from then on (they are clamped up to it).
//
// ctx bounds the waits for the committer. A call it cancels returns
// ctx.Err() with the copy consistent: each step (the producer checkpoint,
// the new head, a batch of deletes) is all or nothing, and a step already
// queued is applied in order, so the head is the old one or the new one.
// Records left below the head are deleted by the next pass or open.
func (s *Stream) ApplyRetention(ctx context.Context, r Retention, now time.Time) (uint64, error) {
	s.admin.Lock()
	defer s.admin.Unlock()
	for {
		s.assigned.mu.Lock()
		if s.assigned.closed {
			s.assigned.mu.Unlock()
			return 0, s.closedErr()
		}
		head, bytes, cutting := s.assigned.m.Head, s.assigned.m.Bytes, s.assigned.m.Cut != nil
		s.assigned.mu.Unlock()
		s.durable.dmu.Lock()
		tail := s.durable.dTail
		limit := min(s.durable.watermark, tail)
		s.durable.dmu.Unlock()
		if cutting || head >= limit || r == (Retention{}) {
			return head, nil
		}
		byCount := head
		if r.MaxRecords > 0 && tail-head > r.MaxRecords {
			byCount = tail - r.MaxRecords
		}
		end := min(limit, head+retentionWindow)
		var (
			newHead   = head
			dropped   uint64
			headChain uint64
		)
		err := s.db.eng.View(func(txn *engine.Txn) error {
			return s.scanRecords(txn, head, end, false, ErrCorrupt, func(rec Record, size int) bool {
				drop := newHead < byCount ||
					(r.MaxBytes > 0 && bytes-dropped > r.MaxBytes) ||
					(r.MaxAge > 0 && rec.PublishTime.Before(now.Add(-r.MaxAge)))
				if !drop {
					return false
				}
				dropped += uint64(size)
				headChain = rec.Chain
				newHead++
				return true
			})
		})
		if err != nil {
			return head, fmt.Errorf("storage: retention on stream %q: %w", s.name, err)
		}
		if newHead == head {
			return head, nil
		}
		// The records below the new head are about to go: the producer
		// table must be persisted past them first (checkpoint.go).
		if err := s.ensureProducerCheckpoint(ctx, newHead); err != nil {
			return head, fmt.Errorf("storage: retention on stream %q: %w", s.name, err)
		}
		err = s.commitMeta(ctx, func(m *meta) error {
			if m.Head != head || m.Cut != nil {
				return errNoChange // ResetTo or Cut ran meanwhile; look again
			}
			m.Head, m.HeadChain = newHead, headChain
			m.Bytes -= min(m.Bytes, dropped)
			return nil
		})
		if err != nil && !errors.Is(err, errNoChange) {
			return head, err
		}
		if err := s.purge(ctx); err != nil {
			return newHead, err
		}
		s.durable.wakeAll() // readers below the new head re-check
	}
}

// purge deletes the record keys in [Purged, Head) in bounded batches,
// advancing Purged with each batch. It is idempotent and resumes after a
// crash (loadStream calls it).
func (s *Stream) purge(ctx context.Context) error {
	for {
		s.assigned.mu.Lock()
		from, to := s.assigned.m.Purged, s.assigned.m.Head
		s.assigned.mu.Unlock()
		if from >= to {
			return nil
		}
		var keys [][]byte
		err := s.db.eng.View(func(txn *engine.Txn) error {
			it := txn.NewIterator(engine.IterOptions{Prefix: s.recPrefix})
			defer it.Close()
			for it.Seek(offsetKey(s.recPrefix, from)); it.Valid() && len(keys) < 1024; it.Next() {
				k := it.Item().KeyCopy(nil)
				if keyOffset(k) >= to {
					break
				}
				keys = append(keys, k)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("storage: purging stream %q: %w", s.name, err)
		}
		upTo := to
		if len(keys) == 1024 {
			upTo = keyOffset(keys[len(keys)-1]) + 1
		}
		err = s.commitOp(ctx, func(m *meta) error {
			m.Purged = max(m.Purged, min(upTo, m.Head))
			return nil
		}, func(o *op) {
			for _, k := range keys {
				o.del(k)
			}
		})
		if err != nil {
			return fmt.Errorf("storage: purging stream %q: %w", s.name, err)
		}
	}
}

// ResetTo discards the copy's record log and continues it at head with the
// given chain: head = record tail = head, the chain (and the chain below the
// head) = chain, the confirm watermark = head. A follower below the owner's
// retained head uses it before following from there, so head is at or past
// the copy's record tail (a lower head is ErrInvalidArgument: only Cut
// removes records past the head). The cursor event log, the epochs and the
// cursors are kept (cursors read clamped to the new head).
// The producer table starts empty at head: the records it was built from
// are gone, and the owner's records between the old tail and head were never
// seen here (doc.go, "Idempotent publish").
//
// ctx bounds the wait for the committer. A call it cancels before the reset
// was queued returns ctx.Err() with the copy unchanged; one cancelled after
// returns ctx.Err() with the reset applied (in memory at once, durable in
// order), as a retry finds it. The old records, all below the new head, are
// then deleted by the next open (or the next ResetTo or retention pass that
// purges); nothing reads below the head meanwhile.
func (s *Stream) ResetTo(ctx context.Context, head, chain uint64) error {
	s.admin.Lock()
	defer s.admin.Unlock()
	if err := s.finishCutLocked(ctx); err != nil {
		return err
	}
	err := s.commitOp(ctx, func(m *meta) error {
		if m.Cut != nil {
			return fmt.Errorf("%w: stream %q: cut in progress", ErrFenced, s.name)
		}
		if head < m.RecordTail {
			return fmt.Errorf("%w: reset of stream %q to head %d below its record tail %d", ErrInvalidArgument, s.name, head, m.RecordTail)
		}
		m.Head, m.HeadChain = head, chain
		m.RecordTail, m.Chain = head, chain
		m.Bytes = 0
		m.Purged = min(m.Purged, head)
		return nil
	}, func(o *op) {
		evTail := s.assigned.m.CursorEventTail
		s.assigned.producers = s.assigned.producers.empty()
		dropped, _ := s.addProducerCheckpointLocked(o, s.assigned.producers, head, func(producerGen) bool { return false }, false)
		o.apply = func() {
			s.durable.setDurable(head, chain, evTail, head)
			s.retireProducerGens(dropped)
		}
	})
	if err != nil {
		return err
	}
	return s.purge(ctx)
}
