package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/strandhq/strand/services/broker/internal/storage"
)

// PublishResult is where a publish's records are.
type PublishResult struct {
	Epoch uint64
	// Offsets[i] is the offset of records[i]; Duplicate[i] reports that it
	// had been stored by an earlier publish (same producer id and sequence),
	// at that offset, and nothing was stored now.
	Offsets   []uint64
	Duplicate []bool
}

// Publish appends records on the owner and returns once the stream's
// confirm rule holds for all of them (W copies durable, owner included).
// Duplicates (storage.Stream.AppendIdempotent) are answered with their
// original offsets, and only once those are confirmed too: a retry never
// learns of a record as stored before a first attempt could have. After the
// confirm timeout it returns ErrConfirmTimeout; the records may remain,
// unconfirmed.
func (m *Manager) Publish(ctx context.Context, stream string, recs []storage.Record) (PublishResult, error) {
	return m.publish(ctx, stream, recs, m.cfg.PublishApplyWait)
}

// PublishEntry is Publish for one entry of a PublishMany: a copy sealed
// for a recovery refuses it at once rather than hold the call's answer
// for every other stream of it (Config.PublishApplyWait).
func (m *Manager) PublishEntry(ctx context.Context, stream string, recs []storage.Record) (PublishResult, error) {
	return m.publish(ctx, stream, recs, 0)
}

// publish is Publish, holding a publish to a sealed copy up to applyWait.
func (m *Manager) publish(ctx context.Context, stream string, recs []storage.Record, applyWait time.Duration) (PublishResult, error) {
	if m.stopping.Load() {
		return PublishResult{}, fmt.Errorf("%w: broker shutting down", ErrUnavailable)
	}
	c := m.copy(stream)
	if c == nil {
		return PublishResult{}, m.notHere(ctx, stream)
	}
	a, tracker, roleCtx, ok := c.ownerRole()
	if !ok {
		if s := c.st.State(); applyWait > 0 && s.SealEpoch != 0 {
			m.publishesAwaitingRecovery.Add(1)
			err := c.awaitApplied(ctx, s.SealEpoch, applyWait)
			m.publishesAwaitingRecovery.Add(-1)
			if err == nil {
				a, tracker, roleCtx, ok = c.ownerRole()
			}
		}
	}
	if !ok {
		if s := c.st.State(); s.SealEpoch != 0 {
			return PublishResult{}, fmt.Errorf("%w: stream %q sealed at epoch %d for recovery", ErrUnavailable, stream, s.SealEpoch)
		}
		if c.standingDown() {
			return PublishResult{}, fmt.Errorf("%w: stream %q: the owner restarted after an unclean stop and waits for a recovery", ErrUnavailable, stream)
		}
		return PublishResult{}, m.notHere(ctx, stream)
	}
	leave, err := c.enterOwnerWrite(ctx, roleCtx)
	if err != nil {
		return PublishResult{}, err
	}
	start := time.Now()
	res, err := c.st.AppendIdempotent(ctx, a.Epoch, recs)
	leave()
	if err != nil {
		if errorsIsAny(err, storage.ErrSealed, storage.ErrFenced) {
			return PublishResult{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		return PublishResult{}, err
	}
	out := PublishResult{Epoch: a.Epoch, Offsets: res.Offsets, Duplicate: res.Duplicate}
	if len(res.Offsets) == 0 {
		return out, nil
	}
	// AppendIdempotent returned once everything it reports is durable
	// here: the stored records, or the originals of a batch of duplicates.
	// Storage told the tracker so before it returned (Stream.OnDurable).
	tail := slices.Max(res.Offsets) + 1
	m.cfg.Metrics.PublishDurable(start)
	if err := waitConfirmed(ctx, roleCtx, tracker, tail, m.cfg.ConfirmTimeout); err != nil {
		if errors.Is(err, ErrConfirmTimeout) {
			m.cfg.Metrics.PublishConfirmTimedOut()
		}
		return out, err
	}
	m.cfg.Metrics.PublishConfirmed(start)
	return out, nil
}

// DefaultPublishApplyWait bounds how long a publish to a copy sealed for a
// recovery waits for the copy to apply the recovery's assignment, and is
// then served as the copy finds itself: as the owner, or refused as
// before. A recovery seals the copies it may promote before it commits
// (docs/protocol.md, "Stream failover"), so a client that learns of the
// new owner from the commit often reaches it still sealed. Refused at
// once, it backed off (exponentially, up to half a second) and had its
// first record confirmed up to that much later than the owner could have.
// Bounded, since the recovery may wait (for a quorum of seals) or promote
// another copy; it is no longer than the Go client's ProbeAfter, so a
// held publish does not send the client looking for another owner.
// PublishMany does not hold its entries: one stream's recovery would
// delay the answer for every stream of the call.
const DefaultPublishApplyWait = time.Second

func waitConfirmed(ctx, roleCtx context.Context, tracker *confirmTracker, tail uint64, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		wm, changed := tracker.get()
		if wm >= tail {
			return nil
		}
		select {
		case <-changed:
		case <-roleCtx.Done():
			return fmt.Errorf("%w: owner role ended before the records were confirmed", ErrUnavailable)
		case <-timer.C:
			return fmt.Errorf("%w: fewer than W copies held offset %d after %s", ErrConfirmTimeout, tail-1, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ReadResult is a read bounded by the confirm watermark.
type ReadResult struct {
	Records   []storage.Record
	Head      uint64
	Watermark uint64
	Next      uint64
}

// Read returns confirmed records from any copy this broker holds; readers
// only ever see records below the confirm watermark.
func (m *Manager) Read(ctx context.Context, stream string, from uint64, maxRecords, maxBytes int) (ReadResult, error) {
	c := m.copy(stream)
	if c == nil || !c.everApplied() {
		return ReadResult{}, m.notHere(ctx, stream)
	}
	wm, _, _ := c.visible()
	return c.readBelow(from, wm, maxRecords, maxBytes)
}

// earliestAttempts bounds the reads ReadEarliest makes. Retention moves a
// head at most once per retention run, seconds apart, so a second attempt
// practically always finds it where it learnt it.
const earliestAttempts = 3

// ReadEarliest is Read from the copy's head, the oldest record still
// retained (Kafka's auto.offset.reset=earliest, NATS's DeliverAll).
// Retention may move the head on between learning it and reading, which
// is then OutOfRange: the read is made again at the new head.
func (m *Manager) ReadEarliest(ctx context.Context, stream string, maxRecords, maxBytes int) (ReadResult, error) {
	c := m.copy(stream)
	if c == nil || !c.everApplied() {
		return ReadResult{}, m.notHere(ctx, stream)
	}
	for attempt := 1; ; attempt++ {
		wm, _, _ := c.visible()
		res, err := c.readBelow(c.st.State().Head, wm, maxRecords, maxBytes)
		if err == nil || !errors.Is(err, storage.ErrOutOfRange) || attempt == earliestAttempts {
			return res, err
		}
	}
}

func (c *Copy) readBelow(from, wm uint64, maxRecords, maxBytes int) (ReadResult, error) {
	s := c.st.State()
	if from < s.Head {
		return ReadResult{}, fmt.Errorf("%w: %d is below the retained head %d", storage.ErrOutOfRange, from, s.Head)
	}
	if from > s.RecordTail {
		return ReadResult{}, fmt.Errorf("%w: %d is past the record tail %d", storage.ErrOutOfRange, from, s.RecordTail)
	}
	res := ReadResult{Head: s.Head, Watermark: wm, Next: from}
	if from >= wm {
		return res, nil
	}
	limit := int(min(uint64(maxRecords), wm-from))
	recs, err := c.st.Read(from, limit, maxBytes)
	if err != nil {
		return ReadResult{}, err
	}
	res.Records = recs
	if n := len(recs); n > 0 {
		res.Next = recs[n-1].Offset + 1
	}
	return res, nil
}

// Subscription reads confirmed records from a copy and waits for more.
type Subscription struct {
	c    *Copy
	next uint64
}

// Subscribe starts a subscription at from on any copy this broker holds.
// from of ^uint64(0) means the latest confirmed position. ctx bounds the
// call (the look-up of a stream not here), not the subscription, which
// lives until its Close.
func (m *Manager) Subscribe(ctx context.Context, stream string, from uint64) (*Subscription, error) {
	c := m.copy(stream)
	if c == nil || !c.everApplied() {
		return nil, m.notHere(ctx, stream)
	}
	s := c.st.State()
	if from == ^uint64(0) {
		wm, _, _ := c.visible()
		from = wm
	}
	if from > s.RecordTail {
		return nil, fmt.Errorf("%w: %d is past the record tail %d", storage.ErrOutOfRange, from, s.RecordTail)
	}
	return &Subscription{c: c, next: max(from, s.Head)}, nil
}

// Watermark is the copy's confirm watermark now.
func (s *Subscription) Watermark() uint64 {
	wm, _, _ := s.c.visible()
	return wm
}

// Next blocks until confirmed records at or past the subscription's position
// exist, then returns up to maxRecords of them. It never polls: it waits on
// the watermark moving.
func (s *Subscription) Next(ctx context.Context, maxRecords, maxBytes int) ([]storage.Record, uint64, error) {
	for {
		wm, changed, roleChanged := s.c.visible()
		head := s.c.st.State().Head
		if s.next < head {
			// Retention passed the reader: continue at the head, as a
			// Kafka consumer with auto.offset.reset=earliest does.
			s.next = head
		}
		if s.next < wm {
			res, err := s.c.readBelow(s.next, wm, maxRecords, maxBytes)
			if err != nil {
				if errors.Is(err, storage.ErrOutOfRange) {
					continue
				}
				return nil, wm, err
			}
			if len(res.Records) > 0 {
				s.next = res.Next
				return res.Records, wm, nil
			}
		}
		select {
		case <-changed:
		case <-roleChanged:
		case <-s.c.done:
			return nil, wm, fmt.Errorf("%w: copy closed", ErrUnavailable)
		case <-ctx.Done():
			return nil, wm, ctx.Err()
		}
	}
}

// CommitCursor moves a named cursor on the owner, never past the confirm
// watermark. Readers are only shown records below it, and a failover
// promotes a copy holding every record below it but maybe none above: a
// cursor past it could point beyond the new owner's tail, and the records
// the new owner then stores there would be skipped by a reader resuming
// from it (docs/protocol.md, "Invariants": a resumed reader never skips a
// record).
func (m *Manager) CommitCursor(ctx context.Context, stream, cursor string, position uint64) (storage.CursorEvent, error) {
	if m.stopping.Load() {
		return storage.CursorEvent{}, fmt.Errorf("%w: broker shutting down", ErrUnavailable)
	}
	c := m.copy(stream)
	if c == nil {
		return storage.CursorEvent{}, m.notHere(ctx, stream)
	}
	a, tracker, roleCtx, ok := c.ownerRole()
	if !ok {
		return storage.CursorEvent{}, m.notHere(ctx, stream)
	}
	leave, err := c.enterOwnerWrite(ctx, roleCtx)
	if err != nil {
		return storage.CursorEvent{}, err
	}
	wm, _ := tracker.get()
	ev, err := c.st.CommitCursor(ctx, a.Epoch, cursor, min(position, wm))
	leave()
	if err != nil {
		if errorsIsAny(err, storage.ErrSealed, storage.ErrFenced) {
			return storage.CursorEvent{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		return storage.CursorEvent{}, err
	}
	c.notifyCursor()
	return ev, nil
}

// Cursor returns a named cursor's position from the owner's copy.
func (m *Manager) Cursor(ctx context.Context, stream, cursor string) (uint64, bool, error) {
	c := m.copy(stream)
	if c == nil {
		return 0, false, m.notHere(ctx, stream)
	}
	if _, _, _, ok := c.ownerRole(); !ok {
		return 0, false, m.notHere(ctx, stream)
	}
	pos, ok := c.st.Cursor(cursor)
	return pos, ok, nil
}

// LocalCursor returns a cursor from whatever copy is here (for Subscribe
// from a cursor on a follower).
func (m *Manager) LocalCursor(ctx context.Context, stream, cursor string) (uint64, bool, error) {
	c := m.copy(stream)
	if c == nil {
		return 0, false, m.notHere(ctx, stream)
	}
	pos, ok := c.st.Cursor(cursor)
	return pos, ok, nil
}
