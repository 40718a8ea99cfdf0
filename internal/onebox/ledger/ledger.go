// Package ledger is the checker of the failover tests: it records what
// clients were told (the offset of every confirmed record, by its unique
// payload, and the publishes that ended in an error, whose records may or may
// not be stored) and proves against a read of the stream that nothing
// confirmed was lost or moved (docs/protocol.md,
// "Invariants"). It has no dependency on the services, so both the in-process
// cluster (internal/onebox) and the process tests of strandctl use it.
package ledger

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// Ledger is what clients were told. It is safe for concurrent use.
type Ledger struct {
	mu        sync.Mutex
	confirmed map[string]uint64
	atOffset  map[uint64]string
	failed    map[string]error
	byEpoch   map[uint64]int
	firstAt   map[uint64]time.Time
	conflicts []string // conflicting confirms and malformed answers
}

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{
		confirmed: make(map[string]uint64),
		atOffset:  make(map[uint64]string),
		failed:    make(map[string]error),
		byEpoch:   make(map[uint64]int),
		firstAt:   make(map[uint64]time.Time),
	}
}

// Confirm records that payload was confirmed at offset under epoch. Two
// payloads confirmed at one offset, or one payload at two offsets, is a
// conflict Verify reports.
func (l *Ledger) Confirm(payload string, offset, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.confirmed[payload]; ok && prev != offset {
		l.conflicts = append(l.conflicts, fmt.Sprintf("%s confirmed at %d and at %d", payload, prev, offset))
	}
	if other, ok := l.atOffset[offset]; ok && other != payload {
		l.conflicts = append(l.conflicts, fmt.Sprintf("offset %d confirmed for %s and for %s", offset, other, payload))
	}
	l.confirmed[payload] = offset
	l.atOffset[offset] = payload
	delete(l.failed, payload)
	if l.byEpoch[epoch] == 0 {
		l.firstAt[epoch] = time.Now()
	}
	l.byEpoch[epoch]++
}

// Fail records a publish of payload that ended in an error: the record may
// or may not be stored.
func (l *Ledger) Fail(payload string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.confirmed[payload]; !ok {
		l.failed[payload] = err
	}
}

// malformed records that the publish of payload was answered with n offsets
// for one record: the publish counts as failed, and Verify reports the
// answer.
func (l *Ledger) malformed(payload string, n int) {
	l.mu.Lock()
	l.conflicts = append(l.conflicts, fmt.Sprintf("the publish of %s was answered with %d offsets for one record", payload, n))
	l.mu.Unlock()
	l.Fail(payload, fmt.Errorf("answer with %d offsets for one record", n))
}

// Count is how many records were confirmed.
func (l *Ledger) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.confirmed)
}

// AtEpoch is how many records were confirmed under epoch.
func (l *Ledger) AtEpoch(epoch uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byEpoch[epoch]
}

// FirstAt is when the first record confirmed under epoch was confirmed (zero
// if none was).
func (l *Ledger) FirstAt(epoch uint64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstAt[epoch]
}

// Failures is how many publishes ended in an error and were not confirmed
// by a later answer.
func (l *Ledger) Failures() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.failed)
}

// End is one past the highest confirmed offset (0 when nothing was).
func (l *Ledger) End() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var end uint64
	for off := range l.atOffset {
		end = max(end, off+1)
	}
	return end
}

// Verify checks recs, a read of the whole stream from its head, against the
// ledger and returns every violation (empty when there is none):
//
//   - offsets are dense and each appears once;
//   - every confirmed record is present at its confirmed offset;
//   - a confirmed payload appears at no other offset (exactly once);
//   - no payload appears twice (a failed publish retried by the idempotent
//     client is stored at most once);
//   - no two confirms conflicted, and no publish of Start was answered
//     with other than one offset.
//
// A payload stored twice is described by the epoch, producer and sequence
// of each copy, to tell a retry the broker failed to recognise from a
// client bug. It also returns how many confirmed records it found.
func (l *Ledger) Verify(recs []*strandv1.StoredRecord) (found int, problems []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	problems = append(problems, l.conflicts...)
	seen := make(map[string]uint64, len(recs))
	first := make(map[string]*strandv1.StoredRecord, len(recs))
	for i, r := range recs {
		if i > 0 && r.GetOffset() != recs[i-1].GetOffset()+1 {
			problems = append(problems, fmt.Sprintf("offsets not dense: %d after %d", r.GetOffset(), recs[i-1].GetOffset()))
		}
		p := string(r.GetPayload())
		if prev, dup := first[p]; dup {
			problems = append(problems, fmt.Sprintf("payload %q stored at %s and at %s", p, describe(prev), describe(r)))
		} else {
			first[p] = r
		}
		seen[p] = r.GetOffset()
		if want, ok := l.confirmed[p]; ok && want != r.GetOffset() {
			problems = append(problems, fmt.Sprintf("payload %q confirmed at %d is stored at %d", p, want, r.GetOffset()))
		}
	}
	missing := 0
	offsets := make([]uint64, 0, len(l.confirmed))
	for p, off := range l.confirmed {
		if got, ok := seen[p]; ok && got == off {
			found++
			continue
		}
		missing++
		offsets = append(offsets, off)
	}
	if missing > 0 {
		sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
		problems = append(problems, fmt.Sprintf("%d confirmed records missing from their offsets, first at %v", missing, offsets[:min(10, len(offsets))]))
	}
	return found, problems
}

// describe names where and how a record was stored.
func describe(r *strandv1.StoredRecord) string {
	return fmt.Sprintf("offset %d (epoch %d producer %s seq %d)", r.GetOffset(), r.GetEpoch(), r.GetProducerId(), r.GetSequence())
}

// PublishFunc publishes one batch, as client.Client.Publish does.
type PublishFunc func(ctx context.Context, stream string, records []*strandv1.Record) (*strandv1.PublishResponse, error)

// Publisher publishes unique payloads continuously from several goroutines
// and records every answer in its ledger.
type Publisher struct {
	l      *Ledger
	seq    atomic.Uint64
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   atomic.Int64
	last   atomic.Pointer[string]
}

// Start publishes one record per call from workers goroutines until Stop.
// Each call is bounded by attempt; payloads are prefix-NNNNNNNN.
func Start(publish PublishFunc, stream, prefix string, workers int, attempt time.Duration, l *Ledger) *Publisher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{l: l, cancel: cancel}
	for range workers {
		p.wg.Go(func() {
			for ctx.Err() == nil {
				payload := fmt.Sprintf("%s-%08d", prefix, p.seq.Add(1))
				pctx, pcancel := context.WithTimeout(ctx, attempt)
				res, err := publish(pctx, stream, []*strandv1.Record{{Payload: []byte(payload)}})
				pcancel()
				if err != nil {
					l.Fail(payload, err)
					if ctx.Err() != nil {
						return // cut short by Stop, not a failed publish
					}
					p.errs.Add(1)
					msg := err.Error()
					p.last.Store(&msg)
					continue
				}
				if len(res.GetOffsets()) != 1 {
					l.malformed(payload, len(res.GetOffsets()))
					continue
				}
				l.Confirm(payload, res.GetOffsets()[0], res.GetEpoch())
			}
		})
	}
	return p
}

// Stop ends publishing and waits for the calls in flight.
func (p *Publisher) Stop() {
	p.cancel()
	p.wg.Wait()
}

// Errors is how many publishes failed (not counting those Stop cut short).
func (p *Publisher) Errors() int64 { return p.errs.Load() }

// LastError is the last publish error, for wait messages.
func (p *Publisher) LastError() string {
	if s := p.last.Load(); s != nil {
		return *s
	}
	return ""
}
