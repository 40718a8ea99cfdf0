package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
)

// fakeBroker is a StreamService over real loopback HTTP whose answers the
// test scripts. Unscripted methods answer Unimplemented.
type fakeBroker struct {
	strandv1connect.UnimplementedStreamServiceHandler
	addr string

	locate    func(*strandv1.LocateRequest) (*strandv1.LocateResponse, error)
	publish   func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error)
	read      func(*strandv1.ReadRequest) (*strandv1.ReadResponse, error)
	subscribe func(context.Context, *strandv1.SubscribeRequest, *connect.ServerStream[strandv1.SubscribeResponse]) error

	mu        sync.Mutex
	published []*strandv1.PublishRequest
	inflight  int
	maxFlight int
}

func startFake(t *testing.T, f *fakeBroker) *fakeBroker {
	t.Helper()
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(strandv1connect.NewStreamServiceHandler(f))
	srv := rpcserver.Serve(ln, mux)
	t.Cleanup(func() { _ = srv.Close() })
	f.addr = srv.Addr()
	return f
}

func (f *fakeBroker) Locate(_ context.Context, req *connect.Request[strandv1.LocateRequest]) (*connect.Response[strandv1.LocateResponse], error) {
	if f.locate == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no locate"))
	}
	res, err := f.locate(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func (f *fakeBroker) Publish(_ context.Context, req *connect.Request[strandv1.PublishRequest]) (*connect.Response[strandv1.PublishResponse], error) {
	f.mu.Lock()
	f.published = append(f.published, req.Msg)
	f.inflight++
	f.maxFlight = max(f.maxFlight, f.inflight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	if f.publish == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no publish"))
	}
	res, err := f.publish(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func (f *fakeBroker) Read(_ context.Context, req *connect.Request[strandv1.ReadRequest]) (*connect.Response[strandv1.ReadResponse], error) {
	res, err := f.read(req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func (f *fakeBroker) Subscribe(ctx context.Context, req *connect.Request[strandv1.SubscribeRequest], stream *connect.ServerStream[strandv1.SubscribeResponse]) error {
	return f.subscribe(ctx, req.Msg, stream)
}

func (f *fakeBroker) requests() []*strandv1.PublishRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*strandv1.PublishRequest(nil), f.published...)
}

func ownedBy(addr string) func(*strandv1.LocateRequest) (*strandv1.LocateResponse, error) {
	return func(req *strandv1.LocateRequest) (*strandv1.LocateResponse, error) {
		return &strandv1.LocateResponse{Owner: &strandv1.OwnerHint{Stream: req.GetStream(), Node: "n", Address: addr, Epoch: 1}}, nil
	}
}

// appendLog returns a publish handler that stores records at dense offsets.
func appendLog() func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
	var mu sync.Mutex
	var tail uint64
	return func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		res := &strandv1.PublishResponse{Epoch: 1}
		for range req.GetRecords() {
			res.Offsets = append(res.Offsets, tail)
			tail++
		}
		return res, nil
	}
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func recs(payloads ...string) []*strandv1.Record {
	out := make([]*strandv1.Record, len(payloads))
	for i, p := range payloads {
		out[i] = &strandv1.Record{Payload: []byte(p)}
	}
	return out
}

func TestPublishFollowsOwnerHint(t *testing.T) {
	owner := startFake(t, &fakeBroker{publish: appendLog()})
	// The first broker believes it owns the stream (a stale view) and, asked
	// to publish, answers the not-owner hint naming the real owner.
	stale := startFake(t, &fakeBroker{})
	stale.locate = ownedBy(stale.addr)
	stale.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		return nil, rpcerr.NotOwner(&strandv1.OwnerHint{Stream: req.GetStream(), Node: "b", Address: owner.addr, Epoch: 2})
	}
	c := newTestClient(t, Config{Brokers: []string{stale.addr}})

	res, err := c.Publish(context.Background(), "s", recs("a", "b"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if got := res.GetOffsets(); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("offsets = %v, want [0 1]", got)
	}
	if n := len(stale.requests()); n != 1 {
		t.Fatalf("stale broker saw %d publishes, want 1", n)
	}
	got := owner.requests()
	if len(got) != 1 {
		t.Fatalf("owner saw %d publishes, want 1", len(got))
	}
	// The redirected attempt carries the same producer id and sequences as
	// the refused one: a retry is the same publish.
	first := stale.requests()[0].GetRecords()
	for i, r := range got[0].GetRecords() {
		if r.GetProducerId() != c.ProducerID() || r.GetSequence() != uint64(i+1) {
			t.Errorf("record %d: producer %q seq %d, want %q seq %d", i, r.GetProducerId(), r.GetSequence(), c.ProducerID(), i+1)
		}
		if first[i].GetSequence() != r.GetSequence() || first[i].GetProducerId() != r.GetProducerId() {
			t.Errorf("record %d: retry changed (producer, sequence) from (%q,%d) to (%q,%d)", i, first[i].GetProducerId(), first[i].GetSequence(), r.GetProducerId(), r.GetSequence())
		}
	}
	if c.cachedOwner("s") != owner.addr {
		t.Fatalf("owner cache = %q, want %q", c.cachedOwner("s"), owner.addr)
	}
}

func TestPublishRelocatesOnHintWithoutAddress(t *testing.T) {
	var locates atomic.Int32
	owner := startFake(t, &fakeBroker{publish: appendLog()})
	b := startFake(t, &fakeBroker{})
	// First Locate says b owns it; b refuses with an address-less hint (it
	// knows it lost the stream, not who has it); the next Locate is right.
	b.locate = func(req *strandv1.LocateRequest) (*strandv1.LocateResponse, error) {
		if locates.Add(1) == 1 {
			return ownedBy(b.addr)(req)
		}
		return ownedBy(owner.addr)(req)
	}
	b.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		return nil, rpcerr.NotOwner(&strandv1.OwnerHint{Stream: req.GetStream()})
	}
	c := newTestClient(t, Config{Brokers: []string{b.addr}})
	if _, err := c.Publish(context.Background(), "s", recs("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if n := locates.Load(); n < 2 {
		t.Fatalf("located %d times, want a second locate after the address-less hint", n)
	}
	if n := len(owner.requests()); n != 1 {
		t.Fatalf("owner saw %d publishes, want 1", n)
	}
}

func TestPublishRetriesUnavailableUntilSuccess(t *testing.T) {
	var calls atomic.Int32
	log := appendLog()
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		if calls.Add(1) <= 3 {
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("recovering"))
		}
		return log(req)
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}})
	res, err := c.Publish(context.Background(), "s", recs("r"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if len(res.GetOffsets()) != 1 || res.GetOffsets()[0] != 0 {
		t.Fatalf("offsets = %v, want [0]", res.GetOffsets())
	}
	reqs := f.requests()
	if len(reqs) != 4 {
		t.Fatalf("broker saw %d attempts, want 4", len(reqs))
	}
	for i, r := range reqs {
		rec := r.GetRecords()[0]
		if rec.GetProducerId() != c.ProducerID() || rec.GetSequence() != 1 {
			t.Errorf("attempt %d: (producer, seq) = (%q, %d), want (%q, 1)", i, rec.GetProducerId(), rec.GetSequence(), c.ProducerID())
		}
	}
}

func TestPublishRetriesConnectionRefused(t *testing.T) {
	// A broker that died: nothing listens at its address any more. Locate
	// names it once, then the live owner.
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	_ = ln.Close()
	owner := startFake(t, &fakeBroker{publish: appendLog()})
	var locates atomic.Int32
	owner.locate = func(req *strandv1.LocateRequest) (*strandv1.LocateResponse, error) {
		if locates.Add(1) == 1 {
			return ownedBy(deadAddr)(req)
		}
		return ownedBy(owner.addr)(req)
	}
	c := newTestClient(t, Config{Brokers: []string{owner.addr}})
	if _, err := c.Publish(context.Background(), "s", recs("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if n := locates.Load(); n != 2 {
		t.Fatalf("located %d times, want 2", n)
	}
	if n := len(owner.requests()); n != 1 {
		t.Fatalf("owner saw %d publishes, want 1", n)
	}
}

func TestPublishDeadlineSurfacesLastError(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("cannot reach W"))
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Publish(ctx, "s", recs("r"))
	if err == nil {
		t.Fatal("publish succeeded against a broker that is always unavailable")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("publish returned after %v, want about the 300ms deadline", elapsed)
	}
	if len(f.requests()) < 2 {
		t.Errorf("broker saw %d attempts, want retries before the deadline", len(f.requests()))
	}
}

func TestBatchDeadlineSurfacesLastErrorCode(t *testing.T) {
	// The same through the direct (non-idempotent) path, where the retry
	// loop's own error reaches the caller: both the deadline and the last
	// broker answer are visible.
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("cannot reach W"))
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Idempotent: Bool(false)})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Publish(ctx, "s", recs("r"))
	if !errors.Is(err, context.DeadlineExceeded) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("err = %v (code %v), want deadline exceeded wrapping Unavailable", err, connect.CodeOf(err))
	}
	if r := f.requests()[0].GetRecords()[0]; r.GetProducerId() != "" || r.GetSequence() != 0 {
		t.Fatalf("non-idempotent client stamped (%q, %d)", r.GetProducerId(), r.GetSequence())
	}
}

// A sequence error (FailedPrecondition without an owner hint) is not
// retried: the same batch would meet the same gap.
func TestPublishDoesNotRetrySequenceErrors(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("records[0].sequence: sequence gap"))
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1})
	_, err := c.Publish(context.Background(), "s", recs("r"))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("err = %v, want FailedPrecondition", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Fatalf("broker saw %d attempts, want 1", n)
	}
}

func TestPublishDoesNotRetryInvalidArgument(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		return nil, rpcerr.InvalidArgument("records", "record too large")
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1})
	_, err := c.Publish(context.Background(), "s", recs("r"))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Fatalf("broker saw %d attempts, want 1", n)
	}
	// A failed batch gives the stream a fresh producer id so the next
	// publish starts a new sequence rather than leaving a gap.
	f.publish = appendLog()
	if _, err := c.Publish(context.Background(), "s", recs("r2")); err != nil {
		t.Fatal(err)
	}
	r := f.requests()[1].GetRecords()[0]
	if r.GetProducerId() == c.ProducerID() || r.GetProducerId() == "" || r.GetSequence() != 1 {
		t.Fatalf("after a failed batch: (producer, seq) = (%q, %d), want a new producer at 1", r.GetProducerId(), r.GetSequence())
	}
}

// holdFirstPublish starts a fake owner storing at dense offsets whose first
// publish waits for release to close, so later publishes queue up behind it.
func holdFirstPublish(t *testing.T) (f *fakeBroker, release chan struct{}) {
	release = make(chan struct{})
	log := appendLog()
	var first atomic.Bool
	f = startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		if first.CompareAndSwap(false, true) {
			<-release
		}
		return log(req)
	}
	return f, release
}

func TestConcurrentPublishesKeepSequencesInOrder(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1})
	const n = 64
	var wg sync.WaitGroup
	offsets := make([]uint64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			res, err := c.Publish(context.Background(), "s", recs(fmt.Sprint(i)))
			errs[i] = err
			if err == nil {
				offsets[i] = res.GetOffsets()[0]
			}
		})
	}
	untilQueuedBehindFirst(t, c, f, n)
	close(release)
	wg.Wait()
	seen := map[uint64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if seen[offsets[i]] {
			t.Fatalf("offset %d returned twice", offsets[i])
		}
		seen[offsets[i]] = true
	}
	reqs := f.requests()
	if len(reqs) >= n {
		t.Errorf("%d requests for %d concurrent publishes: nothing was batched", len(reqs), n)
	}
	sequencesInOrder(t, reqs)
	f.mu.Lock()
	maxFlight := f.maxFlight
	f.mu.Unlock()
	if maxFlight != 1 {
		t.Fatalf("%d publish requests in flight at once, want 1", maxFlight)
	}
}

// Merged batches stay within MaxBatchRecords, which the brokers' dedupe
// window holds (TestClientBatchesFitTheBrokerDefaults): a retry of a batch
// whose answer was lost is answered as duplicates only while its first
// record is in the window.
func TestMergedBatchesStayWithinMaxBatchRecords(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}})
	const n = 2*DefaultMaxBatchRecords + 100
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = c.Publish(context.Background(), "s", recs(fmt.Sprint(i)))
		})
	}
	untilQueuedBehindFirst(t, c, f, n)
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for _, req := range f.requests() {
		if n := len(req.GetRecords()); n > DefaultMaxBatchRecords {
			t.Fatalf("a merged batch of %d records, above MaxBatchRecords %d", n, DefaultMaxBatchRecords)
		}
	}
}

// untilQueuedBehindFirst waits until the first request of n one-record
// calls to stream "s" is in flight, held (holdFirstPublish), and every
// call it does not carry is queued behind it.
func untilQueuedBehindFirst(t *testing.T, c *Client, f *fakeBroker, n int) {
	t.Helper()
	clustertest.Eventually(t, 5*time.Second, "publishes queued behind the first batch", func() bool {
		reqs := f.requests()
		return len(reqs) == 1 && queued(c, "s") == n-len(reqs[0].GetRecords())
	})
}

// queueLen is how many calls the lanes of stream hold in their queues,
// dropped ones included.
func queueLen(c *Client, stream string) int {
	return sumLanes(c, stream, func(p *producer) int { return len(p.queue) })
}

// queued is how many calls the lanes of stream hold queued, not dropped.
func queued(c *Client, stream string) int {
	return sumLanes(c, stream, func(p *producer) int { return p.queuedCalls })
}

// sumLanes adds up f over stream's lanes, each under its lock.
func sumLanes(c *Client, stream string, f func(*producer) int) int {
	c.producer(stream) // makes the lanes
	c.mu.Lock()
	lanes := c.perStream[stream].lanes
	c.mu.Unlock()
	n := 0
	for _, p := range lanes {
		p.mu.Lock()
		n += f(p)
		p.mu.Unlock()
	}
	return n
}

func TestReadFollowsHint(t *testing.T) {
	owner := startFake(t, &fakeBroker{})
	owner.read = func(req *strandv1.ReadRequest) (*strandv1.ReadResponse, error) {
		return &strandv1.ReadResponse{Records: []*strandv1.StoredRecord{{Offset: req.GetFromOffset(), Payload: []byte("x")}}, NextOffset: req.GetFromOffset() + 1}, nil
	}
	stale := startFake(t, &fakeBroker{})
	stale.locate = ownedBy(stale.addr)
	stale.read = func(req *strandv1.ReadRequest) (*strandv1.ReadResponse, error) {
		return nil, rpcerr.NotOwner(&strandv1.OwnerHint{Stream: req.GetStream(), Node: "o", Address: owner.addr, Epoch: 3})
	}
	c := newTestClient(t, Config{Brokers: []string{stale.addr}})
	res, err := c.Read(context.Background(), &strandv1.ReadRequest{Stream: "s", FromOffset: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetRecords()) != 1 || res.GetRecords()[0].GetOffset() != 7 {
		t.Fatalf("read = %v, want one record at 7", res.GetRecords())
	}
}

func TestSubscribeResumesWithoutGapsOrDuplicates(t *testing.T) {
	var mu sync.Mutex
	var starts []*strandv1.SubscribeRequest
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.subscribe = func(ctx context.Context, req *strandv1.SubscribeRequest, stream *connect.ServerStream[strandv1.SubscribeResponse]) error {
		mu.Lock()
		starts = append(starts, req)
		n := len(starts)
		mu.Unlock()
		send := func(from, to uint64) error {
			msg := &strandv1.SubscribeResponse{ConfirmWatermark: to}
			for o := from; o < to; o++ {
				msg.Records = append(msg.Records, &strandv1.StoredRecord{Offset: o, Payload: fmt.Appendf(nil, "r%d", o)})
			}
			return stream.Send(msg)
		}
		switch n {
		case 1:
			// 0..4, then the owner goes away.
			if err := send(0, 5); err != nil {
				return err
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("owner lost"))
		case 2:
			// A new owner that repeats from 3 (a resumed reader may see
			// records again) and carries on to 10.
			if err := send(3, 10); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		}
		return connect.NewError(connect.CodeInternal, errors.New("unexpected third subscribe"))
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := c.Subscribe(ctx, "s", SubscribeOptions{Start: strandv1.StartPosition_START_POSITION_EARLIEST})
	defer sub.Close()
	var got []uint64
	for len(got) < 10 {
		batch, err := sub.Recv()
		if err != nil {
			t.Fatalf("recv after %v: %v", got, err)
		}
		for _, r := range batch {
			got = append(got, r.GetOffset())
		}
	}
	for i, o := range got {
		if o != uint64(i) {
			t.Fatalf("delivered offsets %v, want 0..9 once each", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 2 {
		t.Fatalf("%d subscribes, want 2", len(starts))
	}
	if s := starts[1]; s.GetStart() != strandv1.StartPosition_START_POSITION_OFFSET || s.GetOffset() != 5 {
		t.Fatalf("resumed with %v, want START_POSITION_OFFSET at 5", s)
	}
}

// A subscription on a quiet stream survives failovers further apart than
// the retry budget: the budget counts time without a serving owner, and a
// reconnect that only receives the owner's first message (the watermark,
// no records) was served. Before, only delivered records reset it, so the
// second failover ended the subscription at once.
func TestSubscribeSurvivesFailoversOnAQuietStream(t *testing.T) {
	const budget = 300 * time.Millisecond
	var mu sync.Mutex
	starts := 0
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.subscribe = func(ctx context.Context, req *strandv1.SubscribeRequest, stream *connect.ServerStream[strandv1.SubscribeResponse]) error {
		mu.Lock()
		starts++
		n := starts
		mu.Unlock()
		// What a broker sends first: the watermark, no records.
		if err := stream.Send(&strandv1.SubscribeResponse{ConfirmWatermark: 1}); err != nil {
			return err
		}
		switch n {
		case 1:
			if err := stream.Send(&strandv1.SubscribeResponse{ConfirmWatermark: 1, Records: []*strandv1.StoredRecord{{Offset: 0}}}); err != nil {
				return err
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("owner lost"))
		case 2:
			// A new owner, quiet for longer than the budget, then lost too.
			select {
			case <-time.After(3 * budget):
			case <-ctx.Done():
				return ctx.Err()
			}
			return connect.NewError(connect.CodeUnavailable, errors.New("owner lost again"))
		}
		if err := stream.Send(&strandv1.SubscribeResponse{ConfirmWatermark: 2, Records: []*strandv1.StoredRecord{{Offset: 1}}}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	_, sub := testSubscription(t, Config{Brokers: []string{f.addr}, RetryBudget: budget}, SubscribeOptions{Start: strandv1.StartPosition_START_POSITION_EARLIEST})
	for want := uint64(0); want < 2; want++ {
		batch, err := sub.Recv()
		if err != nil {
			t.Fatalf("recv of offset %d: %v", want, err)
		}
		if len(batch) != 1 || batch[0].GetOffset() != want {
			t.Fatalf("received %v, want offset %d", batch, want)
		}
	}
}

// Closing the client ends its subscriptions: a Recv waiting on a quiet
// stream answers ErrClosed instead of holding its stream open.
func TestCloseEndsSubscriptions(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.subscribe = func(ctx context.Context, req *strandv1.SubscribeRequest, stream *connect.ServerStream[strandv1.SubscribeResponse]) error {
		if err := stream.Send(&strandv1.SubscribeResponse{}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	c, sub := testSubscription(t, Config{Brokers: []string{f.addr}}, SubscribeOptions{})
	got := make(chan error, 1)
	go func() {
		_, err := sub.Recv()
		got <- err
	}()
	_ = c.Close()
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after Close: %v, want ErrClosed", err)
	}
}

// A call the broker would refuse for a header key is answered alone, at
// once: merged into a batch it would fail every call in it.
func TestBadHeaderKeyFailsOnlyItsCall(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}})
	first := make(chan error, 1)
	c.PublishAsync(context.Background(), "s", recs("first"), func(_ *strandv1.PublishResponse, err error) { first <- err })
	untilQueuedBehindFirst(t, c, f, 1)
	bad := make(chan error, 1)
	c.PublishAsync(context.Background(), "s", []*strandv1.Record{{Payload: []byte("bad"), Headers: map[string]string{"": "v"}}},
		func(_ *strandv1.PublishResponse, err error) { bad <- err })
	good := make(chan error, 1)
	c.PublishAsync(context.Background(), "s", recs("good"), func(_ *strandv1.PublishResponse, err error) { good <- err })
	close(release)
	if err := <-bad; connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "records[0].headers") {
		t.Fatalf("the bad call: %v, want InvalidArgument naming records[0].headers", err)
	}
	for name, ch := range map[string]chan error{"first": first, "good": good} {
		if err := <-ch; err != nil {
			t.Fatalf("the %s call failed with the bad one: %v", name, err)
		}
	}
}

// A subscription made right after CreateStream may reach a broker that
// has not seen the stream yet: a NotFound within notFoundGrace is retried,
// as for unary calls.
func TestSubscribeWaitsOutNotFoundRightAfterCreate(t *testing.T) {
	var calls atomic.Int32
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.subscribe = func(ctx context.Context, req *strandv1.SubscribeRequest, stream *connect.ServerStream[strandv1.SubscribeResponse]) error {
		if calls.Add(1) == 1 {
			return connect.NewError(connect.CodeNotFound, errors.New("no stream \"s\""))
		}
		if err := stream.Send(&strandv1.SubscribeResponse{ConfirmWatermark: 1, Records: []*strandv1.StoredRecord{{Offset: 0}}}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	_, sub := testSubscription(t, Config{Brokers: []string{f.addr}}, SubscribeOptions{})
	recs, err := sub.Recv()
	if err != nil || len(recs) != 1 {
		t.Fatalf("recv after a NotFound right after create: %v, %v", recs, err)
	}
}

// testSubscription subscribes to stream "s" through a client of cfg, for
// at most 10 s; the subscription and the client end with the test.
func testSubscription(t *testing.T, cfg Config, opts SubscribeOptions) (*Client, *Subscription) {
	t.Helper()
	c := newTestClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	sub := c.Subscribe(ctx, "s", opts)
	t.Cleanup(func() { _ = sub.Close() })
	return c, sub
}

// fakeController is an AdminService whose ListBrokers the test scripts.
type fakeController struct {
	strandv1connect.UnimplementedAdminServiceHandler
	listBrokers func() (*strandv1.ListBrokersResponse, error)
	calls       atomic.Int32
}

func (f *fakeController) ListBrokers(context.Context, *connect.Request[strandv1.ListBrokersRequest]) (*connect.Response[strandv1.ListBrokersResponse], error) {
	f.calls.Add(1)
	res, err := f.listBrokers()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func startController(t *testing.T, f *fakeController) string {
	t.Helper()
	return serveAdmin(t, f)
}

// serveAdmin serves h as the AdminService on a loopback port and returns
// its address.
func serveAdmin(t *testing.T, h strandv1connect.AdminServiceHandler) string {
	t.Helper()
	path, handler := strandv1connect.NewAdminServiceHandler(h)
	return clustertest.Serve(t, path, handler).Addr()
}

func TestAdminFollowsControllerLeader(t *testing.T) {
	leader := &fakeController{listBrokers: func() (*strandv1.ListBrokersResponse, error) {
		return &strandv1.ListBrokersResponse{Brokers: []*strandv1.Broker{{Node: "broker-1", Address: "127.0.0.1:1", Live: true}}}, nil
	}}
	leaderAddr := startController(t, leader)
	follower := &fakeController{listBrokers: func() (*strandv1.ListBrokersResponse, error) {
		return nil, rpcerr.NotLeader(leaderAddr)
	}}
	followerAddr := startController(t, follower)
	c := newTestClient(t, Config{Controller: followerAddr})
	res, err := c.Admin().ListBrokers(context.Background(), connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.GetBrokers()) != 1 || res.Msg.GetBrokers()[0].GetNode() != "broker-1" {
		t.Fatalf("brokers = %v", res.Msg.GetBrokers())
	}
	if follower.calls.Load() != 1 || leader.calls.Load() != 1 {
		t.Fatalf("calls: follower %d leader %d, want 1 and 1", follower.calls.Load(), leader.calls.Load())
	}
}

func TestBrokersDiscoveredFromController(t *testing.T) {
	f := startFake(t, &fakeBroker{publish: appendLog()})
	f.locate = ownedBy(f.addr)
	ctrl := startController(t, &fakeController{listBrokers: func() (*strandv1.ListBrokersResponse, error) {
		return &strandv1.ListBrokersResponse{Brokers: []*strandv1.Broker{{Node: "broker-1", Address: f.addr, Live: true}}}, nil
	}})
	c := newTestClient(t, Config{Controller: ctrl})
	if _, err := c.Publish(context.Background(), "s", recs("x")); err != nil {
		t.Fatal(err)
	}
	if n := len(f.requests()); n != 1 {
		t.Fatalf("broker saw %d publishes, want 1", n)
	}
}

func TestBackoffBounds(t *testing.T) {
	b := &backoff{min: 20 * time.Millisecond, max: 500 * time.Millisecond}
	prevCap := time.Duration(0)
	for i := range 20 {
		d := b.next()
		if d < b.cur/2 || d > b.cur {
			t.Fatalf("step %d: wait %v outside [%v, %v]", i, d, b.cur/2, b.cur)
		}
		if b.cur < prevCap || b.cur > 500*time.Millisecond {
			t.Fatalf("step %d: cap %v after %v", i, b.cur, prevCap)
		}
		prevCap = b.cur
	}
	if b.cur != 500*time.Millisecond {
		t.Fatalf("cap %v after 20 steps, want 500ms", b.cur)
	}
}

// The leader is read from the typed hint only: a message that names an
// address without the detail is no hint, and a hint on any code but
// Unavailable is none either.
func TestLeaderHint(t *testing.T) {
	onPrecondition := connect.NewError(connect.CodeFailedPrecondition, errors.New("x"))
	if d, err := connect.NewErrorDetail(&strandv1.LeaderHint{Address: "x:1"}); err == nil {
		onPrecondition.AddDetail(d)
	}
	for _, c := range []struct {
		err  error
		want string
		ok   bool
	}{
		{rpcerr.NotLeader("10.0.0.1:7102"), "10.0.0.1:7102", true},
		{fmt.Errorf("client: admin GetStream: %w", rpcerr.NotLeader("10.0.0.1:7102")), "10.0.0.1:7102", true},
		{rpcerr.NotLeader(""), "", false},
		{connect.NewError(connect.CodeUnavailable, errors.New("not the controller leader; leader is at 10.0.0.1:7102")), "", false},
		{onPrecondition, "", false},
		{errors.New("leader is at x:1"), "", false},
	} {
		got, ok := LeaderHint(c.err)
		if got.GetAddress() != c.want || ok != c.ok {
			t.Errorf("LeaderHint(%v) = %q, %v; want %q, %v", c.err, got.GetAddress(), ok, c.want, c.ok)
		}
	}
}

func TestPublishAbandonsStuckOwnerWhenOwnerMoves(t *testing.T) {
	// The owner stops answering (SIGSTOP, partition): its Publish never
	// returns. Another broker learns of the new owner; the client's probe
	// asks it and moves the publish there long before the attempt timeout.
	newOwner := startFake(t, &fakeBroker{publish: appendLog()})
	stuck := startFake(t, &fakeBroker{})
	stuck.locate = ownedBy(stuck.addr)
	stuck.publish = func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		select {} // never answers; the server is closed at cleanup
	}
	var moved atomic.Bool
	other := startFake(t, &fakeBroker{})
	other.locate = func(req *strandv1.LocateRequest) (*strandv1.LocateResponse, error) {
		if moved.Load() {
			return ownedBy(newOwner.addr)(req)
		}
		return ownedBy(stuck.addr)(req)
	}
	c := newTestClient(t, Config{Brokers: []string{stuck.addr, other.addr}, AttemptTimeout: time.Minute, ProbeAfter: 50 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, err := c.Publish(context.Background(), "s", recs("x"))
		done <- err
	}()
	clustertest.Eventually(t, 5*time.Second, "the publish to reach the stuck owner", func() bool { return len(stuck.requests()) == 1 })
	moved.Store(true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("publish still waiting on the stuck owner 10s after the owner moved")
	}
	reqs := newOwner.requests()
	if len(reqs) != 1 {
		t.Fatalf("new owner saw %d publishes, want 1", len(reqs))
	}
	if r := reqs[0].GetRecords()[0]; r.GetSequence() != stuck.requests()[0].GetRecords()[0].GetSequence() {
		t.Fatalf("the retry at the new owner has sequence %d, the first attempt %d", r.GetSequence(), stuck.requests()[0].GetRecords()[0].GetSequence())
	}
}

// With several lanes each producer id still sees its sequences in order and
// at most one request in flight, while the lanes overlap.
func TestLanesKeepEachProducersSequencesInOrder(t *testing.T) {
	log := appendLog()
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	var mu sync.Mutex
	inflight := map[string]int{}
	maxPerProducer := 0
	f.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		id := req.GetRecords()[0].GetProducerId()
		mu.Lock()
		inflight[id]++
		maxPerProducer = max(maxPerProducer, inflight[id])
		mu.Unlock()
		defer func() { mu.Lock(); inflight[id]--; mu.Unlock() }()
		return log(req)
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 3})
	var wg sync.WaitGroup
	for i := range 90 {
		wg.Go(func() {
			if _, err := c.Publish(context.Background(), "s", recs(fmt.Sprint(i))); err != nil {
				t.Errorf("publish %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	next := map[string]uint64{}
	for _, r := range f.requests() {
		for _, rec := range r.GetRecords() {
			id := rec.GetProducerId()
			if want := next[id] + 1; rec.GetSequence() != want {
				t.Fatalf("producer %s: sequence %d on the wire, want %d", id, rec.GetSequence(), want)
			}
			next[id] = rec.GetSequence()
		}
	}
	if len(next) < 2 || len(next) > 3 {
		t.Fatalf("%d producer ids used, want 2..3 lanes", len(next))
	}
	if maxPerProducer != 1 {
		t.Fatalf("%d requests of one producer in flight at once, want 1", maxPerProducer)
	}
}

// A closed loop of publishers (each publishes again once confirmed) sends
// one batch of all of them per round trip: the lane lingers after a
// confirm until the publishers it released are back. Without the linger
// the loop splits into two half batches that alternate (producer.linger).
func TestLingerSendsReleasedPublishersInOneBatch(t *testing.T) {
	f, release := holdFirstPublish(t)
	// A linger far longer than a round trip here: the wait ends because
	// the publishers are back, not because it ran out (except once, at the
	// end, when the publishers that went first have stopped).
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1, Linger: time.Second})
	const publishers, rounds = 8, 6
	var wg sync.WaitGroup
	start := func(i int) {
		wg.Go(func() {
			for r := range rounds {
				if _, err := c.Publish(context.Background(), "s", recs(fmt.Sprint(i, "-", r))); err != nil {
					t.Errorf("publisher %d round %d: %v", i, r, err)
					return
				}
			}
		})
	}
	// One publisher first, alone in the first batch, then the rest.
	start(0)
	clustertest.Eventually(t, 5*time.Second, "the first batch in flight", func() bool { return len(f.requests()) == 1 })
	for i := 1; i < publishers; i++ {
		start(i)
	}
	clustertest.Eventually(t, 5*time.Second, "publishes queued behind the first batch", func() bool {
		return queued(c, "s") == publishers-1
	})
	close(release)
	wg.Wait()
	reqs := f.requests()
	sizes := make([]int, len(reqs))
	total := 0
	for i, r := range reqs {
		sizes[i] = len(r.GetRecords())
		total += sizes[i]
	}
	if total != publishers*rounds {
		t.Fatalf("%d records sent, want %d (batches %v)", total, publishers*rounds, sizes)
	}
	// The first publisher went alone and stays one round ahead of the
	// rest, so the last batch holds only the rest; every batch between
	// holds every publisher.
	if len(reqs) != rounds+1 {
		t.Fatalf("%d batches %v, want %d", len(reqs), sizes, rounds+1)
	}
	for i, n := range sizes[1 : len(sizes)-1] {
		if n != publishers {
			t.Fatalf("batch %d holds %d records, want all %d publishers (batches %v)", i+1, n, publishers, sizes)
		}
	}
}

// hourLingerClient starts a fake owner and a client whose lanes linger for
// an hour, with a context that gives up after 30 s: a publish the linger
// held would fail with it.
func hourLingerClient(t *testing.T, lanes int) (*fakeBroker, *Client, context.Context) {
	t.Helper()
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = appendLog()
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: lanes, Linger: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return f, c, ctx
}

// A lone publisher that publishes again as soon as it is confirmed never
// waits out the linger: it is back before the lane looks.
func TestLingerDoesNotHoldALonePublisher(t *testing.T) {
	f, c, ctx := hourLingerClient(t, 1)
	for i := range 20 {
		res, err := c.Publish(ctx, "s", recs(fmt.Sprint(i)))
		if err != nil {
			t.Fatalf("publish %d: %v (held by the linger?)", i, err)
		}
		if got := res.GetOffsets()[0]; got != uint64(i) {
			t.Fatalf("publish %d at offset %d", i, got)
		}
	}
	if n := len(f.requests()); n != 20 {
		t.Fatalf("%d requests for 20 sequential publishes", n)
	}
}

// The linger counts Publish calls, not records: a lone publisher whose
// calls shrink is back as soon as it publishes again, whatever it sends.
func TestLingerCountsCallsNotRecords(t *testing.T) {
	_, c, ctx := hourLingerClient(t, 1)
	for i, n := range []int{3, 2, 1, 4, 1} {
		payloads := make([]string, n)
		for j := range payloads {
			payloads[j] = fmt.Sprint(i, "-", j)
		}
		if _, err := c.Publish(ctx, "s", recs(payloads...)); err != nil {
			t.Fatalf("publish %d of %d records: %v (held by the linger?)", i, n, err)
		}
	}
}

// With several lanes a released caller comes back on any lane, so no lane
// lingers: a closed loop of publishers runs without ever waiting Linger.
func TestNoLingerWithSeveralLanes(t *testing.T) {
	_, c, ctx := hourLingerClient(t, 2)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for r := range 5 {
				if _, err := c.Publish(ctx, "s", recs(fmt.Sprint(i, "-", r))); err != nil {
					t.Errorf("publisher %d round %d: %v (held by the linger?)", i, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A lane whose linger runs out (its callers published once and left) skips
// the lingers of its next confirms, twice as many after each wait that runs
// out, and a wait that ends with the callers back resets that.
func TestLingerBacksOffWhenCallersDoNotReturn(t *testing.T) {
	c := newTestClient(t, Config{Brokers: []string{"127.0.0.1:1"}, Lanes: 1, Linger: 10 * time.Millisecond})
	p := c.producer("s")
	p.sending = true // as while run lingers: an enqueue starts no sender
	// linger runs p.linger with the lane waiting for want calls and
	// reports whether it returned within the deadline.
	linger := func(want int) {
		t.Helper()
		p.mu.Lock()
		p.want = want
		p.mu.Unlock()
		done := make(chan struct{})
		go func() { p.linger(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("linger still waiting after 10s")
		}
	}
	state := func() (skip, backoff int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.skip, p.backoff
	}
	linger(1) // nobody comes back: the wait runs out
	if skip, backoff := state(); skip != 1 || backoff != 1 {
		t.Fatalf("after a wait that ran out: skip %d backoff %d, want 1 1", skip, backoff)
	}
	// The next confirm is sent on at once, even with a linger far longer
	// than the deadline above.
	c.cfg.Linger = time.Hour
	linger(1)
	if skip, _ := state(); skip != 0 {
		t.Fatalf("skip %d after a skipped linger, want 0", skip)
	}
	c.cfg.Linger = 10 * time.Millisecond
	linger(1) // runs out again: twice as many skipped
	if skip, backoff := state(); skip != 2 || backoff != 2 {
		t.Fatalf("after a second wait that ran out: skip %d backoff %d, want 2 2", skip, backoff)
	}
	p.mu.Lock()
	p.skip = 0
	p.mu.Unlock()
	// A wait that ends because the caller is back resets the backoff: the
	// lane lingers in the background, and the caller comes back once it
	// does.
	c.cfg.Linger = time.Hour
	p.mu.Lock()
	p.want = 1
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.linger(); close(done) }()
	clustertest.Eventually(t, 10*time.Second, "the lane lingering", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.grew != nil
	})
	p.enqueue(&pendingPublish{ctx: context.Background(), records: recs("back"), done: func(*strandv1.PublishResponse, error) {}})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("linger still waiting 10s after the caller came back")
	}
	if skip, backoff := state(); skip != 0 || backoff != 0 {
		t.Fatalf("after a wait the caller ended: skip %d backoff %d, want 0 0", skip, backoff)
	}
}

// asyncResult is what one PublishAsync call's done reported.
type asyncResult struct {
	res   *strandv1.PublishResponse
	err   error
	calls int
}

// PublishAsync from one goroutine: every done is called exactly once, and
// one lane confirms the calls in the order they were made, with sequences
// in that order on the wire.
func TestPublishAsyncConfirmsInCallOrder(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1})
	const n = 64
	var mu sync.Mutex
	results := make([]asyncResult, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		c.PublishAsync(context.Background(), "s", recs(fmt.Sprint(i)), func(res *strandv1.PublishResponse, err error) {
			mu.Lock()
			results[i].res, results[i].err = res, err
			results[i].calls++
			mu.Unlock()
			wg.Done()
		})
	}
	untilQueuedBehindFirst(t, c, f, n)
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i, r := range results {
		if r.calls != 1 || r.err != nil {
			t.Fatalf("call %d: done called %d times, err %v", i, r.calls, r.err)
		}
		if got := r.res.GetOffsets(); len(got) != 1 || got[0] != uint64(i) {
			t.Fatalf("call %d confirmed at offsets %v, want [%d]", i, got, i)
		}
	}
	sequencesInOrder(t, f.requests())
}

// sequencesInOrder fails unless the records of reqs carry sequences 1, 2,
// 3, ... in the order they were sent.
func sequencesInOrder(t *testing.T, reqs []*strandv1.PublishRequest) {
	t.Helper()
	var want uint64 = 1
	for _, r := range reqs {
		for _, rec := range r.GetRecords() {
			if rec.GetSequence() != want {
				t.Fatalf("sequence %d on the wire, want %d", rec.GetSequence(), want)
			}
			want++
		}
	}
}

// A window kept full by one goroutine: every confirm releases the window,
// the goroutine refills it at once, and the lane sends it as one batch.
func TestPublishAsyncWindowGoesInOneBatch(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1, Linger: time.Second})
	const window, total = 8, 48
	slots := make(chan struct{}, window)
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for i := range total {
		slots <- struct{}{}
		wg.Add(1)
		c.PublishAsync(context.Background(), "s", recs(fmt.Sprint(i)), func(_ *strandv1.PublishResponse, err error) {
			if err != nil {
				errs <- err
			}
			<-slots
			wg.Done()
		})
		if i == 0 {
			clustertest.Eventually(t, 5*time.Second, "the first batch in flight", func() bool { return len(f.requests()) == 1 })
		}
		if i == window-1 {
			clustertest.Eventually(t, 5*time.Second, "the window queued behind the first batch", func() bool {
				return queued(c, "s") == window-1
			})
			close(release)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	reqs := f.requests()
	sizes := make([]int, len(reqs))
	for i, r := range reqs {
		sizes[i] = len(r.GetRecords())
	}
	// The first call went alone; every batch after it but the last holds
	// the whole window.
	for i, n := range sizes[1 : len(sizes)-1] {
		if n != window {
			t.Fatalf("batch %d holds %d records, want the window of %d (batches %v)", i+1, n, window, sizes)
		}
	}
}

// A done callback runs with no lock of the client's held: one that
// publishes again, here from a publish whose context ended while it was
// queued, does not deadlock the lane.
func TestPublishAsyncDoneMayPublishAgain(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := publishFirst(t, c, f)
	gone, leave := context.WithCancel(ctx)
	again := make(chan error, 1)
	var droppedErr error
	c.PublishAsync(gone, "s", recs("dropped"), func(_ *strandv1.PublishResponse, err error) {
		droppedErr = err
		c.PublishAsync(ctx, "s", recs("again"), func(_ *strandv1.PublishResponse, err error) { again <- err })
	})
	leave()
	close(release)
	for name, ch := range map[string]<-chan error{"first": first, "again": again} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s publish: %v", name, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s publish not answered: %v", name, ctx.Err())
		}
	}
	if !errors.Is(droppedErr, context.Canceled) {
		t.Fatalf("publish whose context ended while queued: %v, want context.Canceled", droppedErr)
	}
	neverSent(t, f, "dropped")
}

// neverSent fails unless no record whose payload starts with prefix
// reached the broker.
func neverSent(t *testing.T, f *fakeBroker, prefix string) {
	t.Helper()
	for _, r := range f.requests() {
		for _, rec := range r.GetRecords() {
			if strings.HasPrefix(string(rec.GetPayload()), prefix) {
				t.Fatalf("%q was sent, though its call was dropped while queued", rec.GetPayload())
			}
		}
	}
}

// Bad calls are answered through done, never by a panic or a silent drop.
func TestPublishAsyncRefusesEmptyBatchAndClosedClient(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	f.publish = appendLog()
	c := newTestClient(t, Config{Brokers: []string{f.addr}})
	var got error
	c.PublishAsync(context.Background(), "s", nil, func(_ *strandv1.PublishResponse, err error) { got = err })
	if connect.CodeOf(got) != connect.CodeInvalidArgument {
		t.Fatalf("empty batch: %v, want InvalidArgument", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got = nil
	c.PublishAsync(context.Background(), "s", recs("x"), func(_ *strandv1.PublishResponse, err error) { got = err })
	if !errors.Is(got, ErrClosed) {
		t.Fatalf("publish on a closed client: %v, want ErrClosed", got)
	}
	if n := len(f.requests()); n != 0 {
		t.Fatalf("%d requests sent for bad calls", n)
	}
}

// Closing the client answers every PublishAsync call, the one in flight and
// those queued behind it, exactly once and with an error: a producer
// waiting on its window is never left waiting.
func TestPublishAsyncAnswersEveryCallOnClose(t *testing.T) {
	f, release := holdFirstPublish(t)
	defer close(release)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1})
	const n = 16
	var mu sync.Mutex
	calls := make([]int, n)
	errs := make([]error, n)
	var answered atomic.Int32
	for i := range n {
		c.PublishAsync(context.Background(), "s", recs(fmt.Sprint(i)), func(_ *strandv1.PublishResponse, err error) {
			mu.Lock()
			calls[i]++
			errs[i] = err
			mu.Unlock()
			answered.Add(1)
		})
	}
	untilQueuedBehindFirst(t, c, f, n)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 10*time.Second, "every PublishAsync call answered after Close", func() bool { return answered.Load() >= n })
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if calls[i] != 1 || !errors.Is(errs[i], ErrClosed) {
			t.Fatalf("call %d: done called %d times, err %v; want once, with ErrClosed", i, calls[i], errs[i])
		}
	}
}

// publishFirst sends one call, which holdFirstPublish's broker holds, and
// waits until it is in flight; the returned channel gets its answer.
func publishFirst(t *testing.T, c *Client, f *fakeBroker) <-chan error {
	t.Helper()
	first := make(chan error, 1)
	c.PublishAsync(context.Background(), "s", recs("first"), func(_ *strandv1.PublishResponse, err error) { first <- err })
	clustertest.Eventually(t, 5*time.Second, "the first batch in flight", func() bool { return len(f.requests()) == 1 })
	return first
}

// Calls whose ctx ends while they wait behind a batch in flight, here many
// sharing one ctx, are answered at once, each exactly once, and never sent;
// the lane goes on with the call queued behind them and with later ones.
func TestPublishAsyncDropsQueuedCallsWhoseCtxEnds(t *testing.T) {
	f, release, c, first := heldLane(t)
	const n = 1000
	d := queueSharingCtx(c, n)
	kept := make(chan error, 1)
	c.PublishAsync(context.Background(), "s", recs("kept"), func(_ *strandv1.PublishResponse, err error) { kept <- err })
	clustertest.Eventually(t, 5*time.Second, "the calls queued", func() bool { return queued(c, "s") == n+1 })
	d.cancel()
	clustertest.Eventually(t, 10*time.Second, "the dropped calls answered while the batch ahead of them is in flight", func() bool {
		return d.answered.Load() >= n
	})
	if got := queued(c, "s"); got != 1 {
		t.Fatalf("%d calls still queued after the drops, want the one kept", got)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-kept; err != nil {
		t.Fatalf("the call queued behind the dropped ones: %v", err)
	}
	// The lane goes on: a later call is sent and confirmed.
	if _, err := c.Publish(context.Background(), "s", recs("later")); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range n {
		if d.calls[i] != 1 || !errors.Is(d.errs[i], context.Canceled) {
			t.Fatalf("dropped call %d: done called %d times, err %v; want once, with context.Canceled", i, d.calls[i], d.errs[i])
		}
	}
	reqs := f.requests()
	if len(reqs) != 3 || len(reqs[1].GetRecords()) != 1 || string(reqs[1].GetRecords()[0].GetPayload()) != "kept" {
		t.Fatalf("%d requests: want the first, then the kept call alone, then the later one", len(reqs))
	}
	neverSent(t, f, "dropped")
}

// heldLane is a one-lane client whose first publish (publishFirst) is
// held by the fake owner until release closes, so later calls queue. The
// held attempt must not time out and let the lane answer queued calls
// itself: that would hide a drop that never came.
func heldLane(t *testing.T) (f *fakeBroker, release chan struct{}, c *Client, first <-chan error) {
	t.Helper()
	f, release = holdFirstPublish(t)
	c = newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1, AttemptTimeout: time.Hour})
	return f, release, c, publishFirst(t, c, f)
}

// droppedCalls are PublishAsync calls sharing one ctx: how often each was
// answered, and with what.
type droppedCalls struct {
	cancel   context.CancelFunc
	answered atomic.Int32
	mu       sync.Mutex
	calls    []int
	errs     []error
}

// queueSharingCtx makes n one-record PublishAsync calls to stream "s",
// with payloads "dropped-i", sharing a ctx that d.cancel ends.
func queueSharingCtx(c *Client, n int) *droppedCalls {
	shared, cancel := context.WithCancel(context.Background())
	d := &droppedCalls{cancel: cancel, calls: make([]int, n), errs: make([]error, n)}
	for i := range n {
		c.PublishAsync(shared, "s", recs(fmt.Sprint("dropped-", i)), func(_ *strandv1.PublishResponse, err error) {
			d.mu.Lock()
			d.calls[i]++
			d.errs[i] = err
			d.mu.Unlock()
			d.answered.Add(1)
		})
	}
	return d
}

// Calls dropped while nothing else is queued are let go at once, with
// their records, not kept until the lane's next batch, which may never
// come.
func TestPublishAsyncLetsDroppedCallsGo(t *testing.T) {
	f, release, c, first := heldLane(t)
	const n = 10
	d := queueSharingCtx(c, n)
	clustertest.Eventually(t, 5*time.Second, "the calls queued", func() bool { return queued(c, "s") == n })
	d.cancel()
	clustertest.Eventually(t, 10*time.Second, "the dropped calls answered", func() bool { return d.answered.Load() == n })
	if got := queueLen(c, "s"); got != 0 {
		t.Fatalf("the lane still holds %d dropped calls with nothing queued, want none", got)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	neverSent(t, f, "dropped")
}

// A non-idempotent client's PublishAsync calls are batched on the lane like
// an idempotent client's, with nothing stamped on them.
func TestPublishAsyncBatchesWithoutIdempotence(t *testing.T) {
	f, release := holdFirstPublish(t)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Lanes: 1, Idempotent: Bool(false)})
	first := publishFirst(t, c, f)
	const n = 32
	errs := make(chan error, n)
	for i := range n {
		c.PublishAsync(context.Background(), "s", recs(fmt.Sprint(i)), func(_ *strandv1.PublishResponse, err error) { errs <- err })
	}
	clustertest.Eventually(t, 5*time.Second, "the calls queued behind the first", func() bool { return queued(c, "s") == n })
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	reqs := f.requests()
	if len(reqs) != 2 || len(reqs[1].GetRecords()) != n {
		sizes := make([]int, len(reqs))
		for i, r := range reqs {
			sizes[i] = len(r.GetRecords())
		}
		t.Fatalf("batches %v, want [1 %d]", sizes, n)
	}
	for _, r := range reqs {
		for _, rec := range r.GetRecords() {
			if rec.GetProducerId() != "" || rec.GetSequence() != 0 {
				t.Fatalf("non-idempotent client stamped (%q, %d)", rec.GetProducerId(), rec.GetSequence())
			}
		}
	}
}
