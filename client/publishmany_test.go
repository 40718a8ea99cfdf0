package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
)

// manyBroker is a fakeBroker that also serves PublishMany, as a broker
// does: each entry through the fake's publish handler, answered per entry.
type manyBroker struct {
	*fakeBroker
	mu    sync.Mutex
	calls [][]string // the streams of each PublishMany
}

func (f *manyBroker) PublishMany(ctx context.Context, req *connect.Request[strandv1.PublishManyRequest]) (*connect.Response[strandv1.PublishManyResponse], error) {
	// Recorded as it arrives: an entry may be one of the publishes
	// heldPublishes holds, and a test waits for the call before it
	// releases them.
	var streams []string
	for _, p := range req.Msg.GetPublishes() {
		streams = append(streams, p.GetStream())
	}
	f.mu.Lock()
	f.calls = append(f.calls, streams)
	f.mu.Unlock()
	out := &strandv1.PublishManyResponse{}
	for i, p := range req.Msg.GetPublishes() {
		res, err := f.Publish(ctx, connect.NewRequest(p))
		if err != nil {
			out.Results = append(out.Results, &strandv1.PublishResult{Outcome: &strandv1.PublishResult_Error{Error: rpcerr.ToEntry(err, rpcerr.EntryPrefix("publishes", i))}})
			continue
		}
		out.Results = append(out.Results, &strandv1.PublishResult{Outcome: &strandv1.PublishResult_Response{Response: res.Msg}})
	}
	return connect.NewResponse(out), nil
}

// heldPublishes makes f's publish handler hold the first n publishes until
// release is closed, then store each stream's records at dense offsets.
func heldPublishes(f *fakeBroker, n int) (release chan struct{}) {
	release = make(chan struct{})
	var mu sync.Mutex
	held := 0
	tails := map[string]uint64{}
	f.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		mu.Lock()
		hold := held < n
		held++
		mu.Unlock()
		if hold {
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		res := &strandv1.PublishResponse{Epoch: 1}
		for range req.GetRecords() {
			res.Offsets = append(res.Offsets, tails[req.GetStream()])
			tails[req.GetStream()]++
		}
		return res, nil
	}
	return release
}

// gatherLinger is the Linger of the tests that need the attempts behind
// the held Publishes gathered into one PublishMany. The default 2 ms is
// shorter than the start of a dozen goroutines on a loaded machine: the
// attempts then trickle out one Publish at a time as each linger ends.
const gatherLinger = 500 * time.Millisecond

// publishStreams publishes one record to each of n streams at once and
// returns the calls' errors once all are answered.
func publishStreams(c *Client, n int) <-chan []error {
	out := make(chan []error, 1)
	go func() {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				_, errs[i] = c.Publish(context.Background(), fmt.Sprintf("s%d", i), recs("x"))
			})
		}
		wg.Wait()
		out <- errs
	}()
	return out
}

// A broker without PublishMany (older than it) answers Unimplemented: the
// client sends those attempts as Publishes, and Publishes only from then on.
func TestPublishManyFallsBackToPublishOnUnimplemented(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	// The first maxManyInFlight publishes hold the sender's slots, so the
	// other streams' attempts are gathered into a PublishMany.
	release := heldPublishes(f, maxManyInFlight)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Linger: gatherLinger})
	const n = 12
	done := publishStreams(c, n)
	sender := c.stream(f.addr).pub
	clustertest.Eventually(t, 10*time.Second, "the sender met Unimplemented", func() bool { return sender.single.Load() })
	close(release)
	for i, err := range <-done {
		if err != nil {
			t.Fatalf("publish to s%d: %v", i, err)
		}
	}
	seen := map[string]int{}
	for _, r := range f.requests() {
		seen[r.GetStream()]++
	}
	for i := range n {
		if seen[fmt.Sprintf("s%d", i)] != 1 {
			t.Fatalf("publishes per stream %v, want one Publish of each of %d streams", seen, n)
		}
	}
}

// Attempts for several streams ready at once for one broker travel in one
// PublishMany, and an entry's error is handled as its stream's Publish
// error: an entry answered FailedPrecondition with an owner hint is sent
// again to the owner the hint names, where it is stored; the other entries
// are not sent again.
func TestPublishManyEntryFollowsItsOwnerHint(t *testing.T) {
	owner := startFake(t, &fakeBroker{})
	owner.publish = appendLog()
	f := startMany(t)
	f.locate = ownedBy(f.addr)
	release := heldPublishes(f.fakeBroker, maxManyInFlight)
	inner := f.publish
	f.publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		if req.GetStream() == "s5" {
			return nil, rpcerr.NotOwner(&strandv1.OwnerHint{Stream: "s5", Node: "other", Address: owner.addr, Epoch: 2})
		}
		return inner(req)
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Linger: gatherLinger})
	const n = 12
	done := publishStreams(c, n)
	// Behind the held Publishes the others wait Linger at most, then go
	// in one PublishMany.
	clustertest.Eventually(t, 10*time.Second, "a PublishMany sent", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.calls) > 0
	})
	close(release)
	for i, err := range <-done {
		if err != nil {
			t.Fatalf("publish to s%d: %v", i, err)
		}
	}
	f.mu.Lock()
	calls := f.calls
	f.mu.Unlock()
	if len(calls) == 0 {
		t.Fatal("no PublishMany: every stream went alone")
	}
	sent := map[string]int{}
	for _, r := range f.requests() {
		sent[r.GetStream()]++
	}
	for i := range n {
		if s := fmt.Sprintf("s%d", i); sent[s] != 1 {
			t.Fatalf("%s reached the first broker %d times, want once (sent %v)", s, sent[s], sent)
		}
	}
	if got := owner.requests(); len(got) != 1 || got[0].GetStream() != "s5" {
		t.Fatalf("the hinted owner got %v, want s5's publish once", got)
	}
	if c.cachedOwner("s5") != owner.addr {
		t.Fatalf("s5's owner cached as %q, want the hint's %q", c.cachedOwner("s5"), owner.addr)
	}
}

// startMany serves a manyBroker over loopback HTTP, as startFake does a
// fakeBroker.
func startMany(t *testing.T) *manyBroker {
	t.Helper()
	f := &manyBroker{fakeBroker: &fakeBroker{}}
	path, h := strandv1connect.NewStreamServiceHandler(f)
	f.addr = clustertest.Serve(t, path, h).Addr()
	return f
}

// An attempt whose ctx ends while it waits at the sender is answered with
// its ctx's error and never sent, and the slots are given back once the
// requests holding them are answered.
func TestPublishManyDropsEndedAttempts(t *testing.T) {
	f := startFake(t, &fakeBroker{})
	f.locate = ownedBy(f.addr)
	release := heldPublishes(f, maxManyInFlight)
	// Linger an hour: what waits for a slot goes only when one frees.
	c := newTestClient(t, Config{Brokers: []string{f.addr}, Linger: time.Hour})
	held := publishStreams(c, maxManyInFlight)
	sender := c.stream(f.addr).pub
	clustertest.Eventually(t, 10*time.Second, "both slots held", func() bool {
		sender.mu.Lock()
		defer sender.mu.Unlock()
		return sender.inFlight == maxManyInFlight
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Publish(ctx, "late", recs("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a publish whose deadline passed while it waited: %v, want DeadlineExceeded", err)
	}
	close(release)
	for i, err := range <-held {
		if err != nil {
			t.Fatalf("held publish %d: %v", i, err)
		}
	}
	clustertest.Eventually(t, 10*time.Second, "the slots given back", func() bool {
		sender.mu.Lock()
		defer sender.mu.Unlock()
		return sender.inFlight == 0 && len(sender.queue) == 0
	})
	for _, r := range f.requests() {
		if r.GetStream() == "late" {
			t.Fatalf("the ended attempt was sent: %v", r)
		}
	}
}
