package bench

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

func TestParseLogTime(t *testing.T) {
	utc := func(ns int) time.Time { return time.Date(2026, 11, 30, 1, 33, 27, ns, time.UTC) }
	for _, c := range []struct {
		raw  string
		want time.Time
		res  time.Duration
	}{
		// internal/logging: milliseconds.
		{`"2026-11-30T01:33:27.651Z"`, utc(651e6), time.Millisecond},
		// zerolog's default (time.RFC3339): whole seconds.
		{`"2026-11-30T01:33:27Z"`, utc(0), time.Second},
		{`"2026-11-30T02:33:27+01:00"`, utc(0), time.Second},
		{`"2026-11-30T02:33:27.651+01:00"`, utc(651e6), time.Millisecond},
		// time.RFC3339Nano drops trailing zeros: the digits there tell.
		{`"2026-11-30T01:33:27.65Z"`, utc(650e6), 10 * time.Millisecond},
		{`"2026-11-30T01:33:27.123456789Z"`, utc(123456789), time.Nanosecond},
		// zerolog.TimeFormatUnix, UnixMs, UnixMicro, UnixNano.
		{`1796002407`, utc(0), time.Second},
		{`1796002407651`, utc(651e6), time.Millisecond},
		{`1796002407651123`, utc(651123e3), time.Microsecond},
		{`1796002407651123456`, utc(651123456), time.Nanosecond},
		{`1796002407.5`, utc(5e8), 100 * time.Millisecond},
	} {
		got, res, err := ParseLogTime(json.RawMessage(c.raw))
		if err != nil {
			t.Errorf("%s: %v", c.raw, err)
			continue
		}
		if d := got.Sub(c.want); d < -time.Microsecond || d > time.Microsecond || res != c.res {
			t.Errorf("%s: %v (resolution %v), want %v (resolution %v)", c.raw, got.UTC(), res, c.want, c.res)
		}
	}
	for _, bad := range []string{``, `"yesterday"`, `"2026-11-30 01:33:27"`, `true`, `"`} {
		if _, _, err := ParseLogTime(json.RawMessage(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// Lines as the services write them (copied from a dev cluster's logs).
const (
	lineRecorded  = `{"level":"info","service":"controller","name":"controller","stream":"durable","epoch":1,"fence_epoch":2,"transition_id":"bff0","owner":"broker-1","proposed_owner":"broker-2","added_members":[],"reason":"owner broker-1 lost: suspected by broker-3 and failed the controller's probe","time":"2026-11-30T01:33:27.651Z","message":"owner lost; pending recovery recorded"}`
	lineSealing   = `{"level":"info","service":"recoverer","name":"recoverer","stream":"durable","fence_epoch":2,"transition_id":"bff0","epoch":1,"owner":"broker-1","followers":["broker-2","broker-3"],"proposed_owner":"broker-2","policy":"majority_durable","r":2,"reason":"x","time":"2026-11-30T01:33:27.652Z","message":"recovering stream: sealing every copy of the old assignment"}`
	lineSealed    = `{"level":"debug","service":"recoverer","name":"recoverer","stream":"durable","fence_epoch":2,"transition_id":"bff0","verdict":"promote","r":2,"sealed":["broker-2","broker-3"],"missing":["broker-1"],"seal_errors":{"broker-1":"unavailable"},"pick":"broker-2","pick_record_tail":48211,"time":"2026-11-30T01:33:27.659Z","message":"seal round done"}`
	lineCommitted = `{"level":"info","service":"recoverer","name":"recoverer","stream":"durable","fence_epoch":2,"transition_id":"bff0","epoch":2,"owner":"broker-2","followers":["broker-3"],"policy":"majority_durable","record_tail":48211,"cursor_event_tail":0,"missing":["broker-1"],"time":"2026-11-30T01:33:27.662Z","message":"recovery committed"}`
	linePromoted  = `{"level":"info","service":"broker","node":"broker-2","stream":"durable","epoch":2,"owner":"broker-2","record_tail":48211,"cursor_event_tail":0,"w":2,"time":"2026-11-30T01:33:27.678Z","message":"owner at its own tails"}`
)

func TestParseLogLine(t *testing.T) {
	l, ok := ParseLogLine([]byte(lineSealed + "\n"))
	if !ok {
		t.Fatal("seal round line not parsed")
	}
	want := LogLine{Time: time.Date(2026, 11, 30, 1, 33, 27, 659e6, time.UTC), Resolution: time.Millisecond, Level: "debug",
		Message: MsgSealRoundDone, Stream: "durable", Verdict: VerdictPromote}
	if !l.Time.Equal(want.Time) {
		t.Fatalf("time %v, want %v", l.Time, want.Time)
	}
	l.Time = want.Time
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("%+v\nwant %+v", l, want)
	}
	l, ok = ParseLogLine([]byte(linePromoted))
	if !ok || l.Message != MsgOwnerPromoted || !l.HasEpoch || l.Epoch != 2 || l.Owner != "broker-2" || l.Node != "broker-2" {
		t.Fatalf("promoted line: %+v, %v", l, ok)
	}
	for _, bad := range []string{
		"---- 2026-11-30T01:33:17.895613919Z: /work/main/bin/strand-recoverer [--name recoverer]",
		"1:33AM INF owner at its own tails stream=durable", // STRAND_LOG_FORMAT=console
		`{"level":"info","message":"no time"}`,
		`{"level":"info","time":"2026-11-30T01:33:27.678Z","message":"torn`,
		"",
	} {
		if _, ok := ParseLogLine([]byte(bad)); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestReadLogLines(t *testing.T) {
	long := `{"level":"info","time":"2026-11-30T01:33:27.600Z","stream":"durable","blob":"` + strings.Repeat("x", 200<<10) + `","message":"seal round done"}`
	log := strings.Join([]string{
		"---- 2026-11-30T01:33:17.8Z: strand-recoverer [--log-level debug]",
		lineSealing,
		long,
		lineSealed,
		"not json mentioning recovery committed",
		lineCommitted, // no newline at the end: the file may be cut there
	}, "\n")
	got, err := ReadLogLines(strings.NewReader(log), PhaseMessages)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, l := range got {
		msgs = append(msgs, l.Message)
	}
	if want := []string{MsgSealRoundDone, MsgSealRoundDone, MsgRecoveryCommitted}; !reflect.DeepEqual(msgs, want) {
		t.Fatalf("messages %q, want %q", msgs, want)
	}
	all, _ := ReadLogLines(strings.NewReader(log), nil)
	if len(all) != 4 {
		t.Fatalf("without a filter: %d lines, want the 4 JSON lines", len(all))
	}
}

// failoverCase builds a failover from a kill at 5 s: each log line's time is
// given in ms since the start of publishing.
type failoverCase struct {
	start time.Time
	in    FailoverInput
}

func newFailoverCase() *failoverCase {
	start := time.Date(2026, 11, 30, 1, 33, 22, 0, time.UTC)
	return &failoverCase{start: start, in: FailoverInput{
		Start: start, Kill: 5000 * time.Millisecond, Stream: "durable", OldOwner: "broker-1", OldEpoch: 1,
		Logs: map[string][]LogLine{}, Unavailable: 120 * time.Millisecond, UnavailableOK: true,
	}}
}

func (c *failoverCase) log(proc string, atMs float64, l LogLine) {
	l.Time = c.start.Add(time.Duration(atMs * float64(time.Millisecond)))
	if l.Resolution == 0 {
		l.Resolution = time.Millisecond
	}
	if l.Stream == "" {
		l.Stream = "durable"
	}
	c.in.Logs[proc] = append(c.in.Logs[proc], l)
}

func (c *failoverCase) recovery(atMs float64) {
	c.in.Watched = true
	c.in.Events = append(c.in.Events, KeyEvent{At: time.Duration(atMs * float64(time.Millisecond)),
		Recovery: &cluster.Recovery{Stream: "durable", FromEpoch: 1, FenceEpoch: 2, OldOwner: "broker-1", Reason: "owner broker-1 lost"}})
}

func (c *failoverCase) assignment(atMs float64, epoch uint64, owner string) {
	c.in.Watched = true
	c.in.Events = append(c.in.Events, KeyEvent{At: time.Duration(atMs * float64(time.Millisecond)),
		Assignment: &cluster.Assignment{Stream: "durable", Epoch: epoch, Owner: owner}})
}

func sealed(verdict string) LogLine {
	return LogLine{Message: MsgSealRoundDone, Verdict: verdict}
}

func promoted(node string, epoch uint64) LogLine {
	return LogLine{Message: MsgOwnerPromoted, Node: node, Owner: node, Epoch: epoch, HasEpoch: true}
}

func committed(owner string, epoch uint64) LogLine {
	return LogLine{Message: MsgRecoveryCommitted, Owner: owner, Epoch: epoch, HasEpoch: true}
}

func phaseList(p Phases) []float64 {
	return []float64{p.DetectMs, p.SealMs, p.CommitMs, p.ApplyMs, p.FirstConfirmMs}
}

func TestFindFailoverAndPhases(t *testing.T) {
	for _, tc := range []struct {
		name      string
		build     func(c *failoverCase)
		want      []float64
		owner     string
		epoch     uint64
		noteParts []string
	}{
		{
			name: "eager failover: watch for detect and commit, logs for seal and apply",
			build: func(c *failoverCase) {
				// Before the kill: the stream's creation, its first owner.
				c.log("broker-1", 1000, promoted("broker-1", 1))
				c.recovery(5015.3)
				c.log("recoverer", 5016, sealed("fewer than R copies answered"))
				c.log("recoverer", 5022, sealed(VerdictPromote))
				c.log("recoverer", 5022, LogLine{Message: MsgSealRoundDone, Verdict: VerdictPromote, Stream: "other"})
				c.log("recoverer", 5027, committed("broker-2", 2))
				c.assignment(5027.8, 2, "broker-2")
				c.assignment(5030, 2, "broker-2") // followers added on the fast path
				c.log("broker-3", 5031, LogLine{Message: "following the owner", Node: "broker-3", Owner: "broker-2", Epoch: 2, HasEpoch: true})
				c.log("broker-2", 5035, promoted("broker-2", 2))
				c.log("broker-2", 5090, promoted("broker-2", 3)) // a later change
			},
			want:  []float64{15.3, 6.7, 5.8, 7.2, 85},
			owner: "broker-2", epoch: 2,
		},
		{
			name: "a promote whose commit lost: the last promote before the commit counts",
			build: func(c *failoverCase) {
				c.recovery(5010)
				c.log("recoverer", 5020, sealed(VerdictPromote))
				c.log("recoverer", 5040, sealed(VerdictPromote))
				c.assignment(5045, 2, "broker-3")
				c.log("recoverer", 5300, sealed(VerdictPromote)) // a later recovery
				c.log("broker-3", 5050, promoted("broker-3", 2))
			},
			want:  []float64{10, 30, 5, 5, 70},
			owner: "broker-3", epoch: 2,
		},
		{
			name: "no watch: the controller's and recoverer's logs stand in",
			build: func(c *failoverCase) {
				c.log("controller", 4000, LogLine{Message: MsgRecoveryRecorded, Stream: "durable"}) // an earlier failover
				c.log("controller", 5012, LogLine{Message: MsgRecoveryRecorded})
				c.log("recoverer", 5020, sealed(VerdictPromote))
				c.log("recoverer", 5024, committed("broker-2", 2))
				c.log("broker-2", 5030, promoted("broker-2", 2))
			},
			want:  []float64{12, 8, 4, 6, 90},
			owner: "broker-2", epoch: 2,
		},
		{
			name: "truncated log times read before the watch: clamped to 0",
			build: func(c *failoverCase) {
				c.recovery(5010.6)
				c.log("recoverer", 5010, sealed(VerdictPromote))
				c.assignment(5012, 2, "broker-2")
				c.log("broker-2", 5011, promoted("broker-2", 2))
			},
			want:  []float64{10.6, 0, 1.4, 0, 108},
			owner: "broker-2", epoch: 2,
		},
		{
			name: "a boundary well before the previous one is noted",
			build: func(c *failoverCase) {
				c.recovery(5050)
				c.log("recoverer", 5040, sealed(VerdictPromote))
				c.assignment(5060, 2, "broker-2")
				c.log("broker-2", 5070, promoted("broker-2", 2))
			},
			want:  []float64{50, 0, 10, 10, 50},
			owner: "broker-2", epoch: 2, noteParts: []string{"seal_ms: its end (recoverer log) reads 10.00 ms before detect's end"},
		},
		{
			name: "recoverer not at debug: seal unknown, commit counts from detect",
			build: func(c *failoverCase) {
				c.recovery(5010)
				c.log("recoverer", 5020, committed("broker-2", 2))
				c.assignment(5021, 2, "broker-2")
				c.log("broker-2", 5030, promoted("broker-2", 2))
			},
			want:  []float64{10, -1, 11, 9, 90},
			owner: "broker-2", epoch: 2,
			noteParts: []string{`no "seal round done" line`, "seal_ms unknown: commit_ms counts from detect's end"},
		},
		{
			name: "whole-second log times: the log phases are not reported",
			build: func(c *failoverCase) {
				c.recovery(5010)
				c.log("recoverer", 5000, LogLine{Message: MsgSealRoundDone, Verdict: VerdictPromote, Resolution: time.Second})
				c.assignment(5021, 2, "broker-2")
				c.log("broker-2", 5000, LogLine{Message: MsgOwnerPromoted, Node: "broker-2", Owner: "broker-2", Epoch: 2, HasEpoch: true, Resolution: time.Second})
			},
			want:  []float64{10, -1, 11, -1, 99},
			owner: "broker-2", epoch: 2,
			noteParts: []string{"recoverer log timestamps have a resolution of 1s", "broker-2 log timestamps have a resolution of 1s"},
		},
		{
			name: "no confirm after the kill and no new owner: only detect",
			build: func(c *failoverCase) {
				c.in.UnavailableOK = false
				c.recovery(5100)
				c.log("recoverer", 5110, sealed("fewer than R copies answered"))
			},
			want:      []float64{100, -1, -1, -1, -1},
			noteParts: []string{"the etcd watch saw no assignment off broker-1"},
		},
		{
			name: "commit unknown: the new owner from the broker's line",
			build: func(c *failoverCase) {
				c.recovery(5010)
				c.in.Events = append(c.in.Events, KeyEvent{At: 5012 * time.Millisecond}) // a delete
				c.log("recoverer", 5020, sealed(VerdictPromote))
				c.log("broker-3", 5040, promoted("broker-3", 2))
			},
			want:  []float64{10, 10, -1, 20, 80},
			owner: "broker-3", epoch: 2,
			noteParts: []string{"commit_ms unknown: apply_ms counts from seal's end"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFailoverCase()
			tc.build(c)
			f := FindFailover(c.in)
			p := f.Phases()
			got := phaseList(p)
			for i := range got {
				if d := got[i] - tc.want[i]; d > 0.011 || d < -0.011 {
					t.Fatalf("phases %v, want %v (notes %q)", got, tc.want, p.Notes)
				}
			}
			if f.NewOwner != tc.owner || f.NewEpoch != tc.epoch {
				t.Errorf("new owner %q at %d, want %q at %d", f.NewOwner, f.NewEpoch, tc.owner, tc.epoch)
			}
			notes := strings.Join(p.Notes, "\n")
			for _, part := range tc.noteParts {
				if !strings.Contains(notes, part) {
					t.Errorf("notes %q lack %q", p.Notes, part)
				}
			}
			if len(tc.noteParts) == 0 && len(p.Notes) > 0 {
				t.Errorf("unexpected notes %q", p.Notes)
			}
			// The phases found add up to kill → first confirm.
			if c.in.UnavailableOK && p.FirstConfirmMs >= 0 {
				sum := 0.0
				for _, v := range got {
					sum += max(v, 0)
				}
				if d := sum - ms(c.in.Unavailable); d > 0.05 || d < -0.05 {
					t.Errorf("phases add up to %.2f ms, unavailable is %.2f ms", sum, ms(c.in.Unavailable))
				}
			}
		})
	}
}

func TestFailoverReason(t *testing.T) {
	c := newFailoverCase()
	c.recovery(4000) // before the kill: not this failover's
	c.in.Events[0].Recovery.Reason = "an operator's failover"
	c.recovery(5010)
	if f := FindFailover(c.in); f.Reason != "owner broker-1 lost" || f.Recorded.At != 5010*time.Millisecond || f.Recorded.Source != "etcd watch" {
		t.Fatalf("%+v", f)
	}
}

func TestPhasesString(t *testing.T) {
	p := Phases{DetectMs: 15.32, SealMs: -1, CommitMs: 5, ApplyMs: 7.04, FirstConfirmMs: 71.43}
	want := "detect 15.3 ms, seal ?, commit 5.0 ms, apply 7.0 ms, first confirm 71.4 ms"
	if got := fmt.Sprint(p); got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
