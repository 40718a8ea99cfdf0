package e2e

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandclient "github.com/strandhq/strand/client"
	strandv1 "github.com/strandhq/strand/internal/gen/strand/v1"
	"github.com/strandhq/strand/internal/gen/strand/v1/strandv1connect"
)

// ledger records what clients were told: the offset of every confirmed
// record (by its unique payload) and the records whose publish ended in an
// error, which may or may not be stored.
type ledger struct {
	mu        sync.Mutex
	confirmed map[string]uint64
	atOffset  map[uint64]string
	failed    map[string]error
	byEpoch   map[uint64]int
	firstAt   map[uint64]time.Time // first confirm at each epoch
	conflicts []string             // two payloads confirmed at one offset, or one at two
}

func newLedger() *ledger {
	return &ledger{
		confirmed: make(map[string]uint64),
		atOffset:  make(map[uint64]string),
		failed:    make(map[string]error),
		byEpoch:   make(map[uint64]int),
		firstAt:   make(map[uint64]time.Time),
	}
}

func (l *ledger) confirm(payload string, offset, epoch uint64) {
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

func (l *ledger) fail(payload string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.confirmed[payload]; !ok {
		l.failed[payload] = err
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.confirmed)
}

// atEpoch is how many records were confirmed with the given epoch.
func (l *ledger) atEpoch(epoch uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byEpoch[epoch]
}

func (l *ledger) firstConfirmAt(epoch uint64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstAt[epoch]
}

func (l *ledger) failures() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.failed)
}

// publisher publishes unique payloads continuously from several goroutines
// through the Go client, which merges them into batches and rides through
// failovers; every answer goes into the ledger.
type publisher struct {
	l      *ledger
	seq    atomic.Uint64
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   atomic.Int64
	last   atomic.Pointer[string]
}

func startPublishing(t *testing.T, cl *strandclient.Client, stream, prefix string, workers int, l *ledger) *publisher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{l: l, cancel: cancel}
	for range workers {
		p.wg.Go(func() {
			for ctx.Err() == nil {
				payload := fmt.Sprintf("%s-%08d", prefix, p.seq.Add(1))
				pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
				res, err := cl.Publish(pctx, stream, []*strandv1.Record{{Payload: []byte(payload)}})
				pcancel()
				if err != nil {
					l.fail(payload, err)
					p.errs.Add(1)
					msg := err.Error()
					p.last.Store(&msg)
					continue
				}
				l.confirm(payload, res.GetOffsets()[0], res.GetEpoch())
			}
		})
	}
	t.Cleanup(p.stop)
	return p
}

// stop cancels publishing and waits for the calls in flight; a cancelled
// call's record stays in the ledger as failed (unknown outcome).
func (p *publisher) stop() {
	p.cancel()
	p.wg.Wait()
}

func (p *publisher) lastError() string {
	if s := p.last.Load(); s != nil {
		return *s
	}
	return ""
}

// readAll reads a copy's confirmed records from offset 0 until until,
// waiting while its confirm watermark is below until.
func readAll(ctx context.Context, t *testing.T, what string, until uint64, read func(context.Context, uint64) (*strandv1.ReadResponse, error)) []*strandv1.StoredRecord {
	t.Helper()
	var recs []*strandv1.StoredRecord
	var from uint64
	waitFor(t, 60*time.Second, fmt.Sprintf("reading %s up to offset %d", what, until), func() (bool, string) {
		for from < until {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := read(rctx, from)
			cancel()
			if err != nil {
				return false, fmt.Sprintf("read from %d: %v", from, err)
			}
			if len(res.GetRecords()) == 0 {
				return false, fmt.Sprintf("no records at %d yet (confirm watermark %d)", from, res.GetConfirmWatermark())
			}
			for _, r := range res.GetRecords() {
				if r.GetOffset() != from {
					t.Fatalf("%s: record at offset %d where %d was next", what, r.GetOffset(), from)
				}
				recs = append(recs, r)
				from++
			}
		}
		return true, ""
	})
	return recs[:until]
}

// readThroughClient reads the stream from its owner with the Go client.
func readThroughClient(cl *strandclient.Client, stream string) func(context.Context, uint64) (*strandv1.ReadResponse, error) {
	return func(ctx context.Context, from uint64) (*strandv1.ReadResponse, error) {
		return cl.Read(ctx, &strandv1.ReadRequest{Stream: stream, FromOffset: from, MaxRecords: 1000})
	}
}

// readFromCopy reads one broker's copy directly: any copy serves reads below
// its own confirm watermark.
func readFromCopy(b strandv1connect.StreamServiceClient, stream string) func(context.Context, uint64) (*strandv1.ReadResponse, error) {
	return func(ctx context.Context, from uint64) (*strandv1.ReadResponse, error) {
		res, err := b.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: stream, FromOffset: from, MaxRecords: 1000}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
}

// verifyLedger checks the seed's promise against what clients were told:
// every confirmed record is in recs exactly once, at the offset its confirm
// named. It returns the number of confirmed records checked.
func verifyLedger(t *testing.T, l *ledger, recs []*strandv1.StoredRecord) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conflicts {
		t.Errorf("conflicting confirms: %s", c)
	}
	seen := make(map[string][]uint64, len(recs))
	stored := make(map[string][]*strandv1.StoredRecord, len(recs))
	for _, r := range recs {
		seen[string(r.GetPayload())] = append(seen[string(r.GetPayload())], r.GetOffset())
		stored[string(r.GetPayload())] = append(stored[string(r.GetPayload())], r)
	}
	// describe names where and how each copy of a payload was stored, to
	// tell a retry the broker failed to recognise from a client bug.
	describe := func(payload string) string {
		var parts []string
		for _, r := range stored[payload] {
			parts = append(parts, fmt.Sprintf("offset %d epoch %d producer %s seq %d", r.GetOffset(), r.GetEpoch(), r.GetProducerId(), r.GetSequence()))
		}
		return strings.Join(parts, "; ")
	}
	var lost, moved, dup, unconfirmedDup []string
	for payload, off := range l.confirmed {
		offs := seen[payload]
		switch {
		case len(offs) == 0:
			lost = append(lost, fmt.Sprintf("%s@%d", payload, off))
		case len(offs) > 1:
			dup = append(dup, fmt.Sprintf("%s confirmed at %d, stored at [%s]", payload, off, describe(payload)))
		case offs[0] != off:
			moved = append(moved, fmt.Sprintf("%s confirmed %d read %d", payload, off, offs[0]))
		}
	}
	for payload, offs := range seen {
		if _, ok := l.confirmed[payload]; !ok && len(offs) > 1 {
			unconfirmedDup = append(unconfirmedDup, fmt.Sprintf("%s stored at [%s]", payload, describe(payload)))
		}
	}
	report := func(what string, xs []string) {
		if len(xs) == 0 {
			return
		}
		sort.Strings(xs)
		if len(xs) > 20 {
			xs = append(xs[:20], fmt.Sprintf("… %d more", len(xs)-20))
		}
		t.Errorf("%s: %s", what, strings.Join(xs, ", "))
	}
	report("confirmed records lost", lost)
	report("confirmed records at a different offset", moved)
	report("confirmed records stored more than once", dup)
	report("unconfirmed records stored more than once (idempotent publish)", unconfirmedDup)
	return len(l.confirmed)
}

// maxConfirmed is one past the highest confirmed offset.
func (l *ledger) end() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var end uint64
	for off := range l.atOffset {
		end = max(end, off+1)
	}
	return end
}

// sameRecords checks two copies hold the same records at the same offsets.
func sameRecords(t *testing.T, aName string, a []*strandv1.StoredRecord, bName string, b []*strandv1.StoredRecord) {
	t.Helper()
	if len(a) != len(b) {
		t.Errorf("%s has %d records, %s has %d", aName, len(a), bName, len(b))
		return
	}
	bad := 0
	for i := range a {
		if string(a[i].GetPayload()) != string(b[i].GetPayload()) || a[i].GetChain() != b[i].GetChain() {
			if bad < 10 {
				t.Errorf("offset %d: %s has %q (chain %x), %s has %q (chain %x)", a[i].GetOffset(),
					aName, a[i].GetPayload(), a[i].GetChain(), bName, b[i].GetPayload(), b[i].GetChain())
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d offsets differ between %s and %s", bad, aName, bName)
	}
}

// isCode reports whether err carries a Connect code.
func isCode(err error, code connect.Code) bool {
	var cerr *connect.Error
	return errors.As(err, &cerr) && cerr.Code() == code
}
