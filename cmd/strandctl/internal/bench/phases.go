package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

// The failover, from the owner kill to the first confirmed publish on the
// new owner, split into phases (docs/operating.md, "The cluster bench"):
//
//	kill ─detect─▶ recovery recorded ─seal─▶ seals decided ─commit─▶
//	assignment committed ─apply─▶ new owner promoted ─first_confirm─▶
//	first confirm of a publish sent after the kill
//
// The phases add up to unavailable_ms. Each instant comes from the best
// source there is: the recovery and assignment keys from an etcd watch the
// bench starts before the kill (receive times, no log parsing), the seal
// decision and the broker's promotion from the services' zerolog JSON logs.

// The log messages the bench reads, exactly as the services write them.
const (
	// MsgRecoveryRecorded is the controller's liveness loop recording a
	// pending recovery (services/controller/internal/liveness).
	MsgRecoveryRecorded = "owner lost; pending recovery recorded"
	// MsgSealRoundDone is the recoverer's decision after a round of seals
	// (services/recoverer/internal/worker, debug level).
	MsgSealRoundDone = "seal round done"
	// MsgRecoveryCommitted is the recoverer's guarded commit.
	MsgRecoveryCommitted = "recovery committed"
	// MsgOwnerPromoted is a broker starting as owner of an assignment
	// (services/broker/internal/replica).
	MsgOwnerPromoted = "owner at its own tails"
	// VerdictPromote is the seal round's verdict that leads to a commit.
	VerdictPromote = "promote"
)

// PhaseMessages are the messages ReadLogLines keeps for the phases.
var PhaseMessages = []string{MsgRecoveryRecorded, MsgSealRoundDone, MsgRecoveryCommitted, MsgOwnerPromoted}

// maxLogResolution is the coarsest log timestamp a phase is taken from:
// whole seconds would make the phases noise.
const maxLogResolution = 10 * time.Millisecond

// LogLine is what the bench reads from one zerolog JSON line.
type LogLine struct {
	Time time.Time
	// Resolution is the time field's precision: 1ms for
	// "2006-01-02T15:04:05.000Z07:00", 1s for plain RFC3339.
	Resolution time.Duration
	Level      string
	Message    string
	Stream     string
	Owner      string
	Node       string
	Verdict    string
	Epoch      uint64
	HasEpoch   bool
}

// ParseLogLine parses one zerolog JSON line; ok is false for anything else
// (the dev cluster's "---- start" lines, console-format logs, a torn line).
func ParseLogLine(b []byte) (LogLine, bool) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return LogLine{}, false
	}
	var raw struct {
		Time    json.RawMessage `json:"time"`
		Level   string          `json:"level"`
		Message string          `json:"message"`
		Stream  string          `json:"stream"`
		Owner   string          `json:"owner"`
		Node    string          `json:"node"`
		Verdict string          `json:"verdict"`
		Epoch   *uint64         `json:"epoch"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return LogLine{}, false
	}
	t, res, err := ParseLogTime(raw.Time)
	if err != nil {
		return LogLine{}, false
	}
	l := LogLine{Time: t, Resolution: res, Level: raw.Level, Message: raw.Message, Stream: raw.Stream,
		Owner: raw.Owner, Node: raw.Node, Verdict: raw.Verdict}
	if raw.Epoch != nil {
		l.Epoch, l.HasEpoch = *raw.Epoch, true
	}
	return l, true
}

// ParseLogTime parses zerolog's "time" field in the formats
// zerolog.TimeFieldFormat can give: an RFC 3339 string with or without a
// fraction (zerolog's default is whole seconds), or a Unix number in
// seconds, milliseconds, microseconds or nanoseconds (told apart by size).
// It returns the time and the field's resolution.
func ParseLogTime(raw json.RawMessage) (time.Time, time.Duration, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return time.Time{}, 0, errors.New("no time field")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return time.Time{}, 0, err
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, 0, err
		}
		return t, fractionResolution(s), nil
	}
	num := string(raw)
	if !strings.ContainsAny(num, ".eE") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return time.Time{}, 0, err
		}
		switch a := max(n, -n); {
		case a < 1e11: // seconds until the year 5138
			return time.Unix(n, 0), time.Second, nil
		case a < 1e14:
			return time.UnixMilli(n), time.Millisecond, nil
		case a < 1e17:
			return time.UnixMicro(n), time.Microsecond, nil
		default:
			return time.Unix(0, n), time.Nanosecond, nil
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return time.Time{}, 0, err
	}
	sec := int64(f)
	res := time.Second
	if _, frac, ok := strings.Cut(num, "."); ok {
		digits := len(frac)
		if i := strings.IndexAny(frac, "eE"); i >= 0 {
			digits = i
		}
		res = resolutionOfDigits(digits)
	}
	return time.Unix(sec, int64((f-float64(sec))*1e9)), res, nil
}

// fractionResolution is the precision of an RFC 3339 time string: the
// digits after the seconds' decimal point.
func fractionResolution(s string) time.Duration {
	// The fraction follows the seconds, which follow the 'T'.
	_, clock, ok := strings.Cut(s, "T")
	if !ok {
		return time.Second
	}
	_, frac, ok := strings.Cut(clock, ".")
	if !ok {
		return time.Second
	}
	digits := 0
	for digits < len(frac) && frac[digits] >= '0' && frac[digits] <= '9' {
		digits++
	}
	return resolutionOfDigits(digits)
}

func resolutionOfDigits(digits int) time.Duration {
	res := time.Second
	for range min(digits, 9) {
		res /= 10
	}
	return res
}

// ReadLogLines reads a service log and returns the JSON lines whose message
// is one of msgs (all lines when msgs is empty), in file order. Lines that
// are not zerolog JSON are skipped.
func ReadLogLines(r io.Reader, msgs []string) ([]LogLine, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []LogLine
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && wanted(line, msgs) {
			if l, ok := ParseLogLine(line); ok && (len(msgs) == 0 || contains(msgs, l.Message)) {
				out = append(out, l)
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// wanted is a cheap filter before the JSON decode: the line mentions one of
// msgs.
func wanted(line []byte, msgs []string) bool {
	if len(msgs) == 0 {
		return true
	}
	for _, m := range msgs {
		if bytes.Contains(line, []byte(m)) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// KeyEvent is one change of the stream's recovery or assignment key, as the
// bench's watch received it.
type KeyEvent struct {
	// At is when the bench received the event, since the start of
	// publishing.
	At  time.Duration
	Rev int64
	// Recovery is set for a put of the recovery key, Assignment for a put
	// of the assignment key; deletes carry neither.
	Recovery   *cluster.Recovery
	Assignment *cluster.Assignment
}

// FailoverInput is what the phases are found in.
type FailoverInput struct {
	// Start is the wall clock at the start of publishing: log times are
	// made relative to it.
	Start time.Time
	// Kill is when the signal was sent, since Start.
	Kill     time.Duration
	Stream   string
	OldOwner string
	// OldEpoch is the assignment's epoch when the owner was killed.
	OldEpoch uint64
	// Events are the watch's events in the order received; Watched says
	// whether the watch ran (else the logs stand in for it).
	Events  []KeyEvent
	Watched bool
	// Logs are the service logs' phase lines, by process name
	// ("controller", "recoverer", "broker-1", …).
	Logs map[string][]LogLine
	// Unavailable is kill → first confirm of a publish sent after the kill;
	// UnavailableOK is false when there was none.
	Unavailable   time.Duration
	UnavailableOK bool
}

// Instant is one phase boundary, since the start of publishing.
type Instant struct {
	At time.Duration
	OK bool
	// Source says where it was read: "etcd watch", "controller log", …
	Source string
}

// Failover is the phase boundaries found for one kill.
type Failover struct {
	Kill time.Duration
	// Recorded, Decided, Committed, Promoted and FirstConfirm end the
	// detect, seal, commit, apply and first_confirm phases.
	Recorded, Decided, Committed, Promoted, FirstConfirm Instant
	NewOwner                                             string
	NewEpoch                                             uint64
	Reason                                               string
	Notes                                                []string
}

// logProcesses names the service logs the phases are read from.
const (
	controllerLog = "controller"
	recovererLog  = "recoverer"
)

// FindFailover picks the phase boundaries of the failover that followed the
// kill: the first recovery recorded after it, the commit that moved the
// stream off the old owner, the promote decision before that commit and the
// new owner's promotion at the new epoch.
func FindFailover(in FailoverInput) Failover {
	f := Failover{Kill: in.Kill}
	note := func(format string, args ...any) { f.Notes = append(f.Notes, fmt.Sprintf(format, args...)) }
	rel := func(l LogLine) time.Duration { return l.Time.Sub(in.Start) }
	// A log time is truncated to its resolution: it may read up to one
	// unit before the instant it records.
	afterKill := func(l LogLine) bool { return rel(l)+l.Resolution > in.Kill }
	coarse := map[string]bool{}
	fromLog := func(proc string, l LogLine) Instant {
		if l.Resolution > maxLogResolution {
			if !coarse[proc] {
				coarse[proc] = true
				note("%s log timestamps have a resolution of %v: phases from it are not reported (zerolog.TimeFieldFormat needs milliseconds)", proc, l.Resolution)
			}
			return Instant{}
		}
		return Instant{At: rel(l), OK: true, Source: proc + " log"}
	}
	streamLines := func(proc, msg string) []LogLine {
		var out []LogLine
		for _, l := range in.Logs[proc] {
			if l.Message == msg && l.Stream == in.Stream && afterKill(l) {
				out = append(out, l)
			}
		}
		return out
	}

	// Detect: the recovery key put, else the controller's log line.
	for _, e := range in.Events {
		if e.At >= in.Kill && e.Recovery != nil {
			f.Recorded = Instant{At: e.At, OK: true, Source: "etcd watch"}
			f.Reason = e.Recovery.Reason
			break
		}
	}
	if !f.Recorded.OK {
		if in.Watched {
			note("the etcd watch saw no pending recovery after the kill")
		}
		if ls := streamLines(controllerLog, MsgRecoveryRecorded); len(ls) > 0 {
			f.Recorded = fromLog(controllerLog, ls[0])
		}
	}

	// Commit: the assignment put that moved the stream off the old owner,
	// else the recoverer's log line.
	for _, e := range in.Events {
		if a := e.Assignment; e.At >= in.Kill && a != nil && a.Owner != in.OldOwner && a.Epoch > in.OldEpoch {
			f.Committed = Instant{At: e.At, OK: true, Source: "etcd watch"}
			f.NewOwner, f.NewEpoch = a.Owner, a.Epoch
			break
		}
	}
	if !f.Committed.OK {
		if in.Watched {
			note("the etcd watch saw no assignment off %s after the kill", in.OldOwner)
		}
		for _, l := range streamLines(recovererLog, MsgRecoveryCommitted) {
			if l.HasEpoch && l.Epoch > in.OldEpoch && l.Owner != in.OldOwner {
				f.Committed = fromLog(recovererLog, l)
				f.NewOwner, f.NewEpoch = l.Owner, l.Epoch
				break
			}
		}
	}
	// Seal: the last promote decision at or before the commit (an earlier
	// one may have lost its commit and been read again), else the first.
	var decided *LogLine
	for _, l := range streamLines(recovererLog, MsgSealRoundDone) {
		if l.Verdict != VerdictPromote {
			continue
		}
		if f.Committed.OK && rel(l) > f.Committed.At+l.Resolution {
			break
		}
		decided = &l
		if !f.Committed.OK {
			break
		}
	}
	if decided != nil {
		f.Decided = fromLog(recovererLog, *decided)
	} else if len(in.Logs[recovererLog]) > 0 || f.Committed.OK {
		note("no %q line with verdict %q in the recoverer log (is it at --log-level debug?)", MsgSealRoundDone, VerdictPromote)
	}

	// Apply: the new owner's broker starting as owner at the new epoch.
	procs := []string{f.NewOwner}
	if f.NewOwner == "" {
		for p := range in.Logs {
			procs = append(procs, p)
		}
	}
	var promoted *LogLine
	promotedBy := ""
	for _, p := range procs {
		for _, l := range streamLines(p, MsgOwnerPromoted) {
			if !l.HasEpoch || l.Owner == in.OldOwner || (l.Node != "" && l.Node != l.Owner) {
				continue
			}
			if (f.NewEpoch != 0 && l.Epoch != f.NewEpoch) || l.Epoch <= in.OldEpoch {
				continue
			}
			if promoted == nil || l.Time.Before(promoted.Time) {
				promoted, promotedBy = &l, p
			}
			break
		}
	}
	if promoted != nil {
		f.Promoted = fromLog(promotedBy, *promoted)
		if f.NewOwner == "" {
			f.NewOwner, f.NewEpoch = promoted.Owner, promoted.Epoch
		}
	}

	if in.UnavailableOK {
		f.FirstConfirm = Instant{At: in.Kill + in.Unavailable, OK: true, Source: "confirms"}
	}
	return f
}

// Phases are the failover's phases in milliseconds; -1 is a phase whose end
// was not found.
type Phases struct {
	DetectMs       float64
	SealMs         float64
	CommitMs       float64
	ApplyMs        float64
	FirstConfirmMs float64
	Notes          []string
}

// phaseNames name the phases in order, as the JSON fields do.
var phaseNames = [5]string{"detect_ms", "seal_ms", "commit_ms", "apply_ms", "first_confirm_ms"}

// clockSlack is how far an instant may read before the previous one without
// a note: log times are truncated to the millisecond, watch times are
// receive times.
const clockSlack = 2 * time.Millisecond

// Phases computes each phase as its end minus the previous known boundary
// (the kill first), so the known phases add up to the kill → first confirm
// time. A boundary that reads before the previous one (sources with
// different clocks and resolutions) is moved up to it: that phase is 0. A
// boundary not found makes its phase -1, and the next phase counts from
// the last boundary found.
func (f Failover) Phases() Phases {
	ends := [5]Instant{f.Recorded, f.Decided, f.Committed, f.Promoted, f.FirstConfirm}
	var out [5]float64
	p := Phases{Notes: f.Notes}
	prev, prevName := f.Kill, "the kill"
	skipped := ""
	for i, end := range ends {
		if !end.OK {
			out[i] = -1
			if skipped == "" {
				skipped = phaseNames[i]
			}
			continue
		}
		at := end.At
		if at < prev {
			if prev-at > clockSlack {
				p.Notes = append(p.Notes, fmt.Sprintf("%s: its end (%s) reads %.2f ms before %s; counted as 0",
					phaseNames[i], end.Source, ms(prev-at), prevName))
			}
			at = prev
		}
		if skipped != "" {
			p.Notes = append(p.Notes, fmt.Sprintf("%s unknown: %s counts from %s", skipped, phaseNames[i], prevName))
			skipped = ""
		}
		out[i] = round(ms(at - prev))
		prev, prevName = at, strings.TrimSuffix(phaseNames[i], "_ms")+"'s end"
	}
	p.DetectMs, p.SealMs, p.CommitMs, p.ApplyMs, p.FirstConfirmMs = out[0], out[1], out[2], out[3], out[4]
	return p
}

// String is the human summary of the phases.
func (p Phases) String() string {
	var b strings.Builder
	for i, v := range []float64{p.DetectMs, p.SealMs, p.CommitMs, p.ApplyMs, p.FirstConfirmMs} {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strings.ReplaceAll(strings.TrimSuffix(phaseNames[i], "_ms"), "_", " "))
		if v < 0 {
			b.WriteString(" ?")
		} else {
			fmt.Fprintf(&b, " %.1f ms", v)
		}
	}
	return b.String()
}
