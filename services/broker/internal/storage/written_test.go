package storage

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Records are readable from the written view once Badger has them, while
// their fsync still runs, and only then from the durable view: that is
// what lets an owner's followers sync alongside it.
func TestWrittenAheadOfDurable(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	first := mustAppend(t, s, 1, recs("a", 3))

	inSync, release := holdNextSync(db)
	done := make(chan error, 1)
	go func() {
		_, err := s.Append(context.Background(), 1, recs("b", 4))
		done <- err
	}()
	select {
	case <-inSync:
	case <-time.After(10 * time.Second):
		t.Fatal("the append never reached its fsync")
	}
	written, chain := s.WrittenTail()
	if st := s.State(); written != 7 || st.RecordTail != 3 {
		t.Fatalf("during the fsync: written tail %d (want 7), durable tail %d (want 3)", written, st.RecordTail)
	}
	select {
	case <-s.WaitWritten(3):
	default:
		t.Fatal("WaitWritten(3) not closed while 7 records are written")
	}
	got, err := s.ReadWritten(3, 0, 0)
	if err != nil || len(got) != 4 || got[3].Chain != chain {
		t.Fatalf("ReadWritten(3) = %d records, %v; want 4 ending at chain %#x", len(got), err, chain)
	}
	if c, err := s.WrittenChainAt(7); err != nil || c != chain {
		t.Fatalf("WrittenChainAt(7) = %#x, %v; want %#x", c, err, chain)
	}
	if _, err := s.ChainAt(7); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("ChainAt(7) on the durable view = %v, want out of range", err)
	}
	if d, err := s.Read(0, 0, 0); err != nil || len(d) != 3 || d[2].Chain != first[2].Chain {
		t.Fatalf("durable Read = %d records, %v; want the 3 synced ones", len(d), err)
	}
	select {
	case err := <-done:
		t.Fatalf("append returned before its fsync: %v", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := s.State(); st.RecordTail != 7 || st.Chain != chain {
		t.Fatalf("after the fsync: %+v", st)
	}
}

// A cut brings the written view down with the durable one.
func TestWrittenTailFollowsCut(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	old, _ := failover(t, db, false)
	if err := old.Cut(context.Background(), 6, 2); err != nil {
		t.Fatal(err)
	}
	if w, c := old.WrittenTail(); w != 6 || c != old.State().Chain {
		t.Fatalf("written tail %d chain %#x after a cut to 6 (durable chain %#x)", w, c, old.State().Chain)
	}
}
