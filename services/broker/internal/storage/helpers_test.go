package storage

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

func openDB(t testing.TB, dir string) *DB {
	t.Helper()
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return db
}

func openStream(t testing.TB, db *DB, name string) *Stream {
	t.Helper()
	s, err := db.Open(name)
	if err != nil {
		t.Fatalf("db.Open(%q): %v", name, err)
	}
	return s
}

// ownerStream opens a stream and promotes it at epoch.
func ownerStream(t testing.TB, db *DB, name string, epoch uint64) *Stream {
	t.Helper()
	s := openStream(t, db, name)
	if err := s.AdvanceEpoch(context.Background(), epoch); err != nil {
		t.Fatalf("AdvanceEpoch(%d): %v", epoch, err)
	}
	return s
}

// recs returns n records of producer "p-"+prefix with sequences 1..n: a
// second call with the same prefix on the same stream is a retry of the
// first (idempotent publish), so tests that mean new records use a new
// prefix.
func recs(prefix string, n int) []Record {
	out := make([]Record, n)
	for i := range out {
		out[i] = Record{
			Payload:     []byte(fmt.Sprintf("%s-%d", prefix, i)),
			Headers:     map[string]string{"k": prefix, "i": fmt.Sprint(i)},
			ProducerID:  "p-" + prefix,
			Sequence:    uint64(i + 1),
			PublishTime: time.Unix(1_700_000_000+int64(i), 0),
		}
	}
	return out
}

// sizedRecs is recs with payloads of size zero bytes each.
func sizedRecs(prefix string, n, size int) []Record {
	rs := recs(prefix, n)
	for i := range rs {
		rs[i].Payload = make([]byte, size)
	}
	return rs
}

func mustAppend(t testing.TB, s *Stream, epoch uint64, rs []Record) []Record {
	t.Helper()
	out, err := s.Append(context.Background(), epoch, rs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return out
}

func mustRead(t testing.TB, s *Stream, from uint64, max int) []Record {
	t.Helper()
	out, err := s.Read(from, max, 0)
	if err != nil {
		t.Fatalf("Read(%d): %v", from, err)
	}
	return out
}

// sameRecords fails t unless got holds exactly want, in order, every stored
// field equal; what says what was read.
func sameRecords(t testing.TB, what string, got, want []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: read %d records, want %d", what, len(got), len(want))
	}
	for i := range got {
		if err := sameRecord(got[i], want[i]); err != nil {
			t.Fatalf("%s: record %d: %v", what, want[i].Offset, err)
		}
	}
}

// sameRecord compares every stored field.
func sameRecord(a, b Record) error {
	switch {
	case a.Offset != b.Offset:
		return fmt.Errorf("offset %d != %d", a.Offset, b.Offset)
	case a.Epoch != b.Epoch:
		return fmt.Errorf("record %d: epoch %d != %d", a.Offset, a.Epoch, b.Epoch)
	case string(a.Payload) != string(b.Payload):
		return fmt.Errorf("record %d: payload %q != %q", a.Offset, a.Payload, b.Payload)
	case !a.PublishTime.Equal(b.PublishTime):
		return fmt.Errorf("record %d: publish time %v != %v", a.Offset, a.PublishTime, b.PublishTime)
	case a.ProducerID != b.ProducerID || a.Sequence != b.Sequence:
		return fmt.Errorf("record %d: producer %s/%d != %s/%d", a.Offset, a.ProducerID, a.Sequence, b.ProducerID, b.Sequence)
	case a.Chain != b.Chain:
		return fmt.Errorf("record %d: chain %#x != %#x", a.Offset, a.Chain, b.Chain)
	case len(a.Headers) != len(b.Headers):
		return fmt.Errorf("record %d: headers %v != %v", a.Offset, a.Headers, b.Headers)
	}
	for k, v := range a.Headers {
		if w, ok := b.Headers[k]; !ok || w != v {
			return fmt.Errorf("record %d: headers %v != %v", a.Offset, a.Headers, b.Headers)
		}
	}
	return nil
}

// scanKeys calls fn for every key under prefix.
func (s *Stream) scanKeys(prefix []byte, fn func(k []byte)) error {
	return s.db.eng.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			fn(it.Item().KeyCopy(nil))
		}
		return nil
	})
}

// storedSegments returns the record segments stored for s, in key order:
// the key's last offset and the offsets of the records in it.
func (s *Stream) storedSegments() (lasts []uint64, offs [][]uint64, err error) {
	err = s.db.eng.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefix: s.recPrefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var in []uint64
			if err := it.Item().Value(func(seg []byte) error {
				return eachSegmentRecord(seg, func(enc []byte) (bool, error) {
					off, err := recordOffset(enc)
					in = append(in, off)
					return err == nil, err
				})
			}); err != nil {
				return err
			}
			lasts = append(lasts, keyOffset(it.Item().Key()))
			offs = append(offs, in)
		}
		return nil
	})
	return lasts, offs, err
}

// storedOffsets returns the offsets of every record stored for s, whether
// or not it is above the head.
func (s *Stream) storedOffsets(t testing.TB) []uint64 {
	t.Helper()
	_, offs, err := s.storedSegments()
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, o := range offs {
		out = append(out, o...)
	}
	return out
}

// awaitClosed waits up to 10 s for ch to be closed, naming what in the
// failure.
func awaitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
	}
}

// holdNextSync stops the committer at its next fsync, after the batch's
// Badger commit, until release is closed: inSync is closed once it is
// there. Fsyncs after that one run as usual.
func holdNextSync(db *DB) (inSync <-chan struct{}, release chan struct{}) {
	// The first sync holds whether or not the test is already waiting on
	// inSync: a send that gave up when nobody was receiving yet let the
	// sync through unheld, and the test then timed out waiting for it.
	reached := make(chan struct{})
	release = make(chan struct{})
	var held atomic.Bool
	db.hooks.BeforeSync = func() {
		if held.CompareAndSwap(false, true) {
			close(reached)
			<-release
		}
	}
	return reached, release
}

// cursorState is every cursor of s as Cursor reads it.
func cursorState(s *Stream) map[string]uint64 {
	s.assigned.mu.Lock()
	names := slices.Collect(maps.Keys(s.assigned.cursors))
	s.assigned.mu.Unlock()
	out := make(map[string]uint64, len(names))
	for _, n := range names {
		out[n], _ = s.Cursor(n)
	}
	return out
}
