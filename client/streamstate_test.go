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
	"github.com/strandhq/strand/internal/clustertest"
)

// streamStates is how many streams c holds state for, and whether a
// sweepIdle goroutine runs.
func streamStates(c *Client) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.perStream), c.sweeping
}

// The janitor frees idle streams, owner cache and lanes alike, then stops;
// the next stream the client touches starts it again.
func TestIdleStreamsAreSweptAndTheSweeperStops(t *testing.T) {
	f := startFake(t, &fakeBroker{publish: appendLog()})
	f.locate = ownedBy(f.addr)
	f.read = func(req *strandv1.ReadRequest) (*strandv1.ReadResponse, error) {
		return &strandv1.ReadResponse{NextOffset: req.GetFromOffset()}, nil
	}
	c := newTestClient(t, Config{Brokers: []string{f.addr}, StreamIdle: 10 * time.Millisecond})
	for round := range 2 {
		for i := range 20 {
			stream := fmt.Sprint("s", i)
			if i%2 == 0 {
				if _, err := c.Publish(context.Background(), stream, recs("x")); err != nil {
					t.Fatal(err)
				}
			} else if _, err := c.Read(context.Background(), &strandv1.ReadRequest{Stream: stream}); err != nil {
				t.Fatal(err)
			}
		}
		clustertest.Eventually(t, 5*time.Second, fmt.Sprintf("round %d: every stream freed and the sweeper stopped", round), func() bool {
			n, sweeping := streamStates(c)
			return n == 0 && !sweeping
		})
	}
}

// A lane with a batch in flight or calls queued keeps its producer id and
// sequences however long the stream has been idle: a retry of its batch
// must carry them. Once idle it is freed, takes no more calls, and the
// stream's next publish starts a new producer at sequence 1.
func TestSweepKeepsBusyLanes(t *testing.T) {
	f, release, c, first := heldLane(t)
	// StreamIdle is the default here: sweep is called by the test, with a
	// now far past it.
	queuedDone := make(chan error, 1)
	c.PublishAsync(context.Background(), "s", recs("queued"), func(_ *strandv1.PublishResponse, err error) { queuedDone <- err })
	clustertest.Eventually(t, 5*time.Second, "a call queued behind the batch in flight", func() bool { return queued(c, "s") == 1 })
	later := func() time.Time { return time.Now().Add(2 * c.cfg.StreamIdle) }
	c.mu.Lock()
	lane := c.perStream["s"].lanes[0]
	c.mu.Unlock()
	if left := c.sweep(later()); left != 1 {
		t.Fatalf("sweep freed a stream with a batch in flight and a call queued (%d left)", left)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-queuedDone; err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 5*time.Second, "the lane idle", func() bool {
		lane.mu.Lock()
		defer lane.mu.Unlock()
		return !lane.sending
	})
	if left := c.sweep(later()); left != 0 {
		t.Fatalf("sweep kept %d streams with nothing in flight", left)
	}
	if lane.enqueue(&pendingPublish{ctx: context.Background(), records: recs("late")}) {
		t.Fatal("a freed lane took a call")
	}
	if _, err := c.Publish(context.Background(), "s", recs("again")); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	old, again := reqs[0].GetRecords()[0], reqs[len(reqs)-1].GetRecords()[0]
	if string(again.GetPayload()) != "again" || again.GetProducerId() == old.GetProducerId() || again.GetSequence() != 1 {
		t.Fatalf("after the stream was freed: %q stamped (%q, %d); want a producer other than %q, at sequence 1",
			again.GetPayload(), again.GetProducerId(), again.GetSequence(), old.GetProducerId())
	}
	neverSent(t, f, "late")
}

// dedupeLog is a publish handler that keeps a log per stream and, like a
// broker, a last sequence per (stream, producer): a record at or below it
// is answered as a duplicate of the one stored and not stored again, one
// past it is stored, and one further is a sequence gap.
func dedupeLog() (publish func(*strandv1.PublishRequest) (*strandv1.PublishResponse, error), stored func(stream string) []string) {
	type key struct{ stream, producer string }
	var (
		mu   sync.Mutex
		logs = map[string][]string{}
		last = map[key]uint64{}
		at   = map[key]map[uint64]uint64{} // sequence -> offset
	)
	publish = func(req *strandv1.PublishRequest) (*strandv1.PublishResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		res := &strandv1.PublishResponse{Epoch: 1}
		for _, r := range req.GetRecords() {
			k := key{req.GetStream(), r.GetProducerId()}
			switch seq := r.GetSequence(); {
			case seq <= last[k]:
				res.Offsets, res.Duplicate = append(res.Offsets, at[k][seq]), append(res.Duplicate, true)
				continue
			case seq > last[k]+1:
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("fake: sequence gap"))
			}
			off := uint64(len(logs[req.GetStream()]))
			logs[req.GetStream()] = append(logs[req.GetStream()], string(r.GetPayload()))
			last[k] = r.GetSequence()
			if at[k] == nil {
				at[k] = map[uint64]uint64{}
			}
			at[k][r.GetSequence()] = off
			res.Offsets, res.Duplicate = append(res.Offsets, off), append(res.Duplicate, false)
		}
		return res, nil
	}
	stored = func(stream string) []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), logs[stream]...)
	}
	return publish, stored
}

// A client that published to many streams frees each stream's state once
// it is idle, and a stream published to again afterwards stores its
// records once: the new lane is a new producer, not the old one's
// sequences started over, which a broker answers as duplicates of what it
// stored under them and does not store.
func TestIdleStreamStateIsFreed(t *testing.T) {
	publish, stored := dedupeLog()
	f := startFake(t, &fakeBroker{publish: publish})
	f.locate = ownedBy(f.addr)
	c := newTestClient(t, Config{Brokers: []string{f.addr}, StreamIdle: 10 * time.Millisecond})
	const n = 50
	for i := range n {
		if _, err := c.Publish(context.Background(), fmt.Sprint("s", i), recs("first")); err != nil {
			t.Fatal(err)
		}
	}
	clustertest.Eventually(t, 5*time.Second, "every idle stream's state freed", func() bool {
		left, _ := streamStates(c)
		return left == 0
	})
	for i := range n {
		stream := fmt.Sprint("s", i)
		res, err := c.Publish(context.Background(), stream, recs("again"))
		if err != nil {
			t.Fatalf("publish to %s after its state was freed: %v", stream, err)
		}
		if res.GetDuplicate()[0] || res.GetOffsets()[0] != 1 {
			t.Fatalf("publish to %s after its state was freed: offset %d duplicate %v, want stored at 1", stream, res.GetOffsets()[0], res.GetDuplicate()[0])
		}
		if got := stored(stream); len(got) != 2 || got[0] != "first" || got[1] != "again" {
			t.Fatalf("%s holds %q, want [first again]", stream, got)
		}
	}
}
