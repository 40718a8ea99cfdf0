package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
)

// MayHaveLostWritten is true exactly when the last stop was unclean and
// the boot changed since (or cannot be told), and after a failed write
// even on the same boot (boot.go).
func TestMayHaveLostWritten(t *testing.T) {
	dir := t.TempDir()
	boot := filepath.Join(t.TempDir(), "boot_id")
	open := func(fault func() error) *Engine {
		t.Helper()
		e, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, BootIDPath: boot, WriteFault: fault})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Settle(); err != nil {
			t.Fatal(err)
		}
		return e
	}
	closeClean := func(e *Engine) {
		t.Helper()
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// "Unclean" stops are played by closing and removing the clean mark,
	// which is what a crash leaves: the mark is only written by Close.
	unclean := func(e *Engine) {
		t.Helper()
		closeClean(e)
		removeClean(t, dir)
	}
	writeBoot(t, boot, "boot-1")
	steps := []struct {
		name string
		stop func(*Engine)
		boot string
		want bool
	}{
		{name: "clean stop, same boot", stop: closeClean, boot: "boot-1", want: false},
		{name: "clean stop, new boot", stop: closeClean, boot: "boot-2", want: false},
		{name: "unclean stop, same boot (a killed process)", stop: unclean, boot: "boot-2", want: false},
		{name: "unclean stop, new boot (a machine crash)", stop: unclean, boot: "boot-3", want: true},
		{name: "unclean stop, boot id unreadable", stop: unclean, boot: "", want: true},
	}
	e := open(nil)
	if !e.Recovery().MayHaveLostWritten {
		t.Fatal("a store opened for the first time claims nothing can be missing")
	}
	for _, st := range steps {
		st.stop(e)
		if st.boot == "" {
			if err := os.Remove(boot); err != nil {
				t.Fatal(err)
			}
		} else {
			writeBoot(t, boot, st.boot)
		}
		e = open(nil)
		if got := e.Recovery().MayHaveLostWritten; got != st.want {
			t.Errorf("%s: MayHaveLostWritten = %v, want %v", st.name, got, st.want)
		}
	}
	closeClean(e)

	// A failed write forgets the boot: even the same boot is unsure next.
	writeBoot(t, boot, "boot-9")
	e = open(func() error { return errors.New("injected: failed write") })
	b := &Batch{}
	b.Set([]byte("k"), []byte("v"))
	if err := e.Do(context.Background(), b); err == nil {
		t.Fatal("a batch was taken by a failing disk")
	}
	// A store whose write failed leaves no clean mark on close.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(nil)
	defer e.Close()
	if !e.Recovery().MayHaveLostWritten {
		t.Error("after a failed write the same boot is trusted")
	}
}
