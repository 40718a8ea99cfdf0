// Package gather sends requests that arrive together as one call: a
// Gatherer takes what is waiting when a call slot is free, waits for
// nothing to fill a batch, and keeps a few calls in flight, so a lone
// request goes out at once and a burst of thousands goes out as a few
// large calls. It is how the recoverer reads its snapshots and the broker
// its history starts from etcd after a mass failover (docs/protocol.md,
// "Stream failover").
package gather

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/strandhq/strand/internal/rpcerr"
)

// Result is one request's answer within a batch.
type Result[T any] struct {
	Value T
	Err   error
}

// Gatherer gathers Do calls into batches of at most maxBatch requests, sent
// with send, at most inFlight at once. Gathering changes how many requests
// share a call, never what a request is answered: send answers each
// request of a batch as a call of its own would have been, and each answer
// goes back to its caller alone.
//
// A request is in a batch taken after it was queued, so the call that
// answers it is sent after Do began: never an earlier call's answer.
type Gatherer[Req, Res any] struct {
	max, inFlight int
	send          func(ctx context.Context, batch []Req) []Result[Res]

	mu      sync.Mutex
	queue   []*entry[Req, Res]
	running int
	wg      sync.WaitGroup
}

type entry[Req, Res any] struct {
	ctx context.Context
	req Req
	res chan Result[Res] // buffered: a batch never waits for a caller that left
}

// New returns a Gatherer. send gets a batch of 1 to maxBatch requests and
// a context that lasts while any of their callers waits (it carries none of
// their values); it returns one Result per request, in order.
func New[Req, Res any](maxBatch, inFlight int, send func(ctx context.Context, batch []Req) []Result[Res]) *Gatherer[Req, Res] {
	return &Gatherer[Req, Res]{max: max(maxBatch, 1), inFlight: max(inFlight, 1), send: send}
}

// Do queues req and returns its answer, or ctx's error once ctx ends
// first. A caller that stops waiting leaves its batch going for the others.
func (g *Gatherer[Req, Res]) Do(ctx context.Context, req Req) (Res, error) {
	e := &entry[Req, Res]{ctx: ctx, req: req, res: make(chan Result[Res], 1)}
	g.mu.Lock()
	g.queue = append(g.queue, e)
	if g.running < g.inFlight {
		g.running++
		g.wg.Add(1)
		go g.run()
	}
	g.mu.Unlock()
	select {
	case r := <-e.res:
		return r.Value, r.Err
	case <-ctx.Done():
		var zero Res
		return zero, ctx.Err()
	}
}

// Wait returns once no batch is in flight. Call it only when no Do can
// start any more (its callers have ended).
func (g *Gatherer[Req, Res]) Wait() { g.wg.Wait() }

// run sends what is queued, a batch at a time, until the queue is empty;
// then it gives its slot back.
func (g *Gatherer[Req, Res]) run() {
	defer g.wg.Done()
	for {
		g.mu.Lock()
		batch := g.takeLocked()
		if len(batch) == 0 {
			g.running--
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.sendBatch(batch)
	}
}

// takeLocked takes the next batch: the oldest requests queued, at most
// max. A request whose caller has stopped waiting is answered and dropped,
// never sent. g.mu must be held.
func (g *Gatherer[Req, Res]) takeLocked() []*entry[Req, Res] {
	var batch []*entry[Req, Res]
	rest := g.queue[:0]
	for _, e := range g.queue {
		if err := e.ctx.Err(); err != nil {
			e.res <- Result[Res]{Err: err}
			continue
		}
		if len(batch) == g.max {
			rest = append(rest, e)
			continue
		}
		batch = append(batch, e)
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	return batch
}

// errShort answers a request send left unanswered: a fault of send, never
// a value.
var errShort = errors.New("gather: no answer for the request")

func (g *Gatherer[Req, Res]) sendBatch(batch []*entry[Req, Res]) {
	reqs := make([]Req, len(batch))
	waiting := make([]context.Context, len(batch))
	for i, e := range batch {
		reqs[i], waiting[i] = e.req, e.ctx
	}
	// The call lasts while any of its callers waits, as their calls alone
	// would have.
	ctx, stop := rpcerr.EntriesContext(context.Background(), waiting)
	defer stop()
	out := g.send(ctx, reqs)
	for i, e := range batch {
		if i < len(out) {
			e.res <- out[i]
			continue
		}
		e.res <- Result[Res]{Err: fmt.Errorf("%w (%d answers for %d requests)", errShort, len(out), len(batch))}
	}
}
