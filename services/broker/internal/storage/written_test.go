package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
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

// MayHaveLostWritten is true exactly when the last stop was unclean and
// the boot changed since (or cannot be told).
func TestMayHaveLostWritten(t *testing.T) {
	dir := t.TempDir()
	boot := filepath.Join(t.TempDir(), "boot_id")
	setBoot := func(id string) {
		if err := os.WriteFile(boot, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *DB {
		db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, BootIDPath: boot})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	// "Unclean" stops are played by closing and removing the clean mark,
	// which is what a crash leaves: the mark is only written by Close.
	unclean := func(db *DB) {
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(dir, cleanFile)); err != nil {
			t.Fatal(err)
		}
	}
	setBoot("boot-1")
	steps := []struct {
		name string
		stop func(*DB)
		boot string
		want bool
	}{
		{name: "clean stop, same boot", stop: func(db *DB) { _ = db.Close() }, boot: "boot-1", want: false},
		{name: "clean stop, new boot", stop: func(db *DB) { _ = db.Close() }, boot: "boot-2", want: false},
		{name: "unclean stop, same boot (a killed process)", stop: unclean, boot: "boot-2", want: false},
		{name: "unclean stop, new boot (a machine crash)", stop: unclean, boot: "boot-3", want: true},
		{name: "unclean stop, boot id unreadable", stop: unclean, boot: "", want: true},
	}
	db := open()
	if !db.MayHaveLostWritten() {
		t.Fatal("a store opened for the first time claims nothing can be missing")
	}
	for _, st := range steps {
		st.stop(db)
		if st.boot == "" {
			_ = os.Remove(boot)
		} else {
			setBoot(st.boot)
		}
		db = open()
		if got := db.MayHaveLostWritten(); got != st.want {
			t.Errorf("%s: MayHaveLostWritten = %v, want %v", st.name, got, st.want)
		}
	}
	_ = db.Close()

	// A failed write forgets the boot: even the same boot is unsure next.
	setBoot("boot-9")
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, BootIDPath: boot,
		WriteFault: func() error { return errors.New("injected: failed write") }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Open("failing"); err == nil {
		t.Fatal("a stream's first metadata write was taken by a failing disk")
	}
	// A store whose write failed leaves no clean mark on close.
	_ = db.Close()
	db = open()
	defer db.Close()
	if !db.MayHaveLostWritten() {
		t.Error("after a failed write the same boot is trusted")
	}
}
