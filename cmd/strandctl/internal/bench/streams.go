package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The bench with many streams (--streams N): N streams created at once,
// the one window of publishes spread over them, and with a kill the broker
// that owns the most of them killed, so a failover moves many streams at
// once and the bench reports how long until each of them served again.

// streamWorkers bounds the look-ups and read-backs the bench makes at
// once for many streams (creates have --create-workers, probes
// --probe-workers): enough for a thousand streams in seconds, few enough
// not to queue the controller's requests behind each other.
const streamWorkers = 16

// MaxStreams bounds --streams: the bench keeps every stream's state and
// confirms in memory, and names carry up to six digits.
const MaxStreams = 100_000

// StreamNames derives the names of n streams from base: base itself for
// one stream (the bench's single-stream runs keep their stream's name),
// else base-0000, base-0001, ... with at least four digits, zero padded so
// the names sort in creation order.
func StreamNames(base string, n int) []string {
	if n <= 1 {
		return []string{base}
	}
	width := max(4, len(strconv.Itoa(n-1)))
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprintf("%s-%0*d", base, width, i)
	}
	return out
}

// StreamFor is the stream (an index into StreamNames) that record id goes
// to: round-robin over the ids, which start at 1, so any run of n
// consecutive records has one per stream and the window is spread evenly
// without a random source to seed.
func StreamFor(id uint64, n int) int {
	if n <= 1 {
		return 0
	}
	return int((id - 1) % uint64(n))
}

// MostStreamsOwner picks the broker that owns the most streams in owners
// (stream → owner node; an empty owner is skipped) and returns it with the
// streams it owns, sorted. A tie goes to the lowest node id, so the choice
// is the same for the same assignments.
func MostStreamsOwner(owners map[string]string) (node string, streams []string) {
	count := map[string]int{}
	for _, o := range owners {
		if o != "" {
			count[o]++
		}
	}
	for n, c := range count {
		if node == "" || c > count[node] || (c == count[node] && n < node) {
			node = n
		}
	}
	if node == "" {
		return "", nil
	}
	for s, o := range owners {
		if o == node {
			streams = append(streams, s)
		}
	}
	slices.Sort(streams)
	return node, streams
}

// Served is when a stream served again after the kill (from the kill to
// its first confirm that proves it, ServedAgain) and whether that confirm
// was a probe's (Confirm.Probe) rather than the load's.
type Served struct {
	After time.Duration
	Probe bool
}

// ServedAgain is, for each stream in epochs (stream index → its epoch when
// the owner was killed), the first confirm that proves the stream served
// again: a confirm received after the kill that names a later epoch (a new
// owner took the stream over) or answers a publish sent after the kill. A
// stream with no such confirm is absent. Probes and the load count alike:
// a probe is a publish sent after the kill, so its confirm proves it, and
// whichever of them is confirmed first is the stream's time.
//
// A publish sent before the kill and confirmed after it at the old epoch
// does not count: the killed owner may have answered it just before the
// signal, so it proves nothing about serving again.
func ServedAgain(confirms []Confirm, killAt time.Duration, epochs map[int]uint64) map[int]Served {
	out := make(map[int]Served, len(epochs))
	for _, c := range confirms {
		epoch, ok := epochs[int(c.Stream)]
		if !ok || c.Done < killAt || (c.Epoch <= epoch && c.Sent < killAt) {
			continue
		}
		d := c.Done - killAt
		if best, seen := out[int(c.Stream)]; !seen || d < best.After {
			out[int(c.Stream)] = Served{After: d, Probe: c.Probe}
		}
	}
	return out
}

// Serving summarises ServedAgain over the want streams that failed over:
// all is the time until the last of them served again and p50 the median
// of their times (nearest rank); missing counts those that did not serve
// again, byProbe those whose first proof was a probe's confirm. A stream
// that did not serve again counts as later than any, so all is not ok when
// one is missing, and p50 is not ok when the median falls on one.
type Serving struct {
	All, P50     time.Duration
	AllOK, P50OK bool
	Missing      int
	ByProbe      int
}

// SummarizeServing computes Serving for the streams want.
func SummarizeServing(served map[int]Served, want []int) Serving {
	var s Serving
	if len(want) == 0 {
		return s
	}
	// A stream that did not serve again sorts after every time.
	const never = time.Duration(math.MaxInt64)
	times := make([]time.Duration, 0, len(want))
	for _, w := range want {
		sv, ok := served[w]
		d := sv.After
		switch {
		case !ok:
			d = never
			s.Missing++
		case sv.Probe:
			s.ByProbe++
		}
		times = append(times, d)
	}
	slices.Sort(times)
	if last := times[len(times)-1]; last != never {
		s.All, s.AllOK = last, true
	}
	if p50 := Percentile(times, 50); p50 != never {
		s.P50, s.P50OK = p50, true
	}
	return s
}

// MassFailover splits the failover of the streams the killed broker owned
// (MassFailover in the result): over those streams, from the kill until
// each one's pending recovery was recorded (Recorded) and until its new
// assignment was committed (Assigned), as the etcd watch saw them; and per
// stream, from its new assignment until it served again (ServeAfter, over
// the streams with both). Where all_serving_ms is far above Assigned.All
// the time is in the clients finding the new owners; where Assigned is
// close to it, in the recoveries.
type MassFailover struct {
	Recorded, Assigned, ServeAfter Serving
}

// SummarizeMassFailover computes MassFailover for the streams want from
// the watch's times (since the start of publishing), the kill's, and
// ServedAgain's (since the kill). A stream that served before the watch
// delivered its new assignment (the watch can lag the commit) counts 0
// from its assignment to serving.
func SummarizeMassFailover(killAt time.Duration, recorded, assigned map[int]time.Duration, served map[int]Served, want []int) MassFailover {
	sinceKill := func(m map[int]time.Duration) map[int]Served {
		out := make(map[int]Served, len(m))
		for i, at := range m {
			out[i] = Served{After: max(at-killAt, 0)}
		}
		return out
	}
	after := map[int]Served{}
	var both []int
	for _, w := range want {
		a, assignedOK := assigned[w]
		s, servedOK := served[w]
		if !assignedOK || !servedOK {
			continue
		}
		both = append(both, w)
		after[w] = Served{After: max(s.After-(a-killAt), 0)}
	}
	return MassFailover{
		Recorded:   SummarizeServing(sinceKill(recorded), want),
		Assigned:   SummarizeServing(sinceKill(assigned), want),
		ServeAfter: SummarizeServing(after, both),
	}
}

// forEach calls fn for i in [0, n) on at most workers goroutines. The
// first error ends the loop: the calls running see ctx cancelled, the ones
// not started are skipped, and forEach returns that error once the running
// calls ended.
func forEach(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once  sync.Once
		first error
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					once.Do(func() {
						first = err
						cancel()
					})
				}
			}
		})
	}
	fed := 0
feed:
	for ; fed < n && ctx.Err() == nil; fed++ {
		select {
		case next <- fed:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && fed < n {
		// The caller's ctx ended the loop before every call ran.
		first = ctx.Err()
	}
	return first
}
