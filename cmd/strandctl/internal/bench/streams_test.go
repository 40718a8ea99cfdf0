package bench

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/cluster"
)

func TestStreamNames(t *testing.T) {
	for _, c := range []struct {
		base  string
		n     int
		first string
		last  string
	}{
		{"durable", 1, "durable", "durable"},
		{"durable", 2, "durable-0000", "durable-0001"},
		{"durable", 1000, "durable-0000", "durable-0999"},
		{"durable", 10000, "durable-0000", "durable-9999"},
		{"d", 10001, "d-00000", "d-10000"},
		{"d", MaxStreams, "d-00000", "d-99999"},
	} {
		got := StreamNames(c.base, c.n)
		if len(got) != c.n || got[0] != c.first || got[len(got)-1] != c.last {
			t.Errorf("StreamNames(%q, %d) = %d names %q..%q, want %d names %q..%q",
				c.base, c.n, len(got), got[0], got[len(got)-1], c.n, c.first, c.last)
			continue
		}
		// Distinct, valid, and in creation order when sorted.
		if !slices.IsSorted(got) {
			t.Errorf("StreamNames(%q, %d) do not sort in creation order", c.base, c.n)
		}
		if len(slices.Compact(slices.Clone(got))) != c.n {
			t.Errorf("StreamNames(%q, %d) repeats a name", c.base, c.n)
		}
		if err := cluster.ValidateStreamName(got[len(got)-1]); err != nil {
			t.Errorf("StreamNames(%q, %d): %v", c.base, c.n, err)
		}
	}
}

// The window is spread evenly: any run of consecutive records puts at most
// one more on one stream than on another, and n in a row cover every
// stream once.
func TestStreamForSpreadsTheWindow(t *testing.T) {
	if got := StreamFor(7, 1); got != 0 {
		t.Fatalf("StreamFor(7, 1) = %d, want 0", got)
	}
	for _, n := range []int{2, 3, 20, 1000} {
		for _, c := range []struct{ from, window uint64 }{{1, 256}, {1, uint64(n)}, {977, 256}, {5, 1}, {12345, 3 * uint64(n)}} {
			count := make([]int, n)
			for id := c.from; id < c.from+c.window; id++ {
				s := StreamFor(id, n)
				if s < 0 || s >= n {
					t.Fatalf("StreamFor(%d, %d) = %d, out of range", id, n, s)
				}
				count[s]++
			}
			lo, hi := slices.Min(count), slices.Max(count)
			if hi-lo > 1 {
				t.Errorf("n %d, ids %d..+%d: per-stream counts from %d to %d, want within 1", n, c.from, c.window, lo, hi)
			}
			if c.window%uint64(n) == 0 && lo != hi {
				t.Errorf("n %d, %d ids: counts %d..%d, want equal", n, c.window, lo, hi)
			}
		}
	}
	// The first record goes to the first stream: ids start at 1.
	if StreamFor(1, 5) != 0 || StreamFor(5, 5) != 4 || StreamFor(6, 5) != 0 {
		t.Fatalf("round-robin order: %d %d %d", StreamFor(1, 5), StreamFor(5, 5), StreamFor(6, 5))
	}
}

func TestMostStreamsOwner(t *testing.T) {
	for _, c := range []struct {
		name    string
		owners  map[string]string
		node    string
		streams []string
	}{
		{"none", nil, "", nil},
		{"only unowned", map[string]string{"a": ""}, "", nil},
		{"one stream", map[string]string{"s": "broker-2"}, "broker-2", []string{"s"}},
		{"clear winner", map[string]string{"a": "broker-1", "b": "broker-2", "c": "broker-2", "d": "broker-3"}, "broker-2", []string{"b", "c"}},
		{"tie goes to the lowest node", map[string]string{"a": "broker-3", "b": "broker-2", "c": "broker-3", "d": "broker-2"}, "broker-2", []string{"b", "d"}},
		{"unowned streams do not count", map[string]string{"a": "", "b": "", "c": "broker-1"}, "broker-1", []string{"c"}},
	} {
		node, streams := MostStreamsOwner(c.owners)
		if node != c.node || !reflect.DeepEqual(streams, c.streams) {
			t.Errorf("%s: %q %v, want %q %v", c.name, node, streams, c.node, c.streams)
		}
	}
}

func TestServedAgainAndSummary(t *testing.T) {
	ms := time.Millisecond
	kill := 1000 * ms
	c := func(stream uint32, epoch uint64, sentMs, doneMs int) Confirm {
		return Confirm{Stream: stream, Epoch: epoch, Sent: time.Duration(sentMs) * ms, Done: time.Duration(doneMs) * ms}
	}
	// probe is a probe's confirm: sent after the kill, by the prober.
	probe := func(stream uint32, epoch uint64, sentMs, doneMs int) Confirm {
		p := c(stream, epoch, sentMs, doneMs)
		p.Probe = true
		return p
	}
	load := func(d time.Duration) Served { return Served{After: d} }
	byProbe := func(d time.Duration) Served { return Served{After: d, Probe: true} }
	for _, tc := range []struct {
		name     string
		confirms []Confirm
		epochs   map[int]uint64 // the failed-over streams, epoch at the kill
		served   map[int]Served
		all, p50 float64 // ms; -1: not ok
		missing  int
		byProbe  int
	}{
		{
			name:     "one stream, a publish sent after the kill",
			confirms: []Confirm{c(0, 1, 900, 950), c(0, 1, 1100, 1400), c(0, 2, 1200, 1300)},
			epochs:   map[int]uint64{0: 1},
			served:   map[int]Served{0: load(300 * ms)}, all: 300, p50: 300,
		},
		{
			// Sent before the kill, confirmed after it at a new epoch:
			// the new owner took it over, so the stream served again.
			name:     "a retried publish at the new epoch counts",
			confirms: []Confirm{c(0, 2, 990, 1250), c(0, 2, 1300, 1320)},
			epochs:   map[int]uint64{0: 1},
			served:   map[int]Served{0: load(250 * ms)}, all: 250, p50: 250,
		},
		{
			// The old owner may have answered just before the signal.
			name:     "a confirm at the old epoch of a publish sent before the kill does not",
			confirms: []Confirm{c(0, 1, 999, 1001), c(0, 2, 1010, 1600)},
			epochs:   map[int]uint64{0: 1},
			served:   map[int]Served{0: load(600 * ms)}, all: 600, p50: 600,
		},
		{
			name: "streams not failed over are ignored",
			confirms: []Confirm{
				c(0, 1, 1001, 1002), // stream 0 kept its owner
				c(1, 4, 1001, 1500), c(2, 3, 1001, 1200), c(3, 8, 1001, 1900),
			},
			epochs: map[int]uint64{1: 3, 2: 2, 3: 7},
			served: map[int]Served{1: load(500 * ms), 2: load(200 * ms), 3: load(900 * ms)}, all: 900, p50: 500,
		},
		{
			name:     "a stream that never served again",
			confirms: []Confirm{c(1, 2, 1001, 1400), c(2, 1, 500, 900)},
			epochs:   map[int]uint64{1: 1, 2: 1, 3: 1},
			served:   map[int]Served{1: load(400 * ms)}, all: -1, p50: -1, missing: 2,
		},
		{
			name:     "the median served though one did not",
			confirms: []Confirm{c(1, 2, 1001, 1100), c(2, 2, 1001, 1300), c(3, 2, 1001, 1200)},
			epochs:   map[int]uint64{1: 1, 2: 1, 3: 1, 4: 1},
			served:   map[int]Served{1: load(100 * ms), 2: load(300 * ms), 3: load(200 * ms)}, all: -1, p50: 200, missing: 1,
		},
		{
			name:     "nothing after the kill",
			confirms: []Confirm{c(0, 1, 100, 200)},
			epochs:   map[int]uint64{0: 1},
			served:   map[int]Served{}, all: -1, p50: -1, missing: 1,
		},
		{
			// With many streams the load reaches a stream only every
			// stream_interval_ms: the probe is what proves most of them.
			name: "a probe serves the streams the load did not reach",
			confirms: []Confirm{
				c(1, 2, 1001, 1300),
				probe(2, 2, 1001, 1450), probe(3, 2, 1200, 1700),
				c(4, 1, 400, 500), // before the kill
			},
			epochs: map[int]uint64{1: 1, 2: 1, 3: 1, 4: 1},
			served: map[int]Served{1: load(300 * ms), 2: byProbe(450 * ms), 3: byProbe(700 * ms)}, all: -1, p50: 450, missing: 1, byProbe: 2,
		},
		{
			// Whichever is confirmed first is the stream's time, in
			// whatever order the confirms are listed.
			name: "the first of load and probe counts",
			confirms: []Confirm{
				probe(1, 2, 1001, 1800), c(1, 2, 1001, 1250),
				c(2, 2, 1100, 1900), probe(2, 2, 1002, 1400),
				// stream 3: the load's retry at the new epoch, sent
				// before the kill, beats the probe.
				probe(3, 5, 1003, 1600), c(3, 5, 990, 1500),
			},
			epochs: map[int]uint64{1: 1, 2: 1, 3: 4},
			served: map[int]Served{1: load(250 * ms), 2: byProbe(400 * ms), 3: load(500 * ms)}, all: 500, p50: 400, byProbe: 1,
		},
		{
			// A probe confirmed at the old epoch still proves it: it was
			// sent after the kill, so a broker serving the stream
			// answered it (a stopped owner that came back, say). A probe
			// of a stream that did not fail over is ignored.
			name:     "a probe at the old epoch counts, one of another stream does not",
			confirms: []Confirm{probe(1, 1, 1001, 1350), probe(7, 1, 1001, 1010), c(2, 1, 998, 1100)},
			epochs:   map[int]uint64{1: 1, 2: 1},
			served:   map[int]Served{1: byProbe(350 * ms)}, all: -1, p50: 350, missing: 1, byProbe: 1,
		},
	} {
		served := ServedAgain(tc.confirms, kill, tc.epochs)
		if !reflect.DeepEqual(served, tc.served) {
			t.Errorf("%s: served again %v, want %v", tc.name, served, tc.served)
		}
		var want []int
		for i := range tc.epochs {
			want = append(want, i)
		}
		s := SummarizeServing(served, want)
		msOr := func(d time.Duration, ok bool) float64 {
			if !ok {
				return -1
			}
			return float64(d) / float64(ms)
		}
		if got := msOr(s.All, s.AllOK); got != tc.all {
			t.Errorf("%s: all serving %v ms, want %v", tc.name, got, tc.all)
		}
		if got := msOr(s.P50, s.P50OK); got != tc.p50 {
			t.Errorf("%s: p50 %v ms, want %v", tc.name, got, tc.p50)
		}
		if s.Missing != tc.missing {
			t.Errorf("%s: missing %d, want %d", tc.name, s.Missing, tc.missing)
		}
		if s.ByProbe != tc.byProbe {
			t.Errorf("%s: served by probe %d, want %d", tc.name, s.ByProbe, tc.byProbe)
		}
	}
	if s := SummarizeServing(nil, nil); s.AllOK || s.P50OK || s.Missing != 0 || s.ByProbe != 0 {
		t.Errorf("no streams failed over: %+v", s)
	}
}

func TestSummarizeMassFailover(t *testing.T) {
	ms := time.Millisecond
	kill := 1000 * ms
	want := []int{1, 2, 3, 4}
	// Since the start of publishing, as the watch records them.
	recorded := map[int]time.Duration{1: 1400 * ms, 2: 1500 * ms, 3: 1450 * ms, 4: 1600 * ms}
	assigned := map[int]time.Duration{1: 1800 * ms, 2: 2500 * ms, 3: 2100 * ms} // 4: not seen
	// Since the kill, as ServedAgain gives them.
	served := map[int]Served{
		1: {After: 1500 * ms},              // 700 ms after its assignment
		2: {After: 1400 * ms, Probe: true}, // before the watch delivered its assignment: 0
		3: {After: 1300 * ms},              // 200 ms after
		4: {After: 2000 * ms},              // no assignment seen: left out of ServeAfter
	}
	m := SummarizeMassFailover(kill, recorded, assigned, served, want)
	check := func(what string, s Serving, all, p50 time.Duration, allOK bool, missing int) {
		t.Helper()
		if s.AllOK != allOK || (allOK && s.All != all) || !s.P50OK || s.P50 != p50 || s.Missing != missing {
			t.Errorf("%s: %+v, want all %v (ok %v) p50 %v missing %d", what, s, all, allOK, p50, missing)
		}
	}
	check("recorded", m.Recorded, 600*ms, 450*ms, true, 0)
	check("assigned", m.Assigned, 0, 1100*ms, false, 1)
	check("serve after assigned", m.ServeAfter, 700*ms, 200*ms, true, 0)
}

// The probes go first to the streams whose new assignment the watch saw,
// in the order given; the rest wait.
func TestSplitAssigned(t *testing.T) {
	w := &streamsWatch{assigned: map[int]time.Time{4: time.Unix(1, 0), 9: time.Unix(2, 0), 2: time.Unix(3, 0)}}
	assigned, rest := w.splitAssigned([]int{9, 1, 2, 7, 4})
	if !reflect.DeepEqual(assigned, []int{9, 2, 4}) || !reflect.DeepEqual(rest, []int{1, 7}) {
		t.Fatalf("splitAssigned = %v, %v; want [9 2 4], [1 7]", assigned, rest)
	}
	if assigned, rest := w.splitAssigned(nil); assigned != nil || rest != nil {
		t.Fatalf("splitAssigned(nil) = %v, %v", assigned, rest)
	}
}

func TestCPUPercent(t *testing.T) {
	t0 := time.Unix(1000, 0)
	before := cpuSample{at: t0, procs: map[string]procTime{
		devcluster.Controller: {pid: 10, cpu: time.Second},
		devcluster.Recoverer:  {pid: 11, cpu: time.Second},
		"broker-1":            {pid: 20, cpu: 10 * time.Second},
		"broker-2":            {pid: 21, cpu: 10 * time.Second},
		"broker-3":            {pid: 22, cpu: 10 * time.Second},
	}}
	after := cpuSample{at: t0.Add(10 * time.Second), procs: map[string]procTime{
		devcluster.Controller: {pid: 10, cpu: 1500 * time.Millisecond}, // 5%
		devcluster.Recoverer:  {pid: 11, cpu: time.Second},             // 0%
		"broker-1":            {pid: 30, cpu: time.Second},             // restarted: left out
		"broker-2":            {pid: 21, cpu: 16 * time.Second},        // 60%
		"broker-3":            {pid: 22, cpu: 12 * time.Second},        // 20%
	}}
	got := CPUPercent(before, after)
	want := map[string]float64{devcluster.Controller: 5, devcluster.Recoverer: 0, "broker-2": 60, "broker-3": 20}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CPUPercent = %v, want %v", got, want)
	}
	brokers := []string{"broker-1", "broker-2", "broker-3"}
	s := SummarizeCPU(got, brokers, "")
	if s.Controller == nil || *s.Controller != 5 || s.Recoverer == nil || *s.Recoverer != 0 || s.Broker == nil || *s.Broker != 40 {
		t.Fatalf("SummarizeCPU = %v %v %v, want 5 0 40", s.Controller, s.Recoverer, s.Broker)
	}
	// The killed owner is left out of the brokers' mean even when it was
	// stopped rather than killed (same pid, little CPU).
	got["broker-1"] = 1
	if s := SummarizeCPU(got, brokers, "broker-1"); s.Broker == nil || *s.Broker != 40 {
		t.Fatalf("mean without the killed broker = %v, want 40", s.Broker)
	}
	if s := SummarizeCPU(map[string]float64{}, brokers, ""); s.Controller != nil || s.Recoverer != nil || s.Broker != nil {
		t.Fatalf("nothing measured: %+v, want no figures", s)
	}
	if got := CPUPercent(after, before); len(got) != 0 {
		t.Fatalf("a window that ends before it starts: %v", got)
	}
}

func TestRevisionsPerS(t *testing.T) {
	t0 := time.Unix(1000, 0)
	if v, ok := RevisionsPerS(etcdMark{at: t0, rev: 100}, etcdMark{at: t0.Add(4 * time.Second), rev: 150}); !ok || v != 12.5 {
		t.Fatalf("RevisionsPerS = %v, %v; want 12.5", v, ok)
	}
	if _, ok := RevisionsPerS(etcdMark{at: t0, rev: 100}, etcdMark{at: t0, rev: 150}); ok {
		t.Fatal("RevisionsPerS over no time")
	}
	if _, ok := RevisionsPerS(etcdMark{at: t0, rev: 100}, etcdMark{at: t0.Add(time.Second), rev: 50}); ok {
		t.Fatal("RevisionsPerS with a revision going back")
	}
}

func TestForEach(t *testing.T) {
	var running, peak atomic.Int64
	var mu sync.Mutex
	seen := map[int]int{}
	err := forEach(context.Background(), 100, 4, func(_ context.Context, i int) error {
		n := running.Add(1)
		defer running.Add(-1)
		storeMax(&peak, n)
		mu.Lock()
		seen[i]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatalf("forEach = %v", err)
	}
	if peak.Load() > 4 {
		t.Fatalf("%d calls at once, want at most 4", peak.Load())
	}
	for i := range 100 {
		if seen[i] != 1 {
			t.Fatalf("index %d called %d times, want once", i, seen[i])
		}
	}

	// The first error ends the loop: the calls running see ctx end, the
	// rest do not run, and the error is the one that ended it.
	errBad := errors.New("bad")
	var calls atomic.Int64
	err = forEach(context.Background(), 1000, 4, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 10 {
			return errBad
		}
		if i > 10 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if !errors.Is(err, errBad) {
		t.Fatalf("forEach = %v, want the failing call's error", err)
	}
	if n := calls.Load(); n > 20 {
		t.Fatalf("%d calls after the error at index 10, want the loop ended", n)
	}

	// A caller's ctx that ends stops the loop with its error.
	ctx, cancel := context.WithCancel(context.Background())
	err = forEach(ctx, 1000, 2, func(context.Context, int) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("forEach with its ctx cancelled = %v, want context.Canceled", err)
	}
	if err := forEach(context.Background(), 0, 4, func(context.Context, int) error { return errBad }); err != nil {
		t.Fatalf("forEach over nothing = %v", err)
	}
}
