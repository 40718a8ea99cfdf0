package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// idPrefix starts every bench payload: "bench-<id>-".
const idPrefix = "bench-"

// RecordPayload is the payload of record id: its id prefix, padded to size.
func RecordPayload(id uint64, size int) []byte {
	return Payload(idPrefix+strconv.FormatUint(id, 10)+"-", size)
}

// ParseID returns the record id a bench payload starts with.
func ParseID(payload []byte) (uint64, bool) {
	rest, ok := strings.CutPrefix(string(payload[:min(len(payload), 32)]), idPrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(digits, 10, 64)
	return id, err == nil
}

// Confirm is what one publish was told.
type Confirm struct {
	ID     uint64
	Offset uint64
	// Epoch is the epoch the confirm named (the owner's that stored it).
	Epoch uint64
	// Stream is the record's stream, an index into the bench's streams
	// (StreamNames); offsets are per stream.
	Stream uint32
	// Sent and Done are since the start of publishing.
	Sent, Done time.Duration
	// Duplicate is the broker saying an earlier attempt had stored it.
	Duplicate bool
	// Probe marks a probe record (Config.ProbeWorkers): sent after the
	// kill to a stream the killed broker owned, verified like the load's
	// records but left out of the load's rates and latencies.
	Probe bool
}

// Stored is one record read back from the stream.
type Stored struct {
	Offset uint64
	ID     uint64
	// Stream is the stream it was read from, as Confirm.Stream.
	Stream uint32
	// HasID is false for a record without a bench id.
	HasID bool
}

// Verdict is the check of the failover invariant (docs/protocol.md,
// "Invariants"): every confirmed
// record delivered at one offset, equal to its confirm.
type Verdict struct {
	Confirmed int
	// Lost counts confirmed records absent from the stream.
	Lost int
	// Duplicates counts extra copies: an id stored at n offsets adds n-1.
	Duplicates int
	// OffsetMismatches counts confirmed records stored, but not (only) at
	// the confirmed offset.
	OffsetMismatches int
	// UnconfirmedStored counts records whose publish failed (outcome
	// unknown) that are stored; allowed.
	UnconfirmedStored int
	// Foreign counts records without a bench id.
	Foreign int
	// Examples describe the first few problems.
	Examples []string
}

// OK reports whether nothing confirmed was lost, duplicated or moved.
//
// A run that confirmed nothing proved nothing and is not OK.
func (v Verdict) OK() bool {
	return v.Confirmed > 0 && v.Lost == 0 && v.Duplicates == 0 && v.OffsetMismatches == 0
}

const maxExamples = 5

// place is where a record is stored: which stream, which offset.
type place struct {
	stream uint32
	offset uint64
}

func (p place) String() string {
	if p.stream == 0 {
		return strconv.FormatUint(p.offset, 10)
	}
	return fmt.Sprintf("%d of stream %d", p.offset, p.stream)
}

// Verify checks the confirms against the records read back, from every
// stream: ids are unique across the bench's streams, so a record stored in
// another stream than its confirm named counts as moved.
func Verify(confirms []Confirm, stored []Stored) Verdict {
	v := Verdict{Confirmed: len(confirms)}
	at := make(map[uint64][]place, len(stored))
	for _, s := range stored {
		if !s.HasID {
			v.Foreign++
			continue
		}
		at[s.ID] = append(at[s.ID], place{s.Stream, s.Offset})
	}
	note := func(format string, args ...any) {
		if len(v.Examples) < maxExamples {
			v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
		}
	}
	confirmed := make(map[uint64]bool, len(confirms))
	for _, c := range confirms {
		confirmed[c.ID] = true
		offs, want := at[c.ID], place{c.Stream, c.Offset}
		switch {
		case len(offs) == 0:
			v.Lost++
			note("record %d confirmed at %v is missing", c.ID, want)
		case len(offs) > 1 || offs[0] != want:
			v.OffsetMismatches++
			note("record %d confirmed at %v is stored at %v", c.ID, want, offs)
		}
	}
	ids := make([]uint64, 0, len(at))
	for id := range at {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		offs := at[id]
		if len(offs) > 1 {
			v.Duplicates += len(offs) - 1
			note("record %d stored %d times, at %v", id, len(offs), offs)
		}
		if !confirmed[id] {
			v.UnconfirmedStored++
		}
	}
	return v
}

// Unavailable is the time from the kill to the first confirm of a publish
// sent after the kill; ok is false when none was confirmed.
func Unavailable(confirms []Confirm, killAt time.Duration) (time.Duration, bool) {
	best, ok := time.Duration(0), false
	for _, c := range confirms {
		if c.Sent >= killAt && (!ok || c.Done < best) {
			best, ok = c.Done, true
		}
	}
	if !ok {
		return 0, false
	}
	return best - killAt, true
}

// MaxGap is the longest time without a confirm between the first and the
// last confirm.
func MaxGap(confirms []Confirm) time.Duration {
	if len(confirms) < 2 {
		return 0
	}
	done := make([]time.Duration, len(confirms))
	for i, c := range confirms {
		done[i] = c.Done
	}
	slices.Sort(done)
	var gap time.Duration
	for i := 1; i < len(done); i++ {
		gap = max(gap, done[i]-done[i-1])
	}
	return gap
}

// Buckets counts confirms per width from 0 to span (the last bucket takes
// anything later).
func Buckets(confirms []Confirm, width, span time.Duration) []int {
	n := max(1, int((span+width-1)/width))
	out := make([]int, n)
	for _, c := range confirms {
		i := int(c.Done / width)
		out[min(max(i, 0), n-1)]++
	}
	return out
}

// Measured is the confirms of publishes sent at or after from (the end of
// the warm-up), in their order.
func Measured(confirms []Confirm, from time.Duration) []Confirm {
	if from <= 0 {
		return confirms
	}
	out := make([]Confirm, 0, len(confirms))
	for _, c := range confirms {
		if c.Sent >= from {
			out = append(out, c)
		}
	}
	return out
}

// Latencies returns Done-Sent per confirm.
func Latencies(confirms []Confirm) []time.Duration {
	out := make([]time.Duration, len(confirms))
	for i, c := range confirms {
		out[i] = c.Done - c.Sent
	}
	return out
}

// HandoverUnavailable is the longest stretch without a confirm that
// overlaps the handover, from its call's start (from) to its answer (to):
// the time publishers waited on the paused owner and the move. The stretch
// runs from the last confirm before it (or from) to the first after it (or
// to); ok is false when nothing was confirmed after from.
func HandoverUnavailable(confirms []Confirm, from, to time.Duration) (time.Duration, bool) {
	done := make([]time.Duration, 0, len(confirms))
	for _, c := range confirms {
		done = append(done, c.Done)
	}
	slices.Sort(done)
	prev, ok := from, false
	var gap time.Duration
	for _, d := range done {
		if d < from {
			prev = d
			continue
		}
		gap = max(gap, d-prev)
		ok = true
		if d > to {
			return gap, true
		}
		prev = d
	}
	if ok && prev < to {
		gap = max(gap, to-prev)
	}
	return gap, ok
}
