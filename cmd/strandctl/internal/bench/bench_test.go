package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

func validConfig() Config {
	return Config{Stream: DefaultStream, Streams: 1, Copies: 3, Policy: DefaultPolicy, Size: DefaultSize, Inflight: DefaultInflight,
		Duration: DefaultDuration, KillAt: 8 * time.Second, KillSignal: "KILL", Brokers: 3}
}

func TestValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("defaults with a kill at 8s: %v", err)
	}
	for _, c := range []struct {
		name   string
		mutate func(*Config)
		want   string // "" means valid
	}{
		{"no kill", func(c *Config) { c.KillAt = 0 }, ""},
		{"a handover", func(c *Config) { c.KillAt, c.HandoverAt = 0, time.Second }, ""},
		{"a handover and a kill", func(c *Config) { c.HandoverAt = time.Second }, "--handover-at-secs and --kill-owner-at-secs"},
		{"a handover at the end", func(c *Config) { c.KillAt, c.HandoverAt = 0, c.Duration }, "--handover-at-secs"},
		{"a handover of one copy", func(c *Config) { c.KillAt, c.HandoverAt, c.Copies = 0, time.Second, 1 }, "--handover-at-secs needs --copies 2"},
		{"kill just before the end", func(c *Config) { c.KillAt = c.Duration - time.Millisecond }, ""},
		{"STOP", func(c *Config) { c.KillSignal = "STOP" }, ""},
		{"TERM", func(c *Config) { c.KillSignal = "SIGTERM" }, ""},
		{"replica_durable with nodes", func(c *Config) { c.Policy, c.Nodes = "replica_durable", 2 }, ""},
		{"external, copies above local brokers", func(c *Config) { c.External, c.KillAt, c.Copies = true, 0, 5 }, ""},
		{"kill at the end", func(c *Config) { c.KillAt = c.Duration }, "--kill-owner-at-secs"},
		{"kill after the end", func(c *Config) { c.KillAt = c.Duration + time.Second }, "--kill-owner-at-secs"},
		{"copies above brokers", func(c *Config) { c.Copies = 4 }, "--copies 4 is above the 3 brokers"},
		{"copies 0", func(c *Config) { c.Copies = 0 }, "--copies"},
		{"copies 8", func(c *Config) { c.Copies, c.Brokers = 8, 8 }, "--copies"},
		{"unknown policy", func(c *Config) { c.Policy = "fast" }, "--policy"},
		{"empty policy", func(c *Config) { c.Policy = "" }, "--policy"},
		{"replica_durable without nodes", func(c *Config) { c.Policy = "replica_durable" }, "--policy"},
		{"unknown signal", func(c *Config) { c.KillSignal = "HUP" }, "--kill-signal"},
		{"signal ignored without a kill", func(c *Config) { c.KillAt, c.KillSignal = 0, "HUP" }, ""},
		{"size below the id prefix", func(c *Config) { c.Size = 8 }, "--size"},
		{"no window", func(c *Config) { c.Inflight = 0 }, "--inflight"},
		{"negative lanes", func(c *Config) { c.Lanes = -1 }, "--lanes"},
		{"too many lanes", func(c *Config) { c.Lanes = 65 }, "--lanes"},
		{"linger off", func(c *Config) { c.Linger = -1 }, ""},
		{"sync publishers", func(c *Config) { c.Publishers = PublishersSync }, ""},
		{"async publishers", func(c *Config) { c.Publishers = PublishersAsync }, ""},
		{"unknown publishers", func(c *Config) { c.Publishers = "threads" }, "--publishers"},
		{"linger too long", func(c *Config) { c.Linger = 2 * time.Second }, "--linger"},
		{"no duration", func(c *Config) { c.Duration, c.KillAt = 0, 0 }, "--duration"},
		{"warm-up", func(c *Config) { c.Warmup, c.KillAt = 2*time.Second, 0 }, ""},
		{"negative warm-up", func(c *Config) { c.Warmup, c.KillAt = -time.Second, 0 }, "--warmup"},
		{"warm-up with a kill", func(c *Config) { c.Warmup = 2 * time.Second }, "--warmup"},
		{"bad stream name", func(c *Config) { c.Stream = "Bad Name" }, "--stream"},
		{"many streams", func(c *Config) { c.Streams = 1000 }, ""},
		{"no streams", func(c *Config) { c.Streams = 0 }, "--streams must be 1.."},
		{"negative streams", func(c *Config) { c.Streams = -3 }, "--streams must be 1.."},
		{"too many streams", func(c *Config) { c.Streams = MaxStreams + 1 }, "--streams must be 1.."},
		// 123 characters fit one stream's name but not with "-0000".
		{"longest single name", func(c *Config) { c.Stream = strings.Repeat("s", 128) }, ""},
		{"derived names too long", func(c *Config) { c.Stream, c.Streams = strings.Repeat("s", 124), 2 }, "--stream"},
		{"no probes", func(c *Config) { c.ProbeWorkers = 0 }, ""},
		{"a probe per stream of a large broker", func(c *Config) { c.ProbeWorkers = MaxProbeWorkers }, ""},
		{"more probes than the bound", func(c *Config) { c.ProbeWorkers = MaxProbeWorkers + 1 }, "--probe-workers"},
		{"negative probes", func(c *Config) { c.ProbeWorkers = -1 }, "--probe-workers"},
		{"more create workers than the bound", func(c *Config) { c.CreateWorkers = MaxWorkers + 1 }, "--create-workers"},
		{"no idle window", func(c *Config) { c.IdleWindow = 0 }, ""},
		{"negative idle window", func(c *Config) { c.IdleWindow = -time.Second }, "--idle-window"},
		{"kill on an external cluster", func(c *Config) { c.External = true }, "drop --controller/--broker"},
		{"kill a single copy", func(c *Config) { c.Copies = 1 }, "--copies 2 or more"},
		{"restart mid-run", func(c *Config) { c.RestartAfter = 3 * time.Second }, ""},
		{"restart after a TERM", func(c *Config) { c.RestartAfter, c.KillSignal = 3*time.Second, "TERM" }, ""},
		{"restart after a STOP", func(c *Config) { c.RestartAfter, c.KillSignal = 3*time.Second, "STOP" }, "--kill-signal KILL or TERM"},
		{"restart without a kill", func(c *Config) { c.RestartAfter, c.KillAt = 3*time.Second, 0 }, "needs --kill-owner-at-secs"},
		{"restart at the end", func(c *Config) { c.RestartAfter = c.Duration - c.KillAt }, "--restart-owner-after-secs"},
		{"negative restart", func(c *Config) { c.RestartAfter = -time.Second }, "--restart-owner-after-secs"},
	} {
		cfg := validConfig()
		c.mutate(&cfg)
		err := cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: unexpected %v", c.name, err)
		case c.want != "" && err == nil:
			t.Errorf("%s: accepted, want an error mentioning %q", c.name, c.want)
		case c.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want ErrInvalid mentioning %q", c.name, err, c.want)
		}
	}
}

func TestPayloadAndParseID(t *testing.T) {
	for _, id := range []uint64{0, 1, 42, 1<<63 + 5} {
		p := RecordPayload(id, 64)
		if len(p) != 64 {
			t.Fatalf("payload of %d is %d bytes, want 64", id, len(p))
		}
		got, ok := ParseID(p)
		if !ok || got != id {
			t.Fatalf("ParseID(RecordPayload(%d)) = %d, %v", id, got, ok)
		}
	}
	// After the prefix, byte i is 'a'+i%26, across the filler's own length.
	for _, size := range []int{5, 27, 1024, 26*1024 + 100, 100_000} {
		p := Payload("pre-", size)
		for i := 4; i < size; i++ {
			if p[i] != 'a'+byte(i%26) {
				t.Fatalf("Payload(pre-, %d)[%d] = %q, want %q", size, i, p[i], 'a'+byte(i%26))
			}
		}
	}
	// An id longer than the size is kept whole.
	if p := RecordPayload(123456789, 4); string(p) != "bench-123456789-" {
		t.Fatalf("short payload %q", p)
	}
	for _, bad := range []string{"", "hello", "bench-", "bench-12", "bench-x-", "bench--1"} {
		if _, ok := ParseID([]byte(bad)); ok {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
}

func TestVerify(t *testing.T) {
	confirms := []Confirm{{ID: 1, Offset: 0}, {ID: 2, Offset: 1}, {ID: 3, Offset: 2}, {ID: 4, Offset: 3}}
	stored := func(pairs ...uint64) []Stored {
		var out []Stored
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, Stored{Offset: pairs[i], ID: pairs[i+1], HasID: true})
		}
		return out
	}
	for _, c := range []struct {
		name   string
		stored []Stored
		want   Verdict
	}{
		{"all in place", stored(0, 1, 1, 2, 2, 3, 3, 4), Verdict{Confirmed: 4}},
		{"one lost", stored(0, 1, 1, 2, 3, 4), Verdict{Confirmed: 4, Lost: 1}},
		{"one moved", stored(0, 1, 1, 2, 2, 4, 3, 3), Verdict{Confirmed: 4, OffsetMismatches: 2}},
		{"one twice", stored(0, 1, 1, 2, 2, 3, 3, 4, 4, 2), Verdict{Confirmed: 4, Duplicates: 1, OffsetMismatches: 1}},
		{"an unconfirmed record stored", stored(0, 1, 1, 2, 2, 3, 3, 4, 4, 9), Verdict{Confirmed: 4, UnconfirmedStored: 1}},
		{"an unconfirmed record stored twice", stored(0, 1, 1, 2, 2, 3, 3, 4, 4, 9, 5, 9), Verdict{Confirmed: 4, UnconfirmedStored: 1, Duplicates: 1}},
		{"a foreign record", append(stored(0, 1, 1, 2, 2, 3, 3, 4), Stored{Offset: 4}), Verdict{Confirmed: 4, Foreign: 1}},
		{"empty stream", nil, Verdict{Confirmed: 4, Lost: 4}},
		// Offsets are per stream: a record at its confirmed offset but
		// in another stream moved.
		{"in another stream", append(stored(0, 1, 1, 2, 2, 3), Stored{Offset: 3, ID: 4, Stream: 1, HasID: true}), Verdict{Confirmed: 4, OffsetMismatches: 1}},
	} {
		got := Verify(confirms, c.stored)
		got.Examples = nil
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if got.OK() != (c.want.Lost == 0 && c.want.Duplicates == 0 && c.want.OffsetMismatches == 0) {
			t.Errorf("%s: OK() = %v", c.name, got.OK())
		}
	}
	if v := Verify(nil, stored(0, 1)); v.OK() {
		t.Error("a run that confirmed nothing is OK")
	}
	if v := Verify(confirms, stored(0, 1)); len(v.Examples) == 0 || !strings.Contains(v.Examples[0], "missing") {
		t.Errorf("examples %v, want the missing record described", v.Examples)
	}
}

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0, time.Millisecond}, {1, time.Millisecond}, {99.5, 100 * time.Millisecond}} {
		if got := Percentile(lat, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("single value p99 = %v", got)
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("empty p50 = %v", got)
	}
	// Summarize does not depend on input order and does not reorder it.
	shuffled := []time.Duration{5 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond}
	s := Summarize(shuffled)
	if s.P50 != 3 || s.P99 != 5 || s.Max != 5 {
		t.Errorf("Summarize = %+v, want p50 3 p99 5 max 5", s)
	}
	if shuffled[0] != 5*time.Millisecond {
		t.Error("Summarize sorted its input in place")
	}
}

func TestUnavailableAndGaps(t *testing.T) {
	ms := time.Millisecond
	confirms := []Confirm{
		{ID: 1, Sent: 0, Done: 10 * ms},
		{ID: 2, Sent: 900 * ms, Done: 2500 * ms}, // sent before the kill, confirmed after
		{ID: 3, Sent: 1100 * ms, Done: 2700 * ms},
		{ID: 4, Sent: 1200 * ms, Done: 2600 * ms},
		{ID: 5, Sent: 2700 * ms, Done: 2710 * ms},
	}
	u, ok := Unavailable(confirms, 1000*ms)
	if !ok || u != 1600*ms {
		t.Fatalf("Unavailable = %v, %v; want 1.6s (first confirm of a publish sent after the kill)", u, ok)
	}
	if _, ok := Unavailable(confirms, 3*time.Second); ok {
		t.Fatal("Unavailable found a confirm of a publish sent after the last one")
	}
	if g := MaxGap(confirms); g != 2490*ms {
		t.Fatalf("MaxGap = %v, want 2.49s", g)
	}
	if g := MaxGap(confirms[:1]); g != 0 {
		t.Fatalf("MaxGap of one = %v", g)
	}
	b := Buckets(confirms, 100*ms, 3*time.Second)
	if len(b) != 30 || b[0] != 1 || b[25] != 1 || b[26] != 1 || b[27] != 2 {
		t.Fatalf("Buckets = %v", b)
	}
	sum := 0
	for _, n := range b {
		sum += n
	}
	if sum != len(confirms) {
		t.Fatalf("buckets hold %d confirms, want %d", sum, len(confirms))
	}
}

func TestMeasured(t *testing.T) {
	ms := time.Millisecond
	confirms := []Confirm{
		{ID: 1, Sent: 0, Done: 30 * ms},
		{ID: 2, Sent: 1999 * ms, Done: 2010 * ms}, // sent in the warm-up, confirmed after it
		{ID: 3, Sent: 2000 * ms, Done: 2005 * ms},
		{ID: 4, Sent: 2500 * ms, Done: 2520 * ms},
	}
	if got := Measured(confirms, 0); len(got) != len(confirms) {
		t.Fatalf("Measured without a warm-up kept %d of %d", len(got), len(confirms))
	}
	got := Measured(confirms, 2*time.Second)
	if len(got) != 2 || got[0].ID != 3 || got[1].ID != 4 {
		t.Fatalf("Measured after 2s = %+v, want the confirms of ids 3 and 4", got)
	}
	if len(confirms) != 4 || confirms[1].ID != 2 {
		t.Fatal("Measured changed its input")
	}
}

// procTree is a procfs over a temp dir, and a function that writes a
// process's file there.
func procTree(t *testing.T) (procfs.FS, func(pid int, file, text string)) {
	t.Helper()
	dir := t.TempDir()
	fs, err := procfs.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fs, func(pid int, file, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, strconv.Itoa(pid)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(pid), file), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestProcMemoryKB(t *testing.T) {
	fs, write := procTree(t)
	status := func(pid int, text string) { write(pid, "status", text) }
	status(4242, "Name:\tstrand-broker\nVmPeak:\t  900000 kB\nVmHWM:\t  123456 kB\nVmRSS:\t  100000 kB\nRssAnon:\t   51200 kB\n")
	if hwm, anon, ok := procMemoryKB(fs, 4242); !ok || hwm != 123456 || anon != 51200 {
		t.Fatalf("procMemoryKB = %d, %d, %v; want 123456, 51200, true", hwm, anon, ok)
	}
	// No VmHWM (a kernel thread, say): nothing to report.
	status(4243, "Name:\tx\n")
	if _, _, ok := procMemoryKB(fs, 4243); ok {
		t.Error("procMemoryKB of a status without VmHWM ok, want refused")
	}
	if _, _, ok := procMemoryKB(fs, 9999); ok {
		t.Error("procMemoryKB of a process that is not there ok, want refused")
	}
}

func TestWriteSVG(t *testing.T) {
	var buf bytes.Buffer
	marks := []Mark{{At: 800 * time.Millisecond, Label: "SIGKILL broker-1 <owner>"}, {At: 1200 * time.Millisecond, Label: "new owner broker-2", Color: "#27ae60"}}
	if err := WriteSVG(&buf, "bench & co", []int{5, 0, 7, 3, 0, 0, 0, 0, 9, 1, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4}, PlotWidth, marks); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML (labels escaped), one bar per non-empty bucket, one
	// line per mark.
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	bars, lines := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("SVG is not well-formed: %v\n%s", err, buf.String())
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if a.Name.Local == "class" && a.Value == "bar" {
					bars++
				}
				if a.Name.Local == "class" && a.Value == "mark" {
					lines++
				}
			}
		}
	}
	if bars != 15 || lines != 2 {
		t.Fatalf("%d bars and %d marks, want 15 and 2", bars, lines)
	}
	if !strings.Contains(buf.String(), "SIGKILL broker-1 &lt;owner&gt;") {
		t.Fatal("mark label missing or unescaped")
	}
}

func TestProcCPU(t *testing.T) {
	fs, write := procTree(t)
	stat := func(pid int, line string) { write(pid, "stat", line) }
	// A command name with a space and a parenthesis: the fields are
	// counted after the last ')'.
	stat(4242, "4242 (strand) broker) S 1 4242 4242 0 -1 4194560 9812 0 0 0 1234 567 0 0 20 0 11 0 5000 1000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")
	got, ok := procCPU(fs, 4242)
	if want := (1234 + 567) * time.Second / 100; !ok || got != want {
		t.Fatalf("procCPU = %v, %v; want %v, true", got, ok, want)
	}
	for i, bad := range []string{"", "4242 strand S 1", "4242 (strand) S 1 2 3", "4242 (strand) S 1 4242 4242 0 -1 4194560 9812 0 0 0 x 567"} {
		pid := 5000 + i
		stat(pid, bad)
		if _, ok := procCPU(fs, pid); ok {
			t.Errorf("procCPU of stat %q ok, want refused", bad)
		}
	}
	if _, ok := procCPU(fs, 9999); ok {
		t.Error("procCPU of a process that is not there ok, want refused")
	}
}

// TestStageMeans: each stage's mean over the window comes from the owner's
// histograms or the followers' together, a broker whose counters went back
// (a restart) is left out, and a stage without samples is not reported.
func TestStageMeans(t *testing.T) {
	before := map[string]brokerHistograms{
		"b1": {"publish_confirm_seconds": {sum: 1, count: 10}, "commit_sync_seconds": {sum: 0.5, count: 100}},
		"b2": {"commit_sync_seconds": {sum: 2, count: 50}, "follow_apply_seconds": {sum: 0, count: 0}},
		"b3": {"commit_sync_seconds": {sum: 9, count: 900}, "follow_apply_seconds": {sum: 1, count: 10}},
	}
	after := map[string]brokerHistograms{
		// 4 publishes confirmed in 0.024 s: 6 ms each; 10 syncs of 2 ms.
		"b1": {"publish_confirm_seconds": {sum: 1.024, count: 14}, "commit_sync_seconds": {sum: 0.52, count: 110}},
		// b2: 10 syncs of 3 ms; 10 batches applied in 4 ms each.
		"b2": {"commit_sync_seconds": {sum: 2.03, count: 60}, "follow_apply_seconds": {sum: 0.04, count: 10}},
		// b3 restarted: its counters began again, so it is left out.
		"b3": {"commit_sync_seconds": {sum: 0.001, count: 1}, "follow_apply_seconds": {sum: 0.001, count: 1}},
	}
	got := stageMeans("b1", before, after)
	want := map[string]float64{"publish_confirm": 6, "owner_commit_sync": 2, "follower_commit_sync": 3, "follow_apply": 4}
	if len(got) != len(want) {
		t.Fatalf("stages %v, want %v", got, want)
	}
	for k, v := range want {
		if math.Abs(got[k]-v) > 1e-9 {
			t.Errorf("stage %s = %v ms, want %v", k, got[k], v)
		}
	}
	if s := stageMeans("b1", before, before); s != nil {
		t.Errorf("stages of an empty window %v, want none", s)
	}
	// Many streams: every broker counts for every stage (b3 still left
	// out), the committer's stages without a role.
	got = stageMeans("", before, after)
	// Syncs: 10 of 2 ms on b1 and 10 of 3 ms on b2.
	want = map[string]float64{"publish_confirm": 6, "commit_sync": 2.5, "follow_apply": 4}
	if len(got) != len(want) {
		t.Fatalf("stages over every broker %v, want %v", got, want)
	}
	for k, v := range want {
		if math.Abs(got[k]-v) > 1e-9 {
			t.Errorf("stage over every broker %s = %v ms, want %v", k, got[k], v)
		}
	}
}

// The handover's unavailability: the longest stretch without a confirm
// overlapping the call, edges included.
func TestHandoverUnavailable(t *testing.T) {
	at := func(ms ...int) []Confirm {
		out := make([]Confirm, len(ms))
		for i, m := range ms {
			out[i] = Confirm{Done: time.Duration(m) * time.Millisecond}
		}
		return out
	}
	cases := []struct {
		name     string
		confirms []Confirm
		from, to int
		want     int
		ok       bool
	}{
		{"steady confirms: the largest gap inside", at(90, 100, 110, 130, 140, 150, 155), 100, 150, 20, true},
		{"the stretch past the answer counts", at(90, 100, 110, 130, 140, 200), 100, 150, 60, true},
		{"a stall across the call", at(90, 300), 100, 150, 210, true},
		{"the gap from the last confirm before", at(50, 120, 125), 100, 110, 70, true},
		{"unsorted input", at(140, 90, 155, 130, 110, 150, 100), 100, 150, 20, true},
		{"nothing after from", at(10, 20), 100, 150, 0, false},
		{"confirms stop inside the call", at(100, 110), 100, 150, 40, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := HandoverUnavailable(c.confirms, time.Duration(c.from)*time.Millisecond, time.Duration(c.to)*time.Millisecond)
			if ok != c.ok || got != time.Duration(c.want)*time.Millisecond {
				t.Fatalf("got %v, %v; want %dms, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestRecordsMissed(t *testing.T) {
	c := func(stream uint32, offset, epoch uint64, doneMs int) Confirm {
		return Confirm{Stream: stream, Offset: offset, Epoch: epoch, Done: time.Duration(doneMs) * time.Millisecond}
	}
	// Stream 0: the killed owner confirmed offsets 0..9 at epoch 1; the
	// new owner 10..24 at epoch 2, 10..19 of them by the restart at 500ms.
	var s0 []Confirm
	for o := range uint64(10) {
		s0 = append(s0, c(0, o, 1, 10+int(o)))
	}
	for o := uint64(10); o < 25; o++ {
		s0 = append(s0, c(0, o, 2, 300+int(o-10)*30)) // 10..19 done by 570, 16 by 480
	}
	cases := []struct {
		name      string
		confirms  []Confirm
		epochs    map[int]uint64
		restartMs int
		want      int64
	}{
		{"the gap up to the restart", s0, map[int]uint64{0: 1}, 480, 7},
		{"nothing confirmed since the kill", s0[:10], map[int]uint64{0: 1}, 480, 0},
		{"a restart before the new owner confirmed", s0, map[int]uint64{0: 1}, 100, 0},
		{"streams the killed broker did not own are left out", append(slices.Clone(s0), c(1, 50, 1, 20)), map[int]uint64{0: 1}, 480, 7},
		{"summed over the streams it owned", append(slices.Clone(s0), c(1, 3, 4, 20), c(1, 8, 5, 400)), map[int]uint64{0: 1, 1: 4}, 480, 12},
	}
	for _, tc := range cases {
		if got := RecordsMissed(tc.confirms, tc.epochs, time.Duration(tc.restartMs)*time.Millisecond); got != tc.want {
			t.Errorf("%s: %d records missed, want %d", tc.name, got, tc.want)
		}
	}
}

func TestCounterGrowth(t *testing.T) {
	before := map[string]float64{"b2": 1000, "b3": 500, "b4": 0}
	after := map[string]float64{"b1": 300, "b2": 1400, "b3": 500, "b4": 0}
	total, on := CounterGrowth(before, after, "b1")
	if total != 700 || on != 300 {
		t.Errorf("growth %d, %d on b1; want 700 (b2 400, the restarted b1 300 from 0), 300", total, on)
	}
	if total, on := CounterGrowth(before, after, "b4"); total != 700 || on != 0 {
		t.Errorf("growth %d, %d on b4; want 700, 0", total, on)
	}
}

func TestSpareCopies(t *testing.T) {
	before := map[string][]string{"a": {"b1", "b2", "b3"}, "b": {"b2", "b3", "b4"}}
	for _, tc := range []struct {
		name  string
		after map[string][]string
		want  int
	}{
		{"the same members", before, 0},
		{"an owner moved among its members", map[string][]string{"a": {"b2", "b1", "b3"}, "b": {"b4", "b3", "b2"}}, 0},
		{"a missing copy replaced on the spare broker", map[string][]string{"a": {"b2", "b3", "b4"}, "b": {"b2", "b3", "b4"}}, 1},
		{"both streams grew a copy", map[string][]string{"a": {"b1", "b2", "b3", "b4"}, "b": {"b1", "b2", "b3", "b4"}}, 2},
	} {
		if got := SpareCopies(before, tc.after); got != tc.want {
			t.Errorf("%s: %d spare copies, want %d", tc.name, got, tc.want)
		}
	}
}

// TestRestartFields checks the restart's JSON fields: present with a
// restart, spare_copies and records_missed even at 0 (the figure the run
// is for), absent without one.
func TestRestartFields(t *testing.T) {
	decode := func(r Result) map[string]any {
		t.Helper()
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	fields := []string{"restart_after_s", "records_missed", "bytes_rereplicated", "bytes_returning_copy", "rejoin_caught_up_ms", "spare_copies"}
	plain := decode(Result{})
	for _, f := range fields {
		if v, ok := plain[f]; ok {
			t.Errorf("a run without a restart reports %s = %v", f, v)
		}
	}
	missed, rerep, returning, spare, caught := int64(0), int64(123456), int64(100000), 0, 42.5
	got := decode(Result{RestartAfterS: 3, RecordsMissed: &missed, BytesRereplicated: &rerep, BytesReturningCopy: &returning, SpareCopies: &spare, RejoinCaughtUpMs: &caught})
	want := map[string]float64{"restart_after_s": 3, "records_missed": 0, "bytes_rereplicated": 123456, "bytes_returning_copy": 100000, "rejoin_caught_up_ms": 42.5, "spare_copies": 0}
	for _, f := range fields {
		if v, ok := got[f].(float64); !ok || v != want[f] {
			t.Errorf("%s = %v, want %v", f, got[f], want[f])
		}
	}
}
