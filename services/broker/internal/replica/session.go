package replica

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

const (
	// followControlPerMessage and followAcksPerMessage bound the frames of
	// one FollowRequest, so that a thousand streams starting at once still
	// travel in messages under the owner's read limit (64 KiB; a start is
	// at most about 200 bytes, an ack about 35).
	followControlPerMessage = 128
	followAcksPerMessage    = 512
)

// followSession is this broker's one Follow call to one owner broker,
// shared by every stream this broker follows there (doc.go, "One Follow
// call per pair of brokers"). Streams join with start and leave with stop;
// the call ends once none is left, or when it breaks, which ends every
// follow on it with the call's error.
type followSession struct {
	m      *Manager
	owner  string
	addr   string
	ctx    context.Context
	cancel context.CancelFunc
	// done is closed once the call has ended; err then says why.
	done chan struct{}
	err  error
	// refs counts the follows holding the session (Manager.followMu).
	refs int

	mu     sync.Mutex
	nextID uint64
	subs   map[uint64]*followSub
	// control holds starts and stops in the order they were made: a stop
	// of a stream's follow always reaches the owner before the stream's
	// next start.
	control []controlFrame
	acks    map[uint64]*strandv1.FollowAck
	ackIDs  []uint64
	wake    chan struct{}

	// stored holds the outcomes of the follows' batches that the
	// committer told (noteDurable), for the acker (ackLoop) to hand to
	// their follows: one goroutine per session wakes per group commit,
	// not one per stream per batch.
	storedMu   sync.Mutex
	stored     []storedNote
	storedWake chan struct{}
}

type storedNote struct {
	sub *followSub
	err error
	b   storedBatch
}

type controlFrame struct {
	start *strandv1.FollowStart
	stop  *strandv1.FollowStop
}

// followSub is one stream's follow on a session: the batches received for
// it, in order, and the owner's end of it.
type followSub struct {
	id     uint64
	notify chan struct{}

	mu    sync.Mutex
	inbox []*strandv1.FollowBatch
	err   error
	// taking is set while the follow's goroutine applies a batch it took
	// from the inbox: the receiver stores none ahead of it.
	taking bool

	// applyMu guards direct and durableMu onDurable, which the follow
	// sets and clears (nil) before it returns, so nothing is stored,
	// applied or acknowledged here once the follow (and with it the copy's
	// role) ended: the receiver and the acker call them under their lock.
	// Two locks, so that the acker, which serves every follow of the
	// session, never waits on a receiver waiting for room in storage's
	// queue under applyMu.
	applyMu   sync.Mutex
	direct    *followDirect
	durableMu sync.Mutex
	onDurable func(err error, b storedBatch)
}

// followDirect is what a follow lends the session's receiver once it has
// applied its first batch (which alone may carry the head a copy below the
// owner starts at): the receiver then stores each batch of the follow's
// epoch itself, with no goroutine of the follow woken per batch (doc.go).
type followDirect struct {
	// ctx is the follow's: once it ended (the role ends, the follow
	// returns) the receiver stores and applies nothing more for it.
	ctx   context.Context
	epoch uint64
	// store queues a batch's records and cursor events in storage; its
	// outcome comes back through onDurable. An error ends the follow.
	store func(b *strandv1.FollowBatch, arrived time.Time) error
	// watermark applies the owner's confirm watermark, capped at the copy's
	// durable tail.
	watermark func(wm uint64)
}

// storedBatch is a batch queued in storage, as its acknowledgement needs it.
type storedBatch struct {
	arrived time.Time // when it came (follow_apply_seconds)
	records bool      // whether it held records
	// bytes is its record segment as the owner sent it
	// (follow_stored_bytes_total).
	bytes int
}

// setDirect sets (or, with nil, clears) what the receiver applies the
// follow's batches with.
func (sub *followSub) setDirect(d *followDirect) {
	sub.applyMu.Lock()
	sub.direct = d
	sub.applyMu.Unlock()
}

// setOnDurable sets (or, with nil, clears) what the session's acker tells
// each of the follow's stored batches' outcome to.
func (sub *followSub) setOnDurable(fn func(error, storedBatch)) {
	sub.durableMu.Lock()
	sub.onDurable = fn
	sub.durableMu.Unlock()
}

// watermarkOnly reports that b carries nothing to store: no records, no
// cursor events or snapshot, no head.
func watermarkOnly(b *strandv1.FollowBatch) bool {
	return len(b.GetRecordSegment()) == 0 && len(b.GetCursorEvents()) == 0 && b.GetCursorSnapshot() == nil && b.GetHead() == 0
}

// applyDirect stores and applies b on the receiver instead of waking the
// follow's goroutine for it: only when nothing of the follow waits in its
// inbox or is being applied by its goroutine (so b never goes ahead of an
// earlier batch), the follow lent its direct path, b is of the follow's
// epoch, and b carries no head or cursor snapshot (the follow's goroutine
// takes those, and another epoch, which ends the follow). A batch the
// store refuses ends the follow with the store's error.
func (sub *followSub) applyDirect(b *strandv1.FollowBatch, arrived time.Time) bool {
	sub.mu.Lock()
	idle := len(sub.inbox) == 0 && sub.err == nil && !sub.taking
	sub.mu.Unlock()
	if !idle || b.GetHead() != 0 || b.GetCursorSnapshot() != nil {
		return false
	}
	sub.applyMu.Lock()
	defer sub.applyMu.Unlock()
	d := sub.direct
	if d == nil || b.GetEpoch() != d.epoch || d.ctx.Err() != nil {
		return false
	}
	if !watermarkOnly(b) {
		if err := d.store(b, arrived); err != nil {
			sub.finish(err)
			return true
		}
	}
	d.watermark(b.GetConfirmWatermark())
	return true
}

// durable tells the follow a stored batch's outcome, unless it ended.
func (sub *followSub) durable(err error, b storedBatch) {
	sub.durableMu.Lock()
	defer sub.durableMu.Unlock()
	if sub.onDurable != nil {
		sub.onDurable(err, b)
	}
}

// followSession returns the session to owner, opening the call if there is
// none (or the owner moved to another address), and holds it for the
// caller until releaseFollowSession.
func (m *Manager) followSession(owner string) (*followSession, error) {
	addr := m.BrokerAddr(owner)
	if addr == "" {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("owner %q is not registered", owner))
	}
	m.followMu.Lock()
	defer m.followMu.Unlock()
	if s := m.sessions[owner]; s != nil && s.addr == addr {
		select {
		case <-s.done:
		default:
			s.refs++
			return s, nil
		}
	}
	if err := m.ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: broker shutting down", ErrUnavailable)
	}
	ctx, cancel := context.WithCancel(m.ctx)
	s := &followSession{m: m, owner: owner, addr: addr, ctx: ctx, cancel: cancel, done: make(chan struct{}), refs: 1,
		subs: make(map[uint64]*followSub), acks: make(map[uint64]*strandv1.FollowAck), wake: make(chan struct{}, 1),
		storedWake: make(chan struct{}, 1)}
	m.sessions[owner] = s
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		s.ackLoop()
	}()
	go func() {
		defer m.wg.Done()
		err := s.call()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
		cancel()
		m.followMu.Lock()
		if m.sessions[owner] == s {
			delete(m.sessions, owner)
		}
		m.followMu.Unlock()
	}()
	return s, nil
}

// releaseFollowSession lets go of a session; the last follow to leave ends
// the call.
func (m *Manager) releaseFollowSession(s *followSession) {
	m.followMu.Lock()
	s.refs--
	last := s.refs == 0
	if last && m.sessions[s.owner] == s {
		delete(m.sessions, s.owner)
	}
	m.followMu.Unlock()
	if last {
		s.cancel()
	}
}

// call runs the Follow call until it breaks or the session is cancelled.
func (s *followSession) call() error {
	stream := s.m.cfg.Dial(s.addr).Follow(s.ctx)
	// A cancelled context does not wake a Receive blocked on the owner once
	// response headers arrived: net/http only watches the context again after
	// the request body ends. Closing the request side on cancellation does
	// that, so a seal or role change never waits on a stopped owner.
	var sendMu sync.Mutex
	closed := false
	closeRequest := func() {
		sendMu.Lock()
		defer sendMu.Unlock()
		if !closed {
			closed = true
			_ = stream.CloseRequest()
		}
	}
	send := func(req *strandv1.FollowRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		if closed {
			return s.ctx.Err()
		}
		return stream.Send(req)
	}
	stop := context.AfterFunc(s.ctx, closeRequest)
	defer stop()
	defer closeRequest()
	sendErr := make(chan error, 1)
	go func() {
		err := s.sendLoop(send)
		sendErr <- err
		s.cancel()
	}()
	for {
		resp, err := stream.Receive()
		if err != nil {
			cancelled := s.ctx.Err() != nil
			s.cancel()
			if serr := <-sendErr; cancelled && serr != nil {
				return serr // the send broke first and ended the receive
			}
			return err
		}
		s.deliver(resp)
	}
}

// sendLoop sends starts, stops and acks as follows make them; the first
// message goes at once and names this broker. The follows only queue
// frames and never send themselves: a send can wait on the owner (HTTP/2
// flow control), and a stream's role change, which stops its follow, must
// never wait on a call the other streams share.
func (s *followSession) sendLoop(send func(*strandv1.FollowRequest) error) error {
	first := true
	for {
		req := s.nextRequest()
		if req == nil && !first {
			select {
			case <-s.ctx.Done():
				return nil
			case <-s.wake:
			}
			// The acks of streams made durable by the same sync queue
			// first (followServer.sendLoop says why): one message for
			// them rather than one each.
			runtime.Gosched()
			continue
		}
		if req == nil {
			req = &strandv1.FollowRequest{}
		}
		first = false
		req.Node = s.m.cfg.Node
		if err := send(req); err != nil {
			return err
		}
	}
}

// nextRequest takes the frames waiting to be sent, up to one message's
// worth; nil when none is.
func (s *followSession) nextRequest() *strandv1.FollowRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.control) == 0 && len(s.ackIDs) == 0 {
		return nil
	}
	req := &strandv1.FollowRequest{}
	n := min(len(s.control), followControlPerMessage)
	for _, f := range s.control[:n] {
		if f.start != nil {
			req.Starts = append(req.Starts, f.start)
		} else {
			req.Stops = append(req.Stops, f.stop)
		}
	}
	clear(s.control[:n])
	s.control = append(s.control[:0], s.control[n:]...)
	n = min(len(s.ackIDs), followAcksPerMessage)
	for _, id := range s.ackIDs[:n] {
		// A follow stopped since its ack was queued has none any more.
		if a, ok := s.acks[id]; ok {
			req.Acks = append(req.Acks, a)
			delete(s.acks, id)
		}
	}
	s.ackIDs = append(s.ackIDs[:0], s.ackIDs[n:]...)
	return req
}

func (s *followSession) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// noteDurable is a stored batch's outcome, told by the committer
// (storage.Stream.EnqueueReplicated's onDurable): queued for the acker, so
// the committer neither waits nor takes a lock of the follow's.
func (s *followSession) noteDurable(sub *followSub, err error, b storedBatch) {
	s.storedMu.Lock()
	s.stored = append(s.stored, storedNote{sub: sub, err: err, b: b})
	s.storedMu.Unlock()
	select {
	case s.storedWake <- struct{}{}:
	default:
	}
}

// ackLoop hands each stored batch's outcome to its follow, which
// acknowledges the copy's durable tails (or ends on a failed write), until
// the session ends, which ends its follows too.
func (s *followSession) ackLoop() {
	var notes []storedNote
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.storedWake:
		}
		s.storedMu.Lock()
		notes, s.stored = s.stored, notes[:0]
		s.storedMu.Unlock()
		for i, n := range notes {
			n.sub.durable(n.err, n.b)
			notes[i] = storedNote{}
		}
	}
}

// deliver hands each batch and end to its follow, or stores the batch
// itself for a follow that lent it its direct path (applyDirect). It never
// waits on a follow's goroutine: a stream that is slow to take its batches
// holds up no other (the owner's flow control bounds what each one
// queues); a store waits only when the storage queue is full, which every
// stream of this broker shares.
func (s *followSession) deliver(resp *strandv1.FollowResponse) {
	arrived := time.Now()
	for _, b := range resp.GetBatches() {
		s.mu.Lock()
		sub := s.subs[b.GetId()]
		s.mu.Unlock()
		if sub == nil { // a follow stopped here since; dropped
			continue
		}
		if sub.applyDirect(b, arrived) {
			continue
		}
		sub.push(b)
	}
	for _, e := range resp.GetEnds() {
		s.mu.Lock()
		sub := s.subs[e.GetId()]
		// The owner ended it: there is nothing to stop there.
		delete(s.subs, e.GetId())
		s.mu.Unlock()
		if sub != nil {
			code := connect.Code(e.GetCode())
			if code < connect.CodeCanceled || code > connect.CodeUnauthenticated {
				code = connect.CodeUnknown
			}
			sub.finish(connect.NewError(code, errors.New(e.GetMessage())))
		}
	}
}

// start begins a stream's follow on the call; st's id is set here.
func (s *followSession) start(st *strandv1.FollowStart) *followSub {
	s.mu.Lock()
	s.nextID++
	st.Id = s.nextID
	sub := &followSub{id: st.Id, notify: make(chan struct{}, 1)}
	s.subs[sub.id] = sub
	s.control = append(s.control, controlFrame{start: st})
	s.mu.Unlock()
	s.signal()
	return sub
}

// stop ends a stream's follow on the call (unless the owner ended it).
func (s *followSession) stop(sub *followSub) {
	s.mu.Lock()
	_, live := s.subs[sub.id]
	delete(s.subs, sub.id)
	delete(s.acks, sub.id)
	if live {
		s.control = append(s.control, controlFrame{stop: &strandv1.FollowStop{Id: sub.id}})
	}
	s.mu.Unlock()
	if live {
		s.signal()
	}
}

// ack queues a follow's durable tails; a later ack before the send
// replaces it (the tails only grow).
func (s *followSession) ack(sub *followSub, recordTail, eventTail uint64) {
	s.mu.Lock()
	if _, live := s.subs[sub.id]; !live {
		s.mu.Unlock()
		return
	}
	if a, ok := s.acks[sub.id]; ok {
		a.RecordTail, a.CursorEventTail = recordTail, eventTail
	} else {
		s.acks[sub.id] = &strandv1.FollowAck{Id: sub.id, RecordTail: recordTail, CursorEventTail: eventTail}
		s.ackIDs = append(s.ackIDs, sub.id)
	}
	s.mu.Unlock()
	s.signal()
}

// next returns the follow's next batch, in the order the owner sent them:
// the batches received before the call broke or the owner ended the
// follow come first, then the error. The follow applies the batch and
// calls settle before the receiver may store a later one itself.
func (s *followSession) next(ctx context.Context, sub *followSub) (*strandv1.FollowBatch, error) {
	for {
		sub.mu.Lock()
		if len(sub.inbox) > 0 {
			b := sub.inbox[0]
			sub.inbox[0] = nil
			sub.inbox = sub.inbox[1:]
			sub.taking = true
			sub.mu.Unlock()
			return b, nil
		}
		err := sub.err
		sub.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-sub.notify:
		case <-s.done:
			// Whatever the call delivered before it ended is in the inbox.
			sub.mu.Lock()
			more := len(sub.inbox) > 0
			sub.mu.Unlock()
			if !more {
				return nil, s.err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// settle says the follow's goroutine is done with the batch next gave it.
func (sub *followSub) settle() {
	sub.mu.Lock()
	sub.taking = false
	sub.mu.Unlock()
}

func (sub *followSub) push(b *strandv1.FollowBatch) {
	sub.mu.Lock()
	if sub.err == nil {
		sub.inbox = append(sub.inbox, b)
	}
	sub.mu.Unlock()
	sub.wakeUp()
}

func (sub *followSub) finish(err error) {
	sub.mu.Lock()
	if sub.err == nil {
		sub.err = err
	}
	sub.mu.Unlock()
	sub.wakeUp()
}

func (sub *followSub) wakeUp() {
	select {
	case sub.notify <- struct{}{}:
	default:
	}
}
