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
	"github.com/strandhq/strand/services/broker/internal/storage"
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
	// stored holds, per response, the batches the receiver queued for
	// storage itself (followSub.applyDirect), in the order it queued
	// them, for the acker (ackStored); storedWake wakes it.
	stored     [][]storedBatch
	storedWake chan struct{}
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
	// working is set while the follow's goroutine holds a batch it took
	// from the inbox and has not yet handed to storage: the receiver then
	// stores nothing of the follow itself, or it would reach storage
	// ahead of that batch.
	working bool

	// sinkMu guards sink: set by the follow once its first batch is
	// applied, cleared before the follow returns, so nothing is stored,
	// acknowledged or applied as a watermark by the receiver or the
	// session's acker once the follow (and with it the copy's role)
	// ended. Both hold it while they use the sink, so clearing it waits
	// for a use under way.
	sinkMu sync.Mutex
	sink   *followSink
}

// followSink is what a follow lends the session once its first batch is
// applied, so that the batches of many streams arriving in one response
// are checked and queued for storage by the receiver, made durable by one
// group commit (storage.EnqueueReplicated) and acknowledged by the
// session's acker in one step, instead of waking two goroutines of each
// stream per batch (doc.go, "One Follow call per pair of brokers").
type followSink struct {
	// watermark applies a batch that only carries the owner's confirm
	// watermark; false when the follow refuses it (another epoch) or is
	// ending, and its goroutine must take the batch.
	watermark func(epoch, wm uint64) bool
	// store checks b and queues it for storage. handled false: the
	// follow's goroutine must take b (it carries a head or a cursor
	// snapshot, another epoch, or the follow is ending); err: storage
	// refused b, and the follow ends with err. nil stores nothing here.
	store func(b *strandv1.FollowBatch, arrived time.Time) (p storage.Pending, handled bool, err error)
	// durable runs once every batch store queued for the follow in one
	// response is durable: it applies what it changes (the watermark
	// capped at the new durable tail, metrics) and returns the durable
	// tails to acknowledge.
	durable func(stored []storedBatch) (recordTail, eventTail uint64)
}

// storedBatch is a batch the receiver queued for storage on a follow's
// behalf, waiting in the session's acker to become durable.
type storedBatch struct {
	sub     *followSub
	pending storage.Pending
	arrived time.Time
	// records says the batch held records, and bytes is its record
	// segment as the owner sent it (follow metrics).
	records bool
	bytes   int
}

// setSink sets (or, with nil, clears) what the receiver and the acker use
// to apply the follow's batches themselves.
func (sub *followSub) setSink(sink *followSink) {
	sub.sinkMu.Lock()
	sub.sink = sink
	sub.sinkMu.Unlock()
}

// watermarkOnly reports that b carries nothing to store: no records, no
// cursor events or snapshot, no head.
func watermarkOnly(b *strandv1.FollowBatch) bool {
	return len(b.GetRecordSegment()) == 0 && len(b.GetCursorEvents()) == 0 && b.GetCursorSnapshot() == nil && b.GetHead() == 0
}

// idle reports that nothing of the follow waits in its inbox or is being
// handed to storage by its goroutine, and it has not ended: only then may
// the receiver apply a batch of it itself without overtaking one.
func (sub *followSub) idle() bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return len(sub.inbox) == 0 && !sub.working && sub.err == nil
}

// applyDirect applies b on the receiver instead of waking the follow's
// goroutine for it, when the follow is idle and lent a sink: a
// watermark-only batch is applied at once (capped at the copy's durable
// tail, as every watermark is), a batch to store is checked and queued for
// storage and added to stored, for the acker. It reports whether b was
// taken; otherwise the follow's goroutine gets it, and handles it (or
// refuses it, ending the follow) as it does any other.
func (sub *followSub) applyDirect(b *strandv1.FollowBatch, arrived time.Time, stored *[]storedBatch) bool {
	if !sub.idle() {
		return false
	}
	sub.sinkMu.Lock()
	defer sub.sinkMu.Unlock()
	sink := sub.sink
	if sink == nil {
		return false
	}
	if watermarkOnly(b) {
		return sink.watermark != nil && sink.watermark(b.GetEpoch(), b.GetConfirmWatermark())
	}
	if sink.store == nil {
		return false
	}
	p, handled, err := sink.store(b, arrived)
	if !handled {
		return false
	}
	if err != nil {
		// Refused: this follow alone ends, with the error its goroutine
		// would have returned; its stop goes from there. Later batches of
		// it are dropped (push after finish).
		sub.finish(err)
		return true
	}
	*stored = append(*stored, storedBatch{sub: sub, pending: p, arrived: arrived, records: len(b.GetRecordSegment()) > 0, bytes: len(b.GetRecordSegment())})
	return true
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
		s.ackStored()
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

// deliver hands each batch and end to its follow. It never waits on one:
// a stream that is slow to take its batches holds up no other (the owner's
// flow control bounds what each one queues).
func (s *followSession) deliver(resp *strandv1.FollowResponse) {
	arrived := time.Now()
	var stored []storedBatch
	for _, b := range resp.GetBatches() {
		s.mu.Lock()
		sub := s.subs[b.GetId()]
		s.mu.Unlock()
		if sub == nil { // a follow stopped here since; dropped
			continue
		}
		if sub.applyDirect(b, arrived, &stored) {
			continue
		}
		sub.push(b)
	}
	if len(stored) > 0 {
		s.mu.Lock()
		s.stored = append(s.stored, stored)
		s.mu.Unlock()
		select {
		case s.storedWake <- struct{}{}:
		default:
		}
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
// replaces it. Two goroutines ack a follow (its own acker, for the batches
// its goroutine stored, and the session's, for those the receiver stored),
// each with tails it read after a wait: the queued ack keeps the higher of
// each, so a late ack of lower tails never takes back a higher one not
// yet sent (the owner ignores lower tails, never needs them).
func (s *followSession) ack(sub *followSub, recordTail, eventTail uint64) {
	s.mu.Lock()
	if _, live := s.subs[sub.id]; !live {
		s.mu.Unlock()
		return
	}
	if a, ok := s.acks[sub.id]; ok {
		a.RecordTail, a.CursorEventTail = max(a.RecordTail, recordTail), max(a.CursorEventTail, eventTail)
	} else {
		s.acks[sub.id] = &strandv1.FollowAck{Id: sub.id, RecordTail: recordTail, CursorEventTail: eventTail}
		s.ackIDs = append(s.ackIDs, sub.id)
	}
	s.mu.Unlock()
	s.signal()
}

// next returns the follow's next batch, in the order the owner sent them:
// the batches received before the call broke or the owner ended the
// follow come first, then the error.
func (s *followSession) next(ctx context.Context, sub *followSub) (*strandv1.FollowBatch, error) {
	// The batch taken before, if any, is in storage's queue (or refused,
	// and the follow ends): the receiver may store the next ones itself.
	sub.mu.Lock()
	sub.working = false
	sub.mu.Unlock()
	for {
		sub.mu.Lock()
		if len(sub.inbox) > 0 {
			b := sub.inbox[0]
			sub.inbox[0] = nil
			sub.inbox = sub.inbox[1:]
			sub.working = true
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

// ackStored waits for the batches the receiver queued for storage to be
// durable and acknowledges them: per response, each follow's durable tails
// once, read after every batch of it in the response is durable, in one
// step for every follow the response carried. The follower acknowledges
// only what storage synced (docs/protocol.md, "One rule for W"): a batch
// whose write failed ends its follow with the error and acknowledges
// nothing. Batches of one response were queued in order, and the
// committer reports them in queue order, so waiting in order costs no
// more than the last one's sync.
func (s *followSession) ackStored() {
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.storedWake:
		}
		for {
			s.mu.Lock()
			if len(s.stored) == 0 {
				s.mu.Unlock()
				break
			}
			group := s.stored[0]
			s.stored[0] = nil
			s.stored = s.stored[1:]
			s.mu.Unlock()
			if !s.ackGroup(group) {
				return
			}
		}
	}
}

// ackGroup acknowledges one response's stored batches; false once the
// session ended.
func (s *followSession) ackGroup(group []storedBatch) bool {
	failed := map[*followSub]bool{}
	for _, g := range group {
		if failed[g.sub] {
			continue
		}
		if err := g.pending.Wait(s.ctx); err != nil {
			if s.ctx.Err() != nil {
				return false // the call ended: every follow on it ends too
			}
			// Its write failed: nothing of it is acknowledged, and only
			// this follow ends (the storage error is this copy's, not the
			// owner's).
			failed[g.sub] = true
			g.sub.finish(localErr(err))
		}
	}
	// Each follow once, after every batch of it in the response.
	var order []*followSub
	mine := make(map[*followSub][]storedBatch, len(group))
	for _, g := range group {
		if _, ok := mine[g.sub]; !ok {
			order = append(order, g.sub)
		}
		mine[g.sub] = append(mine[g.sub], g)
	}
	for _, sub := range order {
		if !failed[sub] {
			s.ackDurable(sub, mine[sub])
		}
	}
	return true
}

// ackDurable acknowledges a follow's durable tails once its stored batches
// are durable, unless the follow ended meanwhile (its sink cleared): then
// it acknowledges and applies nothing, as its own acker would not.
func (s *followSession) ackDurable(sub *followSub, mine []storedBatch) {
	sub.sinkMu.Lock()
	defer sub.sinkMu.Unlock()
	if sub.sink == nil || sub.sink.durable == nil {
		return
	}
	rec, ev := sub.sink.durable(mine)
	s.ack(sub, rec, ev)
}
