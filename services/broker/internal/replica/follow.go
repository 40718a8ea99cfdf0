package replica

import (
	"context"
	"fmt"
	"sync"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

const (
	followBatchRecords = 512
	followBatchBytes   = 1 << 20
	followBatchEvents  = 512
)

// FollowStream is the owner's side of one Follow call.
type FollowStream interface {
	Receive() (*strandv1.FollowRequest, error)
	Send(*strandv1.FollowResponse) error
}

// ServeFollow serves one follower on the owner: it checks the follower's
// position against the owner's log, then sends records and cursor events at
// the owner's offsets, each with its epoch, and the confirm watermark. The
// follower's acknowledgements on the same stream advance the watermark.
func (m *Manager) ServeFollow(ctx context.Context, first *strandv1.FollowRequest, fs FollowStream) error {
	c := m.copy(first.GetStream())
	if c == nil {
		return m.notHere(first.GetStream())
	}
	a, tracker, roleCtx, ok := c.ownerRole()
	if !ok {
		return m.notHere(first.GetStream())
	}
	node := first.GetNode()
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
		tracker.followerDurable(node, pos)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(roleCtx, cancel)
	defer stop()

	fc := &flowControl{max: m.cfg.MaxInflightBytes, acked: make(chan struct{}, 1),
		onAck: m.cfg.Metrics.FollowAcked(node)}
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := fs.Receive()
			if err != nil {
				recvErr <- err
				cancel()
				return
			}
			// Count only what was sent on this stream: a follower cannot
			// claim records it was never given.
			tail := min(req.GetRecordTail(), fc.sentTail())
			fc.ack(tail)
			tracker.followerDurable(node, tail)
		}
	}()

	fc.setSent(pos, 0, time.Time{})
	var lastWM uint64
	first0 := true
	for {
		if ctx.Err() != nil {
			select {
			case err := <-recvErr:
				return err
			default:
			}
			if roleCtx.Err() != nil {
				return fmt.Errorf("%w: owner role ended", ErrUnavailable)
			}
			return ctx.Err()
		}
		wm, wmChanged := tracker.get()
		t := c.st.Tails()
		// WaitTail also closes on new durable cursor events, which ship
		// only once durable here (docs/protocol.md, "Cursors").
		tailCh := c.st.WaitTail(t.Record)
		writtenCh := c.st.WaitWritten(t.Written)
		cursorCh := c.cursorChanged()
		var recs []storage.Record
		if pos < t.Written && fc.room() {
			var err error
			recs, err = c.st.ReadWritten(pos, followBatchRecords, followBatchBytes)
			if err != nil {
				return err
			}
		}
		var evs []storage.CursorEvent
		if cpos < t.CursorEvent {
			var err error
			evs, err = c.st.ReadCursorEvents(cpos, followBatchEvents)
			if err != nil {
				return err
			}
		}
		if len(recs) > 0 || len(evs) > 0 || wm != lastWM || first0 {
			resp := &strandv1.FollowResponse{Epoch: a.Epoch, ConfirmWatermark: wm, Head: head, ChainAtHead: chainAtHead}
			// One segment in the storage encoding rather than a message
			// per record: both sides' work per record is then a copy.
			resp.RecordSegment = storage.EncodeSegment(recs)
			size := 0
			for _, r := range recs {
				size += len(r.Payload)
			}
			for _, e := range evs {
				resp.CursorEvents = append(resp.CursorEvents, eventToProto(e))
			}
			if n := len(recs); n > 0 {
				pos = recs[n-1].Offset + 1
			}
			if n := len(evs); n > 0 {
				cpos = evs[n-1].Offset + 1
			}
			fc.setSent(pos, size, time.Now())
			if err := fs.Send(resp); err != nil {
				return err
			}
			lastWM, first0, head, chainAtHead = wm, false, 0, 0
			continue
		}
		select {
		case <-ctx.Done():
		case <-tailCh:
		case <-writtenCh:
		case <-wmChanged:
		case <-cursorCh:
		case <-fc.acked:
		}
	}
}

// flowControl bounds record bytes sent to a follower and not acknowledged.
type flowControl struct {
	mu       sync.Mutex
	max      int
	inflight []sentBatch
	bytes    int
	tail     uint64
	acked    chan struct{}
	// onAck, when set, is called with the send time of each batch the
	// follower acknowledges (metrics: follow_ack_seconds).
	onAck func(sent time.Time)
}

type sentBatch struct {
	end   uint64
	bytes int
	sent  time.Time
}

// setSent records the records sent up to tail: a batch of bytes payload
// bytes, sent at sent, when bytes > 0.
func (f *flowControl) setSent(tail uint64, bytes int, sent time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tail = tail
	if bytes > 0 {
		f.inflight = append(f.inflight, sentBatch{end: tail, bytes: bytes, sent: sent})
		f.bytes += bytes
	}
}

func (f *flowControl) sentTail() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tail
}

func (f *flowControl) room() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bytes < f.max
}

func (f *flowControl) ack(tail uint64) {
	f.mu.Lock()
	for len(f.inflight) > 0 && f.inflight[0].end <= tail {
		if f.onAck != nil {
			f.onAck(f.inflight[0].sent)
		}
		f.bytes -= f.inflight[0].bytes
		f.inflight = f.inflight[1:]
	}
	f.mu.Unlock()
	select {
	case f.acked <- struct{}{}:
	default:
	}
}
