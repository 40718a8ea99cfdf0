package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/rpcerr"
)

// Publish appends records to stream and returns once the stream's confirm
// policy holds for all of them; res.Offsets[i] is the offset of records[i].
// The records are not modified. With Config.Idempotent (the default) the
// client stamps each record that has no producer id of its own, and a
// duplicate answer (res.Duplicate[i]) means the record had been stored by an
// earlier attempt, at res.Offsets[i].
//
// An error after the retry budget leaves the outcome unknown: some records
// may be stored. The client then gives the stream a fresh producer id, so the
// next publish cannot trip over a sequence the broker never saw.
func (c *Client) Publish(ctx context.Context, stream string, records []*strandv1.Record) (*strandv1.PublishResponse, error) {
	// Checked here too, not only in PublishAsync, so these answers do not
	// race the ctx cases of the select below.
	if len(records) == 0 {
		return nil, errEmptyBatch()
	}
	if c.ctx.Err() != nil {
		return nil, ErrClosed
	}
	if !c.idempotent {
		// No lane: a non-idempotent Publish is a request of its own, and
		// the retry loop's own error, which names both the deadline and
		// the last broker answer, reaches the caller. (PublishAsync
		// batches on the lanes either way.)
		return c.publishBatch(ctx, stream, records)
	}
	res := make(chan publishResult, 1) // buffered: done never blocks on a caller that left
	c.PublishAsync(ctx, stream, records, func(r *strandv1.PublishResponse, err error) {
		res <- publishResult{res: r, err: err}
	})
	select {
	case r := <-res:
		return r.res, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("client: publish %q: %w (the records may still be stored)", stream, ctx.Err())
	case <-c.ctx.Done():
		return nil, ErrClosed
	}
}

// maxHeaderKey is the brokers' bound on a header key.
const maxHeaderKey = 256

func errEmptyBatch() error {
	return rpcerr.InvalidArgument("records", "empty batch")
}

// PublishAsync queues records for stream and returns; done is called
// exactly once with what Publish would have returned. It is what a
// producer with a window of records in flight uses (Kafka's send with a
// callback, NATS's PublishAsync): one goroutine keeps the window full, and
// a lane's batch is not held back waiting for a goroutine per record to be
// scheduled (producer.linger).
//
// Calls are merged into batches on the stream's lanes, as concurrent
// Publish calls of an idempotent client are, whether or not the client is
// idempotent (without Idempotent nothing is stamped, and a retried batch
// may be stored twice). On a single lane (Config.Lanes 1, the default)
// records are confirmed in the order PublishAsync was called, and done is
// called from the stream's lane, one call at a time, in that order. The
// exceptions run on other goroutines: a call whose ctx ends while it is
// queued is dropped, never sent, and answered with ctx's error at once; an
// empty batch or a closed client is answered before PublishAsync returns,
// on the caller's goroutine. With several lanes, calls to done may overlap
// and come in any order.
//
// done must not block: on a lane it holds back every later publish to the
// stream, so it must not call Publish for the same stream either
// (PublishAsync is fine). The records, their payloads and their headers
// must not be changed until done is called. Cancelling ctx once the batch
// was sent does not recall the records: done is then called with the
// batch's outcome.
func (c *Client) PublishAsync(ctx context.Context, stream string, records []*strandv1.Record, done func(*strandv1.PublishResponse, error)) {
	if len(records) == 0 {
		done(nil, errEmptyBatch())
		return
	}
	if c.ctx.Err() != nil {
		done(nil, ErrClosed)
		return
	}
	// A header key the broker refuses would fail every call merged into
	// the same batch: such a call is answered alone, at once.
	for i, r := range records {
		for k := range r.GetHeaders() {
			if k == "" || len(k) > maxHeaderKey {
				done(nil, rpcerr.InvalidArgument(fmt.Sprintf("records[%d].headers", i), "header keys must be 1..%d bytes", maxHeaderKey))
				return
			}
		}
	}
	pp := &pendingPublish{ctx: ctx, done: done}
	pp.records = make([]*strandv1.Record, len(records))
	for i, r := range records {
		// A shallow copy: the stamp must not race with a caller that
		// reuses its records; payload and headers are only read.
		pp.records[i] = &strandv1.Record{
			Payload:    r.GetPayload(),
			Headers:    r.GetHeaders(),
			ProducerId: r.GetProducerId(),
			Sequence:   r.GetSequence(),
		}
		// What the broker counts toward its batch limit: payload and
		// header bytes.
		pp.bytes += len(r.GetPayload())
		for k, v := range r.GetHeaders() {
			pp.bytes += len(k) + len(v)
		}
	}
	// A lane that sweep freed after producer returned it takes nothing,
	// and the call goes to the stream's new lanes. A freed lane had
	// nothing queued or in flight, so no earlier call is overtaken: calls
	// made one after another keep their order on a single lane.
	for !c.producer(stream).enqueue(pp) {
	}
}

// publishBatch sends one publish request with retries.
func (c *Client) publishBatch(ctx context.Context, stream string, records []*strandv1.Record) (*strandv1.PublishResponse, error) {
	var out *strandv1.PublishResponse
	err := c.call(ctx, "publish", stream, func(ctx context.Context, sc *brokerConn) error {
		// Alone, or with the other streams' publishes ready for the same
		// broker at once, in one PublishMany (publishSender).
		res, err := sc.pub.publish(ctx, &strandv1.PublishRequest{Stream: stream, Records: records})
		if err != nil {
			return err
		}
		if n := len(res.GetOffsets()); n != len(records) {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("client: publish answered %d offsets for %d records", n, len(records)))
		}
		out = res
		return nil
	})
	return out, err
}

type publishResult struct {
	res *strandv1.PublishResponse
	err error
}

// pendingPublish is one Publish or PublishAsync call waiting for its batch.
type pendingPublish struct {
	ctx     context.Context
	records []*strandv1.Record
	bytes   int
	done    func(*strandv1.PublishResponse, error) // called once
	// queued is set, under the lane's mu, while the call is in the queue;
	// whoever clears it answers the call: the lane (take), or drop, which
	// context.AfterFunc runs once ctx ends (unwatch stops that).
	queued  bool
	unwatch func() bool
}

// producer orders one stream's idempotent publishes: sequences are assigned
// when a batch is formed and only one batch is in flight, so the broker sees
// each producer's sequences in order and a retried batch carries the same
// sequences as the first attempt (docs/api.md, "Idempotent publish").
type producer struct {
	c      *Client
	stream string

	mu      sync.Mutex
	id      string
	seq     uint64 // last sequence assigned
	queue   []*pendingPublish
	sending bool
	// queuedCalls, queuedRecords and queuedBytes total the calls still
	// queued: the queue may also hold calls dropped since the last take
	// (queued false), which take skips. want is how many
	// Publish calls the lane lingers for after a confirm, and grew, while
	// it lingers, is closed by the enqueue that brings the queue there.
	// skip counts the confirms still to be sent on without lingering, and
	// backoff is what skip was last set to (producer.linger).
	queuedCalls, queuedRecords, queuedBytes int
	want, skip, backoff                     int
	grew                                    chan struct{}
	// freed is set by sweep once the lane is out of the client's state;
	// enqueue then refuses calls, which go to the stream's new lanes.
	freed bool
}

// producer picks the stream's next lane, round robin.
func (c *Client) producer(stream string) *producer {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streamLocked(stream)
	if st.lanes == nil {
		base := c.cfg.ProducerID
		if c.freedLanes {
			// This stream's lanes may have been freed, and the broker
			// holds the sequences they stamped under ProducerID: new
			// sequences from 1 under it would be answered as duplicates
			// and stored nowhere.
			base = newProducerID(c.idPrefix)
		}
		st.lanes = make([]*producer, c.cfg.Lanes)
		for i := range st.lanes {
			id := base
			if i > 0 {
				id = fmt.Sprintf("%s.%d", id, i)
			}
			st.lanes[i] = &producer{c: c, stream: stream, id: id}
		}
	}
	return st.lanes[(c.nextLane.Add(1)-1)%uint64(len(st.lanes))]
}

// freeLanes marks lanes freed, all or none, and reports whether it did:
// only when none has a call queued or a batch in flight. Such a lane's
// producer id and sequences matter no more: nothing stamped with them can
// be sent again, so the stream's next lanes can start a session of their
// own. Called under c.mu; it takes the lanes' locks, in order, after it.
func freeLanes(lanes []*producer) bool {
	for _, p := range lanes {
		p.mu.Lock()
	}
	idle := true
	for _, p := range lanes {
		idle = idle && !p.sending && p.queuedCalls == 0
	}
	for _, p := range lanes {
		p.freed = p.freed || idle
		p.mu.Unlock()
	}
	return idle
}

// enqueue queues pp on the lane and reports whether it did: a freed lane
// takes nothing.
func (p *producer) enqueue(pp *pendingPublish) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.freed {
		return false
	}
	pp.queued = true
	// Registered under mu: the drop locks mu too, so it runs after this.
	pp.unwatch = context.AfterFunc(pp.ctx, func() { p.drop(pp) })
	p.queue = append(p.queue, pp)
	p.queuedCalls++
	p.queuedRecords += len(pp.records)
	p.queuedBytes += pp.bytes
	if p.grew != nil && p.gathered() {
		close(p.grew)
		p.grew = nil
	}
	if !p.sending {
		p.sending = true
		go p.run()
	}
	return true
}

// drop answers a queued call whose ctx ended at once, rather than when the
// lane next forms a batch, which may be a retry budget away. It is the one
// place such a call is answered: take leaves it queued for drop.
func (p *producer) drop(pp *pendingPublish) {
	p.mu.Lock()
	if !pp.queued {
		p.mu.Unlock()
		return
	}
	// Left in the queue for take to skip: a ctx shared by many queued
	// calls ends them all, and removing each would cost the queue's
	// length.
	pp.queued = false
	p.queuedCalls--
	p.queuedRecords -= len(pp.records)
	p.queuedBytes -= pp.bytes
	if p.queuedCalls == 0 {
		// Only dropped calls are left: let them, and their records, go
		// now rather than at the lane's next take, which may never come.
		// Once per emptied queue, so still linear in the calls dropped.
		clear(p.queue)
		p.queue = p.queue[:0]
	}
	p.mu.Unlock()
	pp.done(nil, pp.ctx.Err())
}

// run sends batches until the queue is empty.
func (p *producer) run() {
	for {
		p.linger()
		batch, records, deadline := p.take()
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithDeadline(p.c.ctx, deadline)
		res, err := p.c.publishBatch(ctx, p.stream, records)
		cancel()
		if err != nil && p.c.ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		if err != nil {
			p.mu.Lock()
			p.id, p.seq = newProducerID(p.c.idPrefix), 0
			p.mu.Unlock()
			for _, pp := range batch {
				pp.done(nil, err)
			}
			continue
		}
		// Before the callers learn the outcome: one that publishes again
		// at once must be counted as back, not as still to come.
		p.mu.Lock()
		p.want = len(batch) + p.queuedCalls
		p.mu.Unlock()
		i := 0
		for _, pp := range batch {
			n := len(pp.records)
			part := &strandv1.PublishResponse{Offsets: res.GetOffsets()[i : i+n], Epoch: res.GetEpoch()}
			if d := res.GetDuplicate(); len(d) == len(res.GetOffsets()) {
				part.Duplicate = d[i : i+n]
			}
			pp.done(part, nil)
			i += n
		}
	}
}

// linger waits, after a confirm, until the lane holds want calls (those
// queued at the confirm plus those it released) or a full batch, for at
// most Config.Linger. Without it a closed loop of N publishers, the usual
// shape of a producer with a window of N in flight, settles into two half
// batches: the one in flight and the one queued behind it, which leaves
// the moment the first is confirmed, before the publishers that confirm
// released have come back. Every round trip then carries about N/2
// records and every record waits for two of them. Lingering until they
// are back sends all N in one batch (measured with strandctl bench, 256
// in flight on 3 copies: 1.2-1.3x the records/s, p50 a fifth lower).
//
// Callers that publish once and leave (requests handled one by one) never
// come back, and lingering for them would only delay every batch by
// Linger: a wait that runs out makes the lane skip the waits of its next
// confirms, 1, then 2, 4, ... up to maxLingerSkip after each wait that runs
// out again, and a wait that ends with the callers back resets that. With
// several lanes a released caller comes back on any lane (round robin), so
// no lane can count on its own: only a single lane lingers.
func (p *producer) linger() {
	d := p.c.cfg.Linger
	p.mu.Lock()
	if d <= 0 || p.c.cfg.Lanes > 1 || p.gathered() {
		p.mu.Unlock()
		return
	}
	if p.skip > 0 {
		p.skip--
		p.mu.Unlock()
		return
	}
	grew := make(chan struct{})
	p.grew = grew
	p.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	ranOut := false
	select {
	case <-grew:
	case <-t.C:
		ranOut = true
	case <-p.c.ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.grew = nil
	switch {
	case ranOut && !p.gathered():
		p.backoff = min(max(1, 2*p.backoff), maxLingerSkip)
		p.skip = p.backoff
	case !ranOut:
		p.backoff = 0
	}
}

// maxLingerSkip bounds how many confirms a lane sends on without lingering
// after its waits ran out: what lingering then costs is at most one Linger
// per maxLingerSkip batches.
const maxLingerSkip = 64

// gathered reports whether the queue holds what the lane lingers for.
func (p *producer) gathered() bool {
	cfg := p.c.cfg
	return p.queuedCalls >= p.want || p.queuedRecords >= cfg.MaxBatchRecords || p.queuedBytes >= cfg.MaxBatchBytes
}

// take forms the next batch from whole Publish calls within the batch
// limits, stamps it, and returns the latest deadline among its callers. A
// call whose ctx has ended is left queued for its drop to answer. It clears
// sending when nothing is left to send, under the same lock as enqueue.
func (p *producer) take() (batch []*pendingPublish, records []*strandv1.Record, deadline time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cfg := p.c.cfg
	bytes := 0
	rest := p.queue[:0]
	for i, pp := range p.queue {
		if !pp.queued {
			continue // dropped, and answered, since the last take
		}
		if pp.ctx.Err() != nil {
			// Its drop is on its way (context.AfterFunc runs once ctx
			// ends) and answers it; rest never gets ahead of i.
			rest = append(rest, pp)
			continue
		}
		if len(batch) > 0 && (len(records)+len(pp.records) > cfg.MaxBatchRecords || bytes+pp.bytes > cfg.MaxBatchBytes) {
			// The rest stays queued, and watched.
			for _, q := range p.queue[i:] {
				if q.queued {
					rest = append(rest, q)
				}
			}
			break
		}
		// Out of the queue: a drop for a ctx that ends from now on finds
		// it gone and leaves it to this lane.
		pp.queued = false
		pp.unwatch()
		batch = append(batch, pp)
		records = append(records, pp.records...)
		bytes += pp.bytes
		d, ok := pp.ctx.Deadline()
		if !ok {
			d = time.Now().Add(cfg.RetryBudget)
		}
		if d.After(deadline) {
			deadline = d
		}
	}
	clear(p.queue[len(rest):])
	p.queue = rest
	p.queuedCalls, p.queuedRecords, p.queuedBytes, p.want = len(rest), 0, 0, 0
	for _, pp := range rest {
		p.queuedRecords += len(pp.records)
		p.queuedBytes += pp.bytes
	}
	if len(batch) == 0 {
		p.sending = false
		return nil, nil, time.Time{}
	}
	if p.c.idempotent {
		for _, r := range records {
			if r.ProducerId == "" {
				p.seq++
				r.ProducerId, r.Sequence = p.id, p.seq
			}
		}
	}
	return batch, records, deadline
}
