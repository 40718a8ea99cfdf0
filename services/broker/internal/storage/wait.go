package storage

import (
	"context"
	"sync"
	"time"
)

// Live tails without polling. A waiter is a channel closed once its
// condition holds; waiters with the same condition share one channel, so a
// reader that gives up (its context ends) leaves at most one channel per
// distinct offset behind, which the next change past it closes.

type waitKey struct {
	after uint64
	what  waitWhat
}

type waitWhat uint8

const (
	waitRecordTail waitWhat = iota
	waitConfirmed
	waitCursorEventTail
	waitWrittenTail
)

var closedCh = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// WaitTail returns a channel that is closed once the durable record tail is
// above after (at once if it already is). It is also closed when a cursor
// event becomes durable, and when the stream is closed or dropped, sealed,
// moved to a new epoch, cut or reset, so a waiter re-checks the copy's
// state. Followers' senders, which ship both logs, wait on it alone.
func (s *Stream) WaitTail(after uint64) <-chan struct{} {
	return s.durable.wait(waitKey{after: after, what: waitRecordTail})
}

// WaitConfirmed is WaitTail for the confirm watermark: closed once the
// watermark is above after (at once if it already is), or on the same
// events. Subscribers, which only see confirmed records, wait on it.
func (s *Stream) WaitConfirmed(after uint64) <-chan struct{} {
	return s.durable.wait(waitKey{after: after, what: waitConfirmed})
}

// WaitCursorEventTail is WaitTail for the durable cursor event tail, for
// senders that ship cursor events to followers.
func (s *Stream) WaitCursorEventTail(after uint64) <-chan struct{} {
	return s.durable.wait(waitKey{after: after, what: waitCursorEventTail})
}

// WaitWritten is WaitTail for the written record tail (see WrittenTail):
// closed once it is above after, or on the same events as WaitTail.
func (s *Stream) WaitWritten(after uint64) <-chan struct{} {
	return s.durable.wait(waitKey{after: after, what: waitWrittenTail})
}

// WrittenTail returns the written record tail and the chain there: every
// record below it is in Badger, and so in the OS page cache, though the
// fsync that makes it durable may still be running. Such records survive
// a crash of the broker process, not of the machine. An owner ships them
// to followers before its own fsync ends, so the owner's and the
// followers' fsyncs overlap; the owner still counts only its durable tail
// toward W. That a machine crash can leave followers holding records the
// owner lost is why an owner restarting after an unclean stop on a new
// boot does not continue its epoch (replica, "unsure owner").
func (s *Stream) WrittenTail() (tail, chain uint64) {
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	return s.durable.wTail, s.durable.wChain
}

// Tails are a copy's log ends, without the rest of State.
type Tails struct {
	// Record and CursorEvent are the durable tails and Chain the chain at
	// Record; Written is the written record tail (WrittenTail).
	Record, CursorEvent, Written, Chain uint64
}

// Tails returns the log ends: what replication checks on every batch
// (the owner's sender, the follower's acknowledgements), without State's
// copies of the epochs.
func (s *Stream) Tails() Tails {
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	return Tails{Record: s.durable.dTail, CursorEvent: s.durable.dEvTail, Written: s.durable.wTail, Chain: s.durable.dChain}
}

// Closed reports that the stream was closed or dropped: its waits return
// at once from then on, so a loop waiting on them must stop.
// The committer asks it for every op it writes: an atomic, not dmu.
func (s *Stream) Closed() bool { return s.closedFlag.Load() }

func (d *durableView) wait(k waitKey) <-chan struct{} {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	if d.dclosed || d.satisfiedLocked(k) {
		return closedCh
	}
	ch, ok := d.waiters[k]
	if !ok {
		ch = make(chan struct{})
		d.waiters[k] = ch
	}
	return ch
}

func (d *durableView) satisfiedLocked(k waitKey) bool {
	switch k.what {
	case waitConfirmed:
		return d.watermark > k.after
	case waitCursorEventTail:
		return d.dEvTail > k.after
	case waitWrittenTail:
		return d.wTail > k.after
	}
	return d.dTail > k.after
}

// wakeLocked closes the channels whose condition now holds. Callers hold dmu.
func (d *durableView) wakeLocked() {
	for k, ch := range d.waiters {
		if d.satisfiedLocked(k) {
			close(ch)
			delete(d.waiters, k)
		}
	}
}

// wakeAllLocked closes every waiter's channel. Callers hold dmu.
func (d *durableView) wakeAllLocked() {
	for k, ch := range d.waiters {
		close(ch)
		delete(d.waiters, k)
	}
}

func (d *durableView) wakeAll() {
	d.dmu.Lock()
	d.wakeAllLocked()
	d.dmu.Unlock()
}

// SetConfirmWatermark raises the confirm watermark to w, capped at the
// durable record tail; a lower w is ignored (only Cut and ResetTo lower the
// watermark). It is persisted lazily: with the stream's next metadata
// write, or else within watermarkPersistInterval by a write of its own that
// nobody waits for. After a crash the watermark may be lower than the one
// last set, never above the record tail. An owner moves it on every
// confirm and a follower on every batch, so a write each time would be a
// Badger transaction per batch for a value that only spares a restarted
// copy some waiting.
func (s *Stream) SetConfirmWatermark(w uint64) {
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	w = min(w, s.durable.dTail)
	if w <= s.durable.watermark || s.durable.dclosed {
		return
	}
	s.durable.watermark = w
	s.durable.wakeLocked()
	if !s.durable.wmDirty {
		s.durable.wmDirty = true
		s.db.noteWatermark(s)
	}
}

// persistedWatermark is the watermark the committer writes with metadata
// whose record tail is tail.
func (d *durableView) persistedWatermark(tail uint64) uint64 {
	d.dmu.Lock()
	defer d.dmu.Unlock()
	wm := min(d.watermark, tail)
	d.wmPersisted = max(d.wmPersisted, wm)
	return wm
}

// watermarkTouch returns an op that writes the stream's metadata with the
// current watermark, or nil when the last metadata written carries it.
func (s *Stream) watermarkTouch() *op {
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	s.durable.wmDirty = false
	if s.durable.dclosed || s.durable.watermark <= s.durable.wmPersisted {
		return nil
	}
	return &op{s: s, touchWM: true}
}

// watermarkQueue is the streams whose raised watermark waits for the next
// flush, with the lock that guards the list (doc.go, "Locks"). A leaf:
// SetConfirmWatermark adds under the stream's durable.dmu.
type watermarkQueue struct {
	mu    sync.Mutex
	dirty []*Stream
}

// add queues s for the next flush.
func (w *watermarkQueue) add(s *Stream) {
	w.mu.Lock()
	w.dirty = append(w.dirty, s)
	w.mu.Unlock()
}

// take empties the queue and returns what it held.
func (w *watermarkQueue) take() []*Stream {
	w.mu.Lock()
	dirty := w.dirty
	w.dirty = nil
	w.mu.Unlock()
	return dirty
}

// noteWatermark queues s for the next watermark flush.
func (db *DB) noteWatermark(s *Stream) {
	db.wm.add(s)
}

// watermarkPersistInterval bounds how long a raised watermark may stay
// unwritten when its stream writes no metadata.
const watermarkPersistInterval = 500 * time.Millisecond

// flushWatermarks hands the committer a watermark write for every stream
// whose raised watermark no metadata write has carried yet. With wait it
// waits for room in the queue (Close); without, a full queue leaves the
// stream for the next flush, so the periodic flush never holds up behind
// a busy committer.
func (db *DB) flushWatermarks(wait bool) {
	for _, s := range db.wm.take() {
		o := s.watermarkTouch()
		if o == nil {
			continue
		}
		if wait {
			// Fails only once the DB is closed: nothing left to flush to.
			_ = db.enqueue(context.Background(), o)
			continue
		}
		if db.tryEnqueue(o) {
			continue
		}
		// The queue is full (or closing): try again at the next flush.
		s.durable.dmu.Lock()
		again := !s.durable.wmDirty && !s.durable.dclosed
		s.durable.wmDirty = true
		s.durable.dmu.Unlock()
		if again {
			db.noteWatermark(s)
		}
	}
}
