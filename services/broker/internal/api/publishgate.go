package api

import (
	"net/http"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// DefaultMaxPublishBytesInFlight is Limits.MaxPublishBytesInFlight's
// default: about one and a half of the largest publish at the defaults
// (publishRequestMaxBytes, about 43 MiB), a sixth of the broker's default
// memory limit once decoded.
const DefaultMaxPublishBytesInFlight = 64 << 20

// publishGate bounds the publish request bytes a broker reads, decodes and
// handles at once. Each request's read limit bounds one publish; without a
// bound on how many are handled together, a few clients sending full
// batches at once could take more memory than the broker has (a decoded
// publish holds its payloads and headers, a multiple of its wire size).
// A publish that does not fit waits before a byte of it is read, as Kafka
// stops reading requests past queued.max.request.bytes: the client's
// writes back up, its deadline still runs.
//
// Publishes are admitted in arrival order: a small one waits behind a
// large one that does not fit yet, so a stream of small publishes cannot
// keep a large one out for ever.
//
// A request is weighed once, before it is read, so waiting never holds
// part of the bound (no two publishes can each hold part and wait for
// the rest): by its Content-Length when the body is sent as it is (the
// Connect protocol's unary calls, which the Go client makes), otherwise
// (a compressed or streamed body, whose decoded size is not known) by the
// read limit.
type publishGate struct {
	sem       *semaphore.Weighted
	total     int64
	readLimit int64
	// waiting and held are for /metrics: publishes waiting for room and
	// the bytes held by those admitted.
	waiting atomic.Int64
	held    atomic.Int64
}

func newPublishGate(total, readLimit int) *publishGate {
	return &publishGate{sem: semaphore.NewWeighted(int64(total)), total: int64(total), readLimit: int64(readLimit)}
}

// weight is what r holds of the bound while it is handled.
func (g *publishGate) weight(r *http.Request) int64 {
	n := g.readLimit
	if r.ContentLength >= 0 && r.Header.Get("Content-Encoding") == "" && r.Header.Get("Grpc-Encoding") == "" {
		n = min(r.ContentLength, g.readLimit)
	}
	// A request larger than the bound takes all of it, alone.
	return max(1, min(n, g.total))
}

func (g *publishGate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := g.weight(r)
		if !g.sem.TryAcquire(n) {
			g.waiting.Add(1)
			err := g.sem.Acquire(r.Context(), n)
			g.waiting.Add(-1)
			if err != nil {
				// The caller gave up while waiting; nothing of its
				// request was read, so nothing was stored.
				http.Error(w, "publish: waited for room among the publishes in flight until the call ended", http.StatusServiceUnavailable)
				return
			}
		}
		g.held.Add(n)
		defer func() {
			g.held.Add(-n)
			g.sem.Release(n)
		}()
		next.ServeHTTP(w, r)
	})
}

// PublishesWaiting is how many publishes wait for room among the publish
// bytes in flight (Limits.MaxPublishBytesInFlight).
func (s *StreamService) PublishesWaiting() int64 { return s.gate.waiting.Load() }

// PublishBytesInFlight is how many request bytes the publishes being
// handled hold of Limits.MaxPublishBytesInFlight.
func (s *StreamService) PublishBytesInFlight() int64 { return s.gate.held.Load() }
