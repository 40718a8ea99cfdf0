package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
)

// Bounds of the seal calls to one broker (docs/protocol.md, "Stream
// failover").
const (
	// maxSealManyEntries is the most seals one SealMany carries: the
	// broker's entry limit (its api.MaxSealManyEntries).
	maxSealManyEntries = 1024
	// sealCallsInFlight bounds the calls to one broker at once. The seals
	// that reach a sender while they are all busy queue and go together in
	// the next call, so a mass failover sends a few calls each carrying the
	// seals of many rounds instead of a call per copy, and a lone failover
	// sends its seal at once.
	sealCallsInFlight = 4
)

// sealSender sends the seals of every round in flight that go to one
// broker address, gathered into SealMany calls. Gathering changes how
// many seals share a request, never what one seal is: the broker answers
// each entry as a Seal of it, and each answer goes back to its round alone.
type sealSender struct {
	rc strandv1connect.ReplicationServiceClient
	// ctx is the term's: a call outlives no leadership.
	ctx context.Context
	// single is set once the broker answered SealMany Unimplemented (a
	// broker older than it): every seal is then a Seal of its own.
	single atomic.Bool
	// many counts the SealMany calls answered (tests read it).
	many atomic.Int64

	mu       sync.Mutex
	queue    []*sealEntry
	inFlight int
}

// sealEntry is one round's seal of one copy waiting for its answer.
type sealEntry struct {
	ctx context.Context
	req *strandv1.SealRequest
	res chan sealAnswer // buffered: the sender never waits for a round that left
}

type sealAnswer struct {
	resp *strandv1.SealResponse
	err  error
}

// sender returns the term's sender for a broker address, making one on
// first use. Senders are kept for the term, one per address a seal was
// sent to: a few per broker that ever registered.
func (t *term) sender(addr string) *sealSender {
	t.sendersMu.Lock()
	defer t.sendersMu.Unlock()
	if s, ok := t.senders[addr]; ok {
		return s
	}
	cfg := t.w.cfg
	s := &sealSender{
		rc:  strandv1connect.NewReplicationServiceClient(cfg.HTTPClient, cfg.Dialer.BaseURL(addr), rpcserver.WithPeerToken(cfg.PeerToken)),
		ctx: t.ctx,
	}
	if t.senders == nil {
		t.senders = map[string]*sealSender{}
	}
	t.senders[addr] = s
	return s
}

// forgetSenders drops the senders, so a broker that registered again
// (perhaps upgraded, now serving SealMany) is asked with SealMany again.
func (t *term) forgetSenders() {
	t.sendersMu.Lock()
	defer t.sendersMu.Unlock()
	clear(t.senders)
}

// seal is one Seal of req: what the broker answered for it, alone or as an
// entry of a SealMany, or ctx's error once ctx ends first.
func (s *sealSender) seal(ctx context.Context, req *strandv1.SealRequest) (*strandv1.SealResponse, error) {
	if s.single.Load() {
		return s.sealOne(ctx, req)
	}
	e := &sealEntry{ctx: ctx, req: req, res: make(chan sealAnswer, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, e)
	for len(s.queue) > 0 && s.inFlight < sealCallsInFlight {
		s.inFlight++
		go s.run(s.takeLocked())
	}
	s.mu.Unlock()
	select {
	case a := <-e.res:
		return a.resp, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run sends batch and then what queued meanwhile, until the queue is
// empty; then it gives its slot back.
func (s *sealSender) run(batch []*sealEntry) {
	for {
		if len(batch) > 0 {
			s.send(batch)
		}
		s.mu.Lock()
		batch = s.takeLocked()
		if len(batch) == 0 {
			s.inFlight--
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// takeLocked takes the next call's entries: in queue order, at most
// maxSealManyEntries, one per stream (the broker refuses a stream twice in
// a call; a second round of one stream waits for the next call). A seal
// whose round has ended, or whose deadline has passed even if its context
// does not say so yet (rpcerr.EntryEnded), is answered and dropped, never
// sent: a late seal would only fence a copy for a round no longer
// listening. s.mu must be held.
func (s *sealSender) takeLocked() []*sealEntry {
	var batch []*sealEntry
	streams := map[string]bool{}
	rest := s.queue[:0]
	for _, e := range s.queue {
		if rpcerr.EntryEnded(e.ctx) {
			// Answered with what its context says, or will say once
			// its timer fires: the round reads this or its context's
			// end, the same outcome.
			err := e.ctx.Err()
			if err == nil {
				err = context.DeadlineExceeded
			}
			e.res <- sealAnswer{err: err}
			continue
		}
		if len(batch) == maxSealManyEntries || streams[e.req.GetStream()] {
			rest = append(rest, e)
			continue
		}
		streams[e.req.GetStream()] = true
		batch = append(batch, e)
	}
	clear(s.queue[len(rest):])
	s.queue = rest
	return batch
}

// send sends batch as one SealMany and answers every entry with its own
// result as it arrives: an entry the broker answered early goes back to
// its round at once, whatever the others wait for. The call lasts while
// any of its rounds does: once none listens it is cancelled, as their
// Seals would have been.
func (s *sealSender) send(batch []*sealEntry) {
	if s.single.Load() {
		// Queued before another call found the broker older than
		// SealMany.
		s.sendEach(batch)
		return
	}
	req := &strandv1.SealManyRequest{Seals: make([]*strandv1.SealRequest, len(batch))}
	waiting := make([]context.Context, len(batch))
	for i, e := range batch {
		req.Seals[i], waiting[i] = e.req, e.ctx
	}
	ctx, stop := rpcerr.EntriesContext(s.ctx, waiting)
	defer stop()
	answered := make([]bool, len(batch))
	left := len(batch)
	stream, err := s.rc.SealMany(ctx, connect.NewRequest(req))
	if err == nil {
		for left > 0 && stream.Receive() {
			for _, r := range stream.Msg().GetResults() {
				i := int(r.GetEntry())
				if i >= len(batch) || answered[i] {
					continue // not an entry of this call, or answered already: a broker's fault, not the round's answer
				}
				answered[i] = true
				left--
				e := batch[i]
				switch o := r.GetOutcome().(type) {
				case *strandv1.SealResult_Response:
					e.res <- sealAnswer{resp: o.Response}
				case *strandv1.SealResult_Error:
					e.res <- sealAnswer{err: rpcerr.FromEntry(o.Error, rpcerr.EntryPrefix("seals", i))}
				default:
					e.res <- sealAnswer{err: fmt.Errorf("worker: SealMany answered seals[%d] with no outcome", i)}
				}
			}
		}
		err = stream.Err()
		_ = stream.Close()
	}
	if connect.CodeOf(err) == connect.CodeUnimplemented && left == len(batch) {
		// A broker older than SealMany: a Seal per copy from now on.
		s.single.Store(true)
		s.sendEach(batch)
		return
	}
	if left == 0 {
		s.many.Add(1)
		return
	}
	if err == nil {
		err = fmt.Errorf("worker: SealMany ended with %d of %d seals unanswered", left, len(batch))
	}
	// Refused whole, or cut short (the connection, the broker going away,
	// an InvalidArgument for the call's bounds): what each Seal not yet
	// answered would have met. The round counts that copy as not
	// answering.
	for i, e := range batch {
		if !answered[i] {
			e.res <- sealAnswer{err: err}
		}
	}
}

// sendEach sends every entry of batch as a Seal of its own, at once.
func (s *sealSender) sendEach(batch []*sealEntry) {
	var wg sync.WaitGroup
	for _, e := range batch {
		wg.Go(func() {
			resp, err := s.sealOne(e.ctx, e.req)
			e.res <- sealAnswer{resp: resp, err: err}
		})
	}
	wg.Wait()
}

func (s *sealSender) sealOne(ctx context.Context, req *strandv1.SealRequest) (*strandv1.SealResponse, error) {
	resp, err := s.rc.Seal(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}
