package gather

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// gated is a send that records each batch and holds it until released.
type gated struct {
	mu      sync.Mutex
	batches [][]int
	ctxs    []context.Context
	started chan struct{}
	release chan struct{}
}

func newGated() *gated {
	return &gated{started: make(chan struct{}, 100), release: make(chan struct{}, 100)}
}

func (s *gated) send(ctx context.Context, batch []int) []Result[string] {
	s.mu.Lock()
	s.batches = append(s.batches, append([]int(nil), batch...))
	s.ctxs = append(s.ctxs, ctx)
	s.mu.Unlock()
	s.started <- struct{}{}
	<-s.release
	out := make([]Result[string], len(batch))
	for i, r := range batch {
		out[i].Value = fmt.Sprint("v", r)
	}
	return out
}

// waitFor waits for cond with a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *Gatherer[Req, Res]) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

func recv(t *testing.T, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("no batch sent")
	}
}

// A lone request is sent at once, alone; requests made while every slot
// is busy wait and go together, at most maxBatch to a call, each answered
// with its own value.
func TestGathersWhatWaitsWhileSlotsAreBusy(t *testing.T) {
	s := newGated()
	g := New(3, 1, s.send)
	type answer struct {
		req int
		v   string
		err error
	}
	answers := make(chan answer, 10)
	do := func(r int) {
		v, err := g.Do(context.Background(), r)
		answers <- answer{r, v, err}
	}
	go do(0)
	recv(t, s.started) // sent with nothing else waiting
	for r := 1; r <= 5; r++ {
		go do(r)
	}
	waitFor(t, "five queued", func() bool { return g.queued() == 5 })
	for range 3 {
		s.release <- struct{}{}
	}
	for range 6 {
		a := <-answers
		if a.err != nil || a.v != fmt.Sprint("v", a.req) {
			t.Fatalf("request %d: %q, %v", a.req, a.v, a.err)
		}
	}
	g.Wait()
	var sizes []int
	for _, b := range s.batches {
		sizes = append(sizes, len(b))
	}
	if fmt.Sprint(sizes) != "[1 3 2]" {
		t.Fatalf("batch sizes %v, want [1 3 2]", sizes)
	}
}

// A caller whose ctx ends stops waiting; its batch goes on for the others
// with a context that is not cancelled, and is cancelled once no caller
// waits. A request whose caller left before its batch was taken is never
// sent.
func TestCallerThatLeavesDoesNotEndTheBatch(t *testing.T) {
	s := newGated()
	g := New(10, 1, s.send)
	block := make(chan error, 1)
	go func() { _, err := g.Do(context.Background(), 0); block <- err }()
	recv(t, s.started)

	leaving, leave := context.WithCancel(context.Background())
	gone, goneNow := context.WithCancel(context.Background())
	errs := make(chan error, 3)
	go func() { _, err := g.Do(leaving, 1); errs <- err }()
	go func() { _, err := g.Do(context.Background(), 2); errs <- err }()
	go func() { _, err := g.Do(gone, 3); errs <- err }()
	waitFor(t, "three queued", func() bool { return g.queued() == 3 })
	goneNow() // leaves while queued: never sent
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued caller that left: %v", err)
	}
	s.release <- struct{}{}
	if err := <-block; err != nil {
		t.Fatal(err)
	}
	recv(t, s.started)
	s.mu.Lock()
	second, bctx := s.batches[1], s.ctxs[1]
	s.mu.Unlock()
	// The callers queued concurrently: their order is theirs, not the
	// gatherer's.
	second = slices.Sorted(slices.Values(second))
	if fmt.Sprint(second) != "[1 2]" {
		t.Fatalf("second batch %v, want [1 2] (the request whose caller left before it was taken is not sent)", second)
	}
	leave()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller that left mid-batch: %v", err)
	}
	if bctx.Err() != nil {
		t.Fatal("batch cancelled while a caller still waits")
	}
	s.release <- struct{}{}
	if err := <-errs; err != nil {
		t.Fatalf("caller that stayed: %v", err)
	}
	g.Wait()
	if bctx.Err() == nil {
		t.Fatal("batch context outlives its call")
	}
}

// Once every caller of a batch has left, the batch's context ends.
func TestBatchContextEndsWhenNoCallerWaits(t *testing.T) {
	s := newGated()
	g := New(10, 1, s.send)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := g.Do(ctx, 1); done <- err }()
	recv(t, s.started)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	s.mu.Lock()
	bctx := s.ctxs[0]
	s.mu.Unlock()
	select {
	case <-bctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("batch context not cancelled with no caller left")
	}
	s.release <- struct{}{}
	g.Wait()
}

// A send that answers fewer requests than it got fails the rest, never
// answers them with a zero value.
func TestShortAnswerIsAnError(t *testing.T) {
	g := New(10, 1, func(_ context.Context, batch []int) []Result[int] {
		return make([]Result[int], len(batch)-1)
	})
	if _, err := g.Do(context.Background(), 1); !errors.Is(err, errShort) {
		t.Fatalf("err %v, want errShort", err)
	}
}
