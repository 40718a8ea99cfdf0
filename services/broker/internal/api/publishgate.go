package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// DefaultMaxPublishBytesInFlight is Limits.MaxPublishBytesInFlight's
// default: about one and a half of the largest publish at the defaults
// (publishRequestMaxBytes, about 43 MiB), a sixth of the broker's default
// memory limit once decoded.
const DefaultMaxPublishBytesInFlight = 64 << 20

// Gate timings (publishGate).
const (
	// publishAdmitWait is how long a publish that does not fit waits for
	// room before it is answered Unavailable (the Go client retries with
	// backoff). Short, because a publish parked unread still takes up to
	// its HTTP/2 stream's receive window of its connection's shared one:
	// parked long, it could stall every other call on that connection,
	// admitted publishes still sending their bodies among them.
	publishAdmitWait = 100 * time.Millisecond
	// publishBodyTimeout bounds how long an admitted publish may take to
	// send its body (a full 43 MiB one at 1.5 MB/s): a client that stops
	// sending, or a host that died mid-upload, must not hold its share of
	// the bound until TCP gives up on it.
	publishBodyTimeout = 30 * time.Second
)

// publishGate bounds the publish request bytes a broker reads, decodes and
// handles at once. Each request's read limit bounds one publish; without a
// bound on how many are handled together, a few clients sending full
// batches at once could take more memory than the broker has (a decoded
// publish holds its payloads and headers, a multiple of its wire size).
//
// A publish holds its share from before its body is read until it is
// answered, its wait for W copies included: its decoded records live that
// long. So publishes to a stream that cannot reach W hold their share
// until the confirm timeout; others are then refused sooner.
//
// A publish that does not fit waits at most publishAdmitWait, in arrival
// order (a small one behind a large one, so small ones cannot keep a large
// one out for ever), and is then answered Unavailable before a byte of it
// is read: nothing of it was stored, and a retry is safe.
//
// A request is weighed once, before it is read, so waiting never holds
// part of the bound (no two publishes can each hold part and wait for
// the rest): by its Content-Length when the body is sent as it is (the
// Connect protocol's unary calls, which the Go client makes), by its
// envelope's length prefix for an uncompressed gRPC or gRPC-Web message
// (grpc-go sends no Content-Length), otherwise (a compressed body, whose
// decoded size is not known) by the read limit.
type publishGate struct {
	sem       *semaphore.Weighted
	total     int64
	readLimit int64
	admitWait time.Duration
	bodyWait  time.Duration
	// waiting and held are for /metrics: publishes waiting for room and
	// the bytes held by those admitted.
	waiting atomic.Int64
	held    atomic.Int64
	// refused counts publishes answered Unavailable for want of room.
	refused atomic.Int64
}

func newPublishGate(total, readLimit int) *publishGate {
	return &publishGate{sem: semaphore.NewWeighted(int64(total)), total: int64(total), readLimit: int64(readLimit),
		admitWait: publishAdmitWait, bodyWait: publishBodyTimeout}
}

// weight is what r holds of the bound while it is handled. For a gRPC
// request without a Content-Length it reads the message's 5-byte envelope
// prefix, and puts it back in front of r.Body.
func (g *publishGate) weight(r *http.Request) int64 {
	n := g.readLimit
	switch {
	case r.Header.Get("Content-Encoding") != "" || r.Header.Get("Grpc-Encoding") != "":
		// Compressed: inflates to anything up to the read limit.
	case r.ContentLength >= 0:
		n = r.ContentLength
	case isGRPC(r.Header.Get("Content-Type")):
		if size, ok := peekEnvelope(r); ok {
			n = size
		}
	}
	// A request larger than the bound takes all of it, alone.
	return max(1, min(n, g.readLimit, g.total))
}

// isGRPC reports whether a content type is gRPC's or gRPC-Web's binary
// framing (not gRPC-Web's base64 text one).
func isGRPC(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	return (strings.HasPrefix(ct, "application/grpc") && !strings.HasPrefix(ct, "application/grpc-web-text"))
}

// peekEnvelope reads the first message's envelope prefix (flags byte,
// 4-byte big-endian length) and returns the bytes the message takes,
// prefix included; a compressed message (flags bit 0) reports false. The
// prefix read is put back in front of the body either way.
func peekEnvelope(r *http.Request) (int64, bool) {
	var prefix [5]byte
	n, err := io.ReadFull(r.Body, prefix[:])
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(prefix[:n]), r.Body), r.Body}
	if err != nil || prefix[0]&1 != 0 {
		return 0, false
	}
	return 5 + int64(binary.BigEndian.Uint32(prefix[1:])), true
}

func (g *publishGate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := g.weight(r)
		if !g.sem.TryAcquire(n) {
			g.waiting.Add(1)
			ctx, cancel := context.WithTimeout(r.Context(), g.admitWait)
			err := g.sem.Acquire(ctx, n)
			cancel()
			g.waiting.Add(-1)
			if err != nil {
				// HTTP 503 is Unavailable to Connect, gRPC and gRPC-Web
				// clients alike. Nothing of the request was read, so
				// nothing was stored: a retry is safe.
				g.refused.Add(1)
				http.Error(w, "publish: the broker holds --max-publish-inflight-bytes of publishes in flight; retry", http.StatusServiceUnavailable)
				return
			}
		}
		g.held.Add(n)
		defer func() {
			g.held.Add(-n)
			g.sem.Release(n)
		}()
		// The body must arrive within bodyWait. The deadline is lifted
		// once the body has been read: on HTTP/1.1 it is the connection's,
		// and firing while the publish waits for W would end the request.
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(g.bodyWait)) == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the read deadline set on its request once the body
// has been read to its end.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// PublishesWaiting is how many publishes wait for room among the publish
// bytes in flight (Limits.MaxPublishBytesInFlight).
func (s *StreamService) PublishesWaiting() int64 { return s.gate.waiting.Load() }

// PublishBytesInFlight is how many request bytes the publishes being
// handled hold of Limits.MaxPublishBytesInFlight.
func (s *StreamService) PublishBytesInFlight() int64 { return s.gate.held.Load() }

// PublishesRefused counts publishes answered Unavailable because they did
// not fit among the publish bytes in flight in time.
func (s *StreamService) PublishesRefused() int64 { return s.gate.refused.Load() }
