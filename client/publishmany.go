package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcerr"
)

// A stream's lane sends one batch at a time, so a producer spread over many
// streams has a fraction of a record in flight on each: every record would
// pay a request of its own (HTTP/2 stream, headers, auth check, handler
// goroutine), where one stream's lane carries hundreds in one. The
// publishSender of a broker gathers the lanes' attempts ready for that
// broker at once into one PublishMany (docs/api.md, "PublishMany"), as
// Kafka's producer sends one produce request per broker carrying every
// partition's batch. Each entry's result is handed to its attempt as the
// Publish's answer would be, so the retry loop (Client.call), owner
// redirects, idempotent sequences and each lane's order are those of a
// Publish: the sender only changes how attempts travel.

// Bounds of one PublishMany the client sends. maxManyEntries is the
// brokers' entry limit (docs/api.md, "PublishMany"); the records and bytes
// of all entries are kept within Config.MaxBatchRecords and MaxBatchBytes,
// as one batch's are, which the brokers' batch limits admit. A single
// attempt larger than them goes alone, as a Publish.
const maxManyEntries = 1024

// maxManyInFlight is how many requests a sender has in flight before it
// holds attempts back to gather them; an attempt held back waits at most
// Config.Linger for one of them to be answered, then goes anyway, so a slow
// entry (a confirm that takes long) delays the other streams at most that.
const maxManyInFlight = 2

// publishSender gathers the publish attempts for one broker.
type publishSender struct {
	c  *Client
	sc strandv1connect.StreamServiceClient
	// single is set once the broker answered PublishMany Unimplemented (a
	// broker older than it): every attempt is then a Publish of its own.
	single atomic.Bool
	// many counts the PublishMany calls answered (tests read it).
	many atomic.Int64

	mu       sync.Mutex
	queue    []*sendEntry
	inFlight int // requests holding one of the maxManyInFlight slots
	// lingering is set while a timer will send the queue after
	// Config.Linger whether or not a slot frees.
	lingering bool
}

// sendEntry is one attempt waiting for its answer.
type sendEntry struct {
	ctx   context.Context
	req   *strandv1.PublishRequest
	bytes int
	res   chan sendResult // buffered: the sender never waits for a caller that left
}

type sendResult struct {
	res *strandv1.PublishResponse
	err error
}

// publish is one Publish attempt of req: it returns what the broker
// answered for it, alone or as an entry of a PublishMany.
func (s *publishSender) publish(ctx context.Context, req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
	if s.single.Load() {
		return s.publishOne(ctx, req)
	}
	e := &sendEntry{ctx: ctx, req: req, bytes: recordsBytes(req.GetRecords()), res: make(chan sendResult, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, e)
	s.kickLocked()
	s.mu.Unlock()
	select {
	case r := <-e.res:
		return r.res, r.err
	case <-ctx.Done():
		return nil, ctxError(ctx)
	}
}

// kickLocked starts sending what is queued: at once on a free slot, else
// once it has waited Config.Linger (at once with Linger negative, which
// never holds a batch back). s.mu must be held.
func (s *publishSender) kickLocked() {
	s.slotsLocked()
	switch {
	case len(s.queue) == 0 || s.lingering:
	case s.c.cfg.Linger < 0:
		s.sendAllLocked()
	default:
		s.lingering = true
		time.AfterFunc(s.c.cfg.Linger, s.lingered)
	}
}

// lingered sends what waited Config.Linger for a slot, without one.
func (s *publishSender) lingered() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lingering = false
	s.slotsLocked()
	s.sendAllLocked()
}

// slotsLocked sends what is queued on the free slots. s.mu must be held.
func (s *publishSender) slotsLocked() {
	for len(s.queue) > 0 && s.inFlight < maxManyInFlight {
		s.inFlight++
		go s.run(s.takeLocked(), true)
	}
}

// sendAllLocked sends everything queued, without slots. Each take removes
// at least one entry (it sends the first live one, answers the ended), so
// the loop ends. s.mu must be held.
func (s *publishSender) sendAllLocked() {
	for len(s.queue) > 0 {
		go s.run(s.takeLocked(), false)
	}
}

// run sends batch and, while it holds a slot, what queued meanwhile.
// A take may hold no entry to send (every one had ended): the slot is
// given back all the same.
func (s *publishSender) run(batch []*sendEntry, slot bool) {
	for {
		if len(batch) > 0 {
			s.send(batch)
		}
		if !slot {
			return
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

// takeLocked takes the next request's entries from the queue: in queue
// order, within the bounds, one per stream (a stream with several lanes
// has several attempts at once, and a broker refuses a stream twice in a
// call), the first always. An entry whose attempt has ended is answered
// and dropped, never sent. s.mu must be held.
func (s *publishSender) takeLocked() []*sendEntry {
	cfg := s.c.cfg
	var (
		batch          []*sendEntry
		records, bytes int
		streams        map[string]bool
	)
	rest := s.queue[:0]
	for _, e := range s.queue {
		if rpcerr.EntryEnded(e.ctx) {
			// Never sent. Answered once ctx says it ended (at once, but
			// for a deadline whose timer has not fired yet), so the
			// answer is ctx's error as the caller's retry loop reads it.
			go func() {
				<-e.ctx.Done()
				e.res <- sendResult{err: ctxError(e.ctx)}
			}()
			continue
		}
		n := len(e.req.GetRecords())
		if len(batch) > 0 && (len(batch) == maxManyEntries || records+n > cfg.MaxBatchRecords || bytes+e.bytes > cfg.MaxBatchBytes || streams[e.req.GetStream()]) {
			rest = append(rest, e)
			continue
		}
		if streams == nil {
			streams = map[string]bool{}
		}
		streams[e.req.GetStream()] = true
		batch = append(batch, e)
		records += n
		bytes += e.bytes
	}
	clear(s.queue[len(rest):])
	s.queue = rest
	return batch
}

// send sends batch, one entry as a Publish, more as a PublishMany, and
// answers every entry.
func (s *publishSender) send(batch []*sendEntry) {
	if len(batch) == 1 {
		e := batch[0]
		res, err := s.publishOne(e.ctx, e.req)
		e.res <- sendResult{res: res, err: err}
		return
	}
	// The request lasts while any of its attempts does: one whose
	// attempt ended (its deadline, or the owner found moved) no longer
	// waits for it, and once none does it is cancelled, as their
	// Publishes would have been.
	req := &strandv1.PublishManyRequest{Publishes: make([]*strandv1.PublishRequest, len(batch))}
	waiting := make([]context.Context, len(batch))
	for i, e := range batch {
		req.Publishes[i], waiting[i] = e.req, e.ctx
	}
	ctx, stop := rpcerr.EntriesContext(s.c.ctx, waiting)
	defer stop()
	res, err := s.sc.PublishMany(ctx, connect.NewRequest(req))
	switch {
	case connect.CodeOf(err) == connect.CodeUnimplemented:
		// A broker older than PublishMany: Publish from now on.
		s.single.Store(true)
		s.sendEach(batch)
		return
	case connect.CodeOf(err) == connect.CodeInvalidArgument || connect.CodeOf(err) == connect.CodeResourceExhausted:
		// The call refused whole, for its bounds (a broker run with
		// smaller batch limits than the client's): each attempt alone is
		// what a Publish would be, and is answered as that.
		s.sendEach(batch)
		return
	case err != nil:
		// Refused whole (the broker's publish bytes in flight, the
		// connection): what each Publish would have met.
		for _, e := range batch {
			e.res <- sendResult{err: err}
		}
		return
	}
	s.many.Add(1)
	results := res.Msg.GetResults()
	if len(results) != len(batch) {
		err := connect.NewError(connect.CodeInternal, fmt.Errorf("client: publish many answered %d results for %d entries", len(results), len(batch)))
		for _, e := range batch {
			e.res <- sendResult{err: err}
		}
		return
	}
	for i, e := range batch {
		switch r := results[i].GetOutcome().(type) {
		case *strandv1.PublishResult_Response:
			e.res <- sendResult{res: r.Response}
		case *strandv1.PublishResult_Error:
			e.res <- sendResult{err: rpcerr.FromEntry(r.Error, rpcerr.EntryPrefix("publishes", i))}
		default:
			e.res <- sendResult{err: connect.NewError(connect.CodeInternal, fmt.Errorf("client: publish many answered no outcome for entry %d", i))}
		}
	}
}

// sendEach sends every entry of batch as a Publish of its own, at once.
func (s *publishSender) sendEach(batch []*sendEntry) {
	var wg sync.WaitGroup
	for _, e := range batch {
		wg.Go(func() {
			res, err := s.publishOne(e.ctx, e.req)
			e.res <- sendResult{res: res, err: err}
		})
	}
	wg.Wait()
}

func (s *publishSender) publishOne(ctx context.Context, req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
	res, err := s.sc.Publish(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// ctxError is the error of an attempt whose ctx ended before its answer,
// as connect-go reports one ended during a call.
func ctxError(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeCanceled, err)
}

// recordsBytes is what the brokers count of records toward the batch
// limit: payload and header bytes.
func recordsBytes(records []*strandv1.Record) int {
	n := 0
	for _, r := range records {
		n += len(r.GetPayload())
		for k, v := range r.GetHeaders() {
			n += len(k) + len(v)
		}
	}
	return n
}
