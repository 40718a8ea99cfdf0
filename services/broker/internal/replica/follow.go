package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

const (
	followBatchRecords = 512
	followBatchBytes   = 1 << 20
	followBatchEvents  = 512
	// followInflightBatches bounds the batches of one follow sent and not
	// yet acknowledged, whatever their size. The follower queues what
	// arrives for each stream without waiting on the stream's goroutine
	// (doc.go), so the owner's flow control is what bounds that queue and
	// what it has in storage's queue.
	followInflightBatches = 64
	// followResponseBytes is about what one response carries: batches of
	// several follows are sent together up to it, one at least.
	followResponseBytes = 1 << 20
)

// FollowStream is the owner's side of one Follow call.
type FollowStream interface {
	Receive() (*strandv1.FollowRequest, error)
	Send(*strandv1.FollowResponse) error
}

// FollowEdge is what the API edge lends ServeFollow: its check of a stream
// name and its table from errors to Connect codes, which a follow's end
// carries (FollowEnd).
type FollowEdge struct {
	// CheckStream refuses a start naming an invalid stream; nil takes any.
	CheckStream func(stream string) error
	// Wire maps a follow's error to the Connect error a per-stream call
	// would have ended with; nil sends every error as Unknown.
	Wire func(error) error
}

// ServeFollow serves one Follow call on the owner: every stream the
// follower named node follows on this broker, each started, acknowledged
// and stopped by its own frames (doc.go, "One Follow call per pair of
// brokers"). first is the call's first message, already read. Each follow
// runs as it did on a call of its own (serveFollow); its error ends it
// alone with a FollowEnd. The call ends when the follower closes it, on a
// message that is not valid for the call as a whole, or when a send fails.
func (m *Manager) ServeFollow(ctx context.Context, first *strandv1.FollowRequest, fs FollowStream, edge FollowEdge) error {
	defer m.cfg.Metrics.FollowCall()()
	ctx, cancel := context.WithCancel(ctx)
	srv := &followServer{m: m, node: first.GetNode(), edge: edge, ctx: ctx,
		follows: make(map[uint64]*servedFollow), wake: make(chan struct{}, 1)}
	// Every follow ends before the call does: none outlives the call's
	// flow control or sends on a finished call, and none starts once the
	// wait for them began (the receiver may still be reading a start).
	defer func() {
		cancel()
		srv.mu.Lock()
		srv.closed = true
		srv.mu.Unlock()
		srv.wg.Wait()
	}()
	if err := srv.apply(first); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := fs.Receive()
			if err == nil {
				err = srv.apply(req)
			}
			if err != nil {
				recvErr <- err
				cancel()
				return
			}
		}
	}()
	sendErr := srv.sendLoop(fs)
	select {
	case err := <-recvErr:
		if errors.Is(err, io.EOF) {
			return nil // the follower closed the call
		}
		return err
	default:
	}
	return sendErr
}

// followServer is the owner's side of one Follow call.
type followServer struct {
	m    *Manager
	node string
	edge FollowEdge
	ctx  context.Context
	wg   sync.WaitGroup

	mu sync.Mutex
	// closed is set once the call ends: no follow starts after.
	closed  bool
	follows map[uint64]*servedFollow
	// ready holds what waits to be sent, in the order it came: each follow
	// has at most one batch in it (put waits until the batch is taken), so
	// a busy stream sends one batch per round and cannot starve the
	// others.
	ready []readyFrame
	// wmDirty holds the follows whose confirm watermark moved past what
	// was last sent on them (noteWatermark); the sender ships each one's
	// newest watermark after the ready frames of the same response.
	wmDirty []*servedFollow
	wake    chan struct{}
}

// servedFollow is one stream's follow within a call.
type servedFollow struct {
	id      uint64
	srv     *followServer
	cancel  context.CancelFunc
	stopped atomic.Bool
	// taken is signalled when the sender took the follow's queued batch;
	// queued says one waits for it (offer sets it, take clears it).
	taken  chan struct{}
	queued atomic.Bool

	// Under srv.mu: the owner's epoch the follow serves at; whether the
	// sender took its first batch (which alone carries the head a follower
	// below it starts at, so no watermark goes before it); the highest
	// confirm watermark sent on it, and the newest the tracker told
	// (wantWM), queued in srv.wmDirty while wmQueued.
	epoch          uint64
	started        bool
	sentWM, wantWM uint64
	wmQueued       bool

	mu      sync.Mutex
	fc      *flowControl
	tracker *confirmTracker
}

type readyFrame struct {
	batch *strandv1.FollowBatch
	end   *strandv1.FollowEnd
	f     *servedFollow
	size  int
}

// apply takes one message of the follower: stops, then starts, then acks
// (a stop queued before a start of the same stream arrives first or in
// the same message).
func (s *followServer) apply(req *strandv1.FollowRequest) error {
	if n := req.GetNode(); n != s.node {
		return &FollowFieldError{Field: "node", Detail: fmt.Sprintf("%q on a call opened by %q", n, s.node)}
	}
	for _, st := range req.GetStops() {
		s.mu.Lock()
		f := s.follows[st.GetId()]
		delete(s.follows, st.GetId())
		s.mu.Unlock()
		if f != nil {
			f.stopped.Store(true)
			f.cancel()
		}
	}
	for i, st := range req.GetStarts() {
		if st.GetId() == 0 {
			return &FollowFieldError{Field: fmt.Sprintf("starts[%d].id", i), Detail: "must be at least 1"}
		}
		s.start(st)
	}
	for _, a := range req.GetAcks() {
		s.mu.Lock()
		f := s.follows[a.GetId()]
		s.mu.Unlock()
		if f != nil {
			f.ack(s.node, a.GetRecordTail(), a.GetCursorEventTail())
		}
	}
	return nil
}

func (s *followServer) start(st *strandv1.FollowStart) {
	ctx, cancel := context.WithCancel(s.ctx)
	f := &servedFollow{id: st.GetId(), srv: s, cancel: cancel, taken: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return
	}
	old := s.follows[f.id]
	s.follows[f.id] = f
	s.wg.Add(1)
	s.mu.Unlock()
	if old != nil {
		// An id is never reused by a follower; one that does replaces
		// its follow rather than running two under one id.
		old.stopped.Store(true)
		old.cancel()
	}
	go func() {
		defer s.wg.Done()
		defer cancel()
		defer s.m.cfg.Metrics.Follow()()
		err := s.m.serveFollow(ctx, s, f, st)
		s.mu.Lock()
		if s.follows[f.id] == f {
			delete(s.follows, f.id)
		}
		s.mu.Unlock()
		if f.stopped.Load() || s.ctx.Err() != nil {
			return // the follower stopped it, or the call is over
		}
		s.queue(readyFrame{end: s.endFrame(f.id, err)})
	}()
}

// endFrame is the FollowEnd of a follow that failed with err: the code and
// message its own call would have ended with.
func (s *followServer) endFrame(id uint64, err error) *strandv1.FollowEnd {
	if s.edge.Wire != nil {
		err = s.edge.Wire(err)
	}
	code, msg := connect.CodeUnknown, err.Error()
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		code, msg = cerr.Code(), cerr.Message()
	}
	return &strandv1.FollowEnd{Id: id, Code: uint32(code), Message: msg}
}

func (s *followServer) queue(fr readyFrame) {
	s.mu.Lock()
	s.ready = append(s.ready, fr)
	s.mu.Unlock()
	s.signal()
}

func (s *followServer) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// noteWatermark is the confirm tracker telling the follow a new watermark
// (confirmTracker.watch): the call's sender ships it in a batch of its
// own, so the follower's copy learns it (readers there see only records
// below it, docs/protocol.md "One rule for W") without the follow's own
// goroutine waking per confirm. It runs under the tracker's lock and takes
// only the call's.
func (f *servedFollow) noteWatermark(wm uint64) {
	s := f.srv
	s.mu.Lock()
	f.wantWM = max(f.wantWM, wm)
	queued := f.queueWatermarkLocked()
	s.mu.Unlock()
	if queued {
		s.signal()
	}
}

// queueWatermarkLocked queues the follow for a watermark batch when the
// newest watermark was not sent and its first batch was. Callers hold
// srv.mu.
func (f *servedFollow) queueWatermarkLocked() bool {
	if !f.started || f.wmQueued || f.wantWM <= f.sentWM {
		return false
	}
	f.wmQueued = true
	f.srv.wmDirty = append(f.srv.wmDirty, f)
	return true
}

// offer queues a follow's batch for the sender without waiting: the follow
// queues its next one only once this one is taken (f.queued), so it has
// one waiting at most (round-robin, doc.go).
func (s *followServer) offer(f *servedFollow, b *strandv1.FollowBatch) {
	select {
	case <-f.taken: // a signal of an earlier batch, already seen
	default:
	}
	f.queued.Store(true)
	s.queue(readyFrame{batch: b, f: f, size: len(b.GetRecordSegment()) + 32*len(b.GetCursorEvents()) + 32*len(b.GetCursorSnapshot().GetCursors())})
}

// put queues a follow's batch and waits until the sender took it.
func (s *followServer) put(ctx context.Context, f *servedFollow, b *strandv1.FollowBatch) error {
	s.offer(f, b)
	select {
	case <-f.taken:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sendLoop sends what the follows queue until the call ends.
func (s *followServer) sendLoop(fs FollowStream) error {
	for {
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-s.wake:
		}
		// The follows woken with the one that woke us (a group commit
		// writes many streams at once) queue their batches first: the
		// waker hands the sender its core next, ahead of them, and a
		// response per stream costs a write each on both brokers.
		runtime.Gosched()
		for {
			resp := s.take()
			if resp == nil {
				break
			}
			if err := fs.Send(resp); err != nil {
				return err
			}
		}
	}
}

// take builds the next response from the ready frames, in their order, up
// to followResponseBytes; nil when nothing is ready. A follow whose batch is
// taken may read its next one while this response is sent.
func (s *followServer) take() *strandv1.FollowResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ready) == 0 && len(s.wmDirty) == 0 {
		return nil
	}
	resp := &strandv1.FollowResponse{}
	size, n := 0, 0
	for n < len(s.ready) && (n == 0 || size+s.ready[n].size <= followResponseBytes) {
		fr := s.ready[n]
		s.ready[n] = readyFrame{}
		n++
		if fr.end != nil {
			resp.Ends = append(resp.Ends, fr.end)
			continue
		}
		resp.Batches = append(resp.Batches, fr.batch)
		size += fr.size
		fr.f.sentWM = max(fr.f.sentWM, fr.batch.GetConfirmWatermark())
		if !fr.f.started {
			// A watermark that moved before the first batch was taken goes
			// after it, in this response.
			fr.f.started = true
			fr.f.queueWatermarkLocked()
		}
		fr.f.queued.Store(false)
		select {
		case fr.f.taken <- struct{}{}:
		default:
		}
	}
	s.ready = append(s.ready[:0], s.ready[n:]...)
	// Watermark batches are a few bytes each and go after the ready
	// frames, so a follow's watermark never overtakes its first batch. A
	// follow that ended (its FollowEnd queued, or stopped) gets none.
	for i, f := range s.wmDirty {
		s.wmDirty[i] = nil
		f.wmQueued = false
		if s.follows[f.id] != f || f.wantWM <= f.sentWM {
			continue
		}
		resp.Batches = append(resp.Batches, &strandv1.FollowBatch{Id: f.id, Epoch: f.epoch, ConfirmWatermark: f.wantWM})
		f.sentWM = f.wantWM
	}
	s.wmDirty = s.wmDirty[:0]
	if len(resp.Batches) == 0 && len(resp.Ends) == 0 {
		return nil
	}
	return resp
}

func (f *servedFollow) setFlow(fc *flowControl, tracker *confirmTracker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fc, f.tracker = fc, tracker
}

// ack takes a follower's durable tails for this follow.
func (f *servedFollow) ack(node string, recordTail, eventTail uint64) {
	f.mu.Lock()
	fc, tracker := f.fc, f.tracker
	f.mu.Unlock()
	if fc == nil {
		return // not started yet: nothing was sent that it could hold
	}
	// Count only what was sent on this follow: a follower cannot claim
	// records it was never given.
	sentRec, sentEv := fc.sentTails()
	tail := min(recordTail, sentRec)
	fc.ack(tail, min(eventTail, sentEv))
	tracker.followerEvents(node, min(eventTail, sentEv))
	tracker.followerDurable(node, tail)
}

// serveFollow serves one stream's follow within a call: it checks the
// follower's position against the owner's log, then sends records and
// cursor events at the owner's offsets, each with its epoch, and the
// confirm watermark. The follower's acknowledgements (servedFollow.ack)
// advance the watermark. It returns the error that ends the follow.
// followApplyWait bounds how long a follow at an epoch this copy has not
// applied yet waits for the copy to apply it. A recovery's commit reaches
// the new owner and its followers through their own assignment watches,
// in no order: a follower that asked before its owner took the role was
// refused and backed off, and after a mass failover thousands of them did,
// so new owners served their first confirm seconds after they could have.
// Waiting here instead answers the follow the moment the role is taken.
// Bounded, since the epoch may never come to this copy (it was left out,
// or the owner role is withheld): then the follow is refused as before.
const followApplyWait = time.Second

func (m *Manager) serveFollow(ctx context.Context, srv *followServer, f *servedFollow, first *strandv1.FollowStart) error {
	if srv.edge.CheckStream != nil {
		if err := srv.edge.CheckStream(first.GetStream()); err != nil {
			return err
		}
	}
	c := m.copy(first.GetStream())
	if c == nil {
		return m.notHere(ctx, first.GetStream())
	}
	if err := c.awaitApplied(ctx, first.GetEpoch(), followApplyWait); err != nil {
		return err
	}
	a, tracker, roleCtx, ok := c.ownerRole()
	if !ok {
		return m.notHere(ctx, first.GetStream())
	}
	node := srv.node
	if !isFollowerOf(a, node) {
		return fmt.Errorf("%w: node %q is not a follower of %q at epoch %d", ErrNotMember, node, c.name, a.Epoch)
	}
	// Fencing: the owner refuses a follower of another epoch (and the
	// follower refuses an owner of another epoch).
	if first.GetEpoch() != a.Epoch {
		return fmt.Errorf("%w: follower at epoch %d, owner at epoch %d", ErrEpochMismatch, first.GetEpoch(), a.Epoch)
	}
	s := c.st.State()
	// Followers get records once written here, before they are durable
	// here (storage.WrittenTail), so a follower's record tail may be past
	// the owner's durable one, never past its written one.
	written, _ := c.st.WrittenTail()
	pos, cpos := first.GetRecordTail(), first.GetCursorEventTail()
	if pos > written || cpos > s.CursorEventTail {
		return fmt.Errorf("%w: follower tails %d/%d, owner tails %d/%d", ErrPastTail, pos, cpos, written, s.CursorEventTail)
	}
	var head, chainAtHead uint64
	if pos < s.Head {
		// Below the retained window: the follower starts at the head.
		chain, err := c.st.ChainAt(s.Head)
		if err != nil {
			return err
		}
		head, chainAtHead, pos = s.Head, chain, s.Head
	} else {
		chain, err := c.st.WrittenChainAt(pos)
		if err != nil {
			return err
		}
		if chain != first.GetChain() {
			return fmt.Errorf("%w: at offset %d follower chain %x, owner chain %x", ErrChainMismatch, pos, first.GetChain(), chain)
		}
		// The follower's durable tail with the owner's chain there: it
		// holds that prefix, so it counts toward W now. Otherwise records
		// a new owner inherited unconfirmed would wait for the next new
		// record to be confirmed, and so would a retry of them, which is
		// answered only once they are (idempotent publish, docs/api.md).
		tracker.followerEvents(node, cpos)
		tracker.followerDurable(node, pos)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(roleCtx, cancel)
	defer stop()

	fc := &flowControl{max: m.cfg.MaxInflightBytes, acked: make(chan struct{}, 1),
		onAck: m.cfg.Metrics.FollowAcked(node)}
	fc.setSent(pos, cpos, 0, time.Time{}, false)
	f.setFlow(fc, tracker)
	// The tracker tells the call's sender each new watermark from here on
	// (noteWatermark); batches of records carry it too.
	srv.mu.Lock()
	f.epoch = a.Epoch
	srv.mu.Unlock()
	tracker.watch(f)
	defer tracker.unwatch(f)
	first0 := true
	for {
		if ctx.Err() != nil {
			if roleCtx.Err() != nil {
				return fmt.Errorf("%w: owner role ended", ErrUnavailable)
			}
			return ctx.Err()
		}
		wm, _ := tracker.get()
		t := c.st.Tails()
		// A follow whose batch the sender has not taken yet reads nothing
		// more (one batch waiting at most, doc.go). With more to send it
		// waits for the take; with nothing more it waits for something to
		// send, below, so a quiet stream is not woken by the take.
		busy := f.queued.Load()
		if busy && (pos < t.Written || cpos < t.CursorEvent) {
			select {
			case <-ctx.Done():
			case <-f.taken:
			}
			continue
		}
		// Records ship once written here (writtenCh); cursor events only
		// once durable here (docs/protocol.md, "Cursors"). The durable
		// record tail moving is nothing to send, so it wakes nothing.
		// Both channels also close when the stream is sealed, moved to a
		// new epoch, cut, reset or closed.
		tailCh := c.st.WaitCursorEventTail(t.CursorEvent)
		writtenCh := c.st.WaitWritten(t.Written)
		cursorCh := c.cursorChanged()
		room := !busy && fc.room()
		var recs []storage.Record
		if pos < t.Written && room {
			var err error
			recs, err = c.st.ReadWritten(pos, followBatchRecords, followBatchBytes)
			if err != nil {
				return err
			}
		}
		// A follower below the cursor events kept here (compacted below
		// the owner's durable cursor snapshot) gets the snapshot, then the
		// events from its boundary: the state it builds is the owner's.
		var snap *strandv1.CursorSnapshot
		if room && cpos < c.st.CursorEventHead() {
			cs := c.st.CursorSnapshot()
			snap = &strandv1.CursorSnapshot{Boundary: cs.Boundary, Epoch: cs.Epoch, Cursors: cs.Cursors}
			cpos = cs.Boundary
		}
		var evs []storage.CursorEvent
		if cpos < t.CursorEvent && room {
			var err error
			evs, err = c.st.ReadCursorEvents(cpos, followBatchEvents)
			if errors.Is(err, storage.ErrOutOfRange) && snap == nil {
				// Compaction passed cpos while we read: the next round
				// sends the snapshot instead.
				evs = nil
			} else if err != nil {
				return err
			}
		}
		if !busy && (len(recs) > 0 || len(evs) > 0 || snap != nil || first0) {
			b := &strandv1.FollowBatch{Id: f.id, Epoch: a.Epoch, ConfirmWatermark: wm, Head: head, ChainAtHead: chainAtHead, CursorSnapshot: snap}
			// One segment in the storage encoding rather than a message
			// per record: both sides' work per record is then a copy.
			b.RecordSegment = storage.EncodeSegment(recs)
			size := 0
			for _, r := range recs {
				size += len(r.Payload)
			}
			for _, e := range evs {
				b.CursorEvents = append(b.CursorEvents, eventToProto(e))
			}
			if n := len(recs); n > 0 {
				pos = recs[n-1].Offset + 1
			}
			if n := len(evs); n > 0 {
				cpos = evs[n-1].Offset + 1
			}
			fc.setSent(pos, cpos, size, time.Now(), len(recs) > 0 || len(evs) > 0 || snap != nil)
			srv.offer(f, b)
			first0, head, chainAtHead = false, 0, 0
			continue
		}
		select {
		case <-ctx.Done():
		case <-tailCh:
		case <-writtenCh:
		case <-cursorCh:
		case <-fc.acked:
		}
	}
}

// flowControl bounds what one follow has sent and the follower has not
// acknowledged: record bytes (max) and batches (followInflightBatches).
type flowControl struct {
	mu       sync.Mutex
	max      int
	inflight []sentBatch
	bytes    int
	tail     uint64
	evTail   uint64
	acked    chan struct{}
	// onAck, when set, is called with the send time of each batch of
	// records the follower acknowledges (metrics: follow_ack_seconds).
	onAck func(sent time.Time)
}

type sentBatch struct {
	end, evEnd uint64
	bytes      int
	records    bool
	sent       time.Time
}

// setSent records what was sent up to the tails tail and evTail: a batch
// of bytes payload bytes, sent at sent, when batch is set.
func (f *flowControl) setSent(tail, evTail uint64, bytes int, sent time.Time, batch bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	records := tail > f.tail
	f.tail, f.evTail = tail, evTail
	if batch {
		f.inflight = append(f.inflight, sentBatch{end: tail, evEnd: evTail, bytes: bytes, records: records, sent: sent})
		f.bytes += bytes
	}
}

func (f *flowControl) sentTails() (uint64, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tail, f.evTail
}

func (f *flowControl) room() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bytes < f.max && len(f.inflight) < followInflightBatches
}

func (f *flowControl) ack(tail, evTail uint64) {
	f.mu.Lock()
	full := f.bytes >= f.max || len(f.inflight) >= followInflightBatches
	for len(f.inflight) > 0 && f.inflight[0].end <= tail && f.inflight[0].evEnd <= evTail {
		if f.onAck != nil && f.inflight[0].records {
			f.onAck(f.inflight[0].sent)
		}
		f.bytes -= f.inflight[0].bytes
		f.inflight = f.inflight[1:]
	}
	freed := full && f.bytes < f.max && len(f.inflight) < followInflightBatches
	f.mu.Unlock()
	// Only an ack that gives room back wakes the sender: one that had
	// room was not waiting for it (serveFollow waits on acked only after
	// room said no, and the channel holds the wake until it looks).
	if freed {
		select {
		case f.acked <- struct{}{}:
		default:
		}
	}
}
