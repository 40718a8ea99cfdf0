package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// keys lists the keys under prefix, in the iterator's order.
func keys(t *testing.T, e *Engine, opts IterOptions, seek []byte) []string {
	t.Helper()
	var out []string
	err := e.View(func(txn *Txn) error {
		it := txn.NewIterator(opts)
		defer it.Close()
		if seek == nil {
			it.Rewind()
		} else {
			it.Seek(seek)
		}
		for ; it.Valid(); it.Next() {
			out = append(out, string(it.Item().Key()))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Batches are durable when Do returns, read back by key, by prefix in both
// directions and after a reopen; deletes and range deletes remove what
// they name and nothing else.
func TestBatchesReadBackAndSurviveAReopen(t *testing.T) {
	dir := t.TempDir()
	e := openEngine(t, dir, Options{})
	ctx := context.Background()
	large := bytes.Repeat([]byte("v"), 4096) // in the value log
	b := &Batch{}
	for i := range 10 {
		b.Set(fmt.Appendf(nil, "a%02d", i), []byte(fmt.Sprint("small", i)))
	}
	b.Set([]byte("b1"), large)
	b.Set([]byte("b2"), []byte("gone soon"))
	if b.Len() != 12 {
		t.Fatalf("Len = %d, want 12", b.Len())
	}
	if err := e.Do(ctx, b); err != nil {
		t.Fatal(err)
	}
	d := &Batch{}
	d.Delete([]byte("b2"))
	if err := e.Do(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := e.DeleteRange(ctx, []byte("a"), []byte("a03"), []byte("a07")); err != nil {
		t.Fatal(err)
	}
	check := func(e *Engine) {
		t.Helper()
		want := []string{"a00", "a01", "a02", "a07", "a08", "a09"}
		if got := keys(t, e, IterOptions{Prefix: []byte("a")}, nil); !slices.Equal(got, want) {
			t.Fatalf("keys under a: %v, want %v", got, want)
		}
		if got := keys(t, e, IterOptions{Prefix: []byte("a"), Reverse: true}, []byte("a05")); !slices.Equal(got, []string{"a02", "a01", "a00"}) {
			t.Fatalf("keys under a from a05 down: %v", got)
		}
		if got := keys(t, e, IterOptions{Prefix: []byte("a"), Prefetch: 4}, []byte("a08")); !slices.Equal(got, []string{"a08", "a09"}) {
			t.Fatalf("keys under a from a08, prefetching: %v", got)
		}
		checkValues(t, e, "values", map[string][]byte{"a00": []byte("small0"), "b1": large})
		err := e.View(func(txn *Txn) error {
			_, err := txn.Get([]byte("b2"))
			return err
		})
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get of a deleted key: %v, want ErrNotFound", err)
		}
	}
	check(e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	b = &Batch{}
	b.Set([]byte("late"), nil)
	if err := e.Enqueue(ctx, b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after Close: %v, want ErrClosed", err)
	}
	e = openEngine(t, dir, Options{})
	defer e.Close()
	if e.Recovery().MayHaveLostWritten {
		t.Error("a store closed cleanly claims written data may be lost")
	}
	check(e)
}

// The committer reports each batch of a group in queue order, written
// before durable, and writes what OnGroup returns with the group: the
// entry is there once the group's batches are durable.
func TestGroupCallbacks(t *testing.T) {
	var (
		mu     sync.Mutex
		events []string
	)
	note := func(s string) {
		mu.Lock()
		events = append(events, s)
		mu.Unlock()
	}
	e := openEngine(t, t.TempDir(), Options{
		OnGroup: func(group []*Batch) []Entry {
			var n []byte
			for _, b := range group {
				n = append(n, b.Tag.(string)...)
			}
			return []Entry{{Key: []byte("group"), Value: n}}
		},
		OnWritten: func(b *Batch) { note("written " + b.Tag.(string)) },
		OnDone: func(b *Batch, err error) {
			if err != nil {
				t.Error(err)
			}
			note("done " + b.Tag.(string))
		},
	})
	defer e.Close()
	// The first batch is held at its fsync, so the next two queue and go
	// in one group. The last is enqueued only once the committer took
	// that group (it reached its fsync): enqueued as soon as the first
	// group was done, it could join the second before the committer took
	// it.
	inSync := []chan struct{}{make(chan struct{}), make(chan struct{})}
	release := []chan struct{}{make(chan struct{}), make(chan struct{})}
	var syncs atomic.Int32
	e.hooks.BeforeSync = func() {
		if n := syncs.Add(1) - 1; n < 2 {
			close(inSync[n])
			<-release[n]
		}
	}
	first := &Batch{Tag: "1"}
	first.Set([]byte("k1"), []byte("1"))
	done1 := make(chan error, 1)
	go func() { done1 <- e.Do(context.Background(), first) }()
	<-inSync[0]
	second, third := &Batch{Tag: "2"}, &Batch{Tag: "3"}
	second.Set([]byte("k2"), []byte("2"))
	third.Set([]byte("k3"), []byte("3"))
	if err := e.Enqueue(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	if err := e.Enqueue(context.Background(), third); err != nil {
		t.Fatal(err)
	}
	close(release[0])
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	// A batch behind the group (the committer took the group before its
	// fsync): once it is durable, so is the group.
	<-inSync[1]
	close(release[1])
	last := &Batch{Tag: "4"}
	if err := e.Do(context.Background(), last); err != nil {
		t.Fatal(err)
	}
	want := []string{"written 1", "done 1", "written 2", "written 3", "done 2", "done 3", "written 4", "done 4"}
	mu.Lock()
	got := slices.Clone(events)
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("callbacks %v, want %v", got, want)
	}
	checkValues(t, e, "after the groups", map[string][]byte{"k1": []byte("1"), "k2": []byte("2"), "k3": []byte("3"), "group": []byte("4")})
}

// The value log GC keeps the committer out from its rewrite until the
// rewrite is durable (vlog.go): a batch committed in between would sit
// unsynced in a memtable the rewrite rotates out.
func TestValueLogGCKeepsTheCommitterOut(t *testing.T) {
	dir := t.TempDir()
	e := openEngine(t, dir, Options{})
	if err := e.RunValueLogGC(); !errors.Is(err, ErrNoRewrite) {
		t.Fatalf("a GC before any garbage: %v, want ErrNoRewrite", err)
	}
	want := liveGarbage(t, e)
	hooked := false
	e.hooks.AfterGCRewrite = func() {
		hooked = true
		if e.writeMu.TryLock() {
			e.writeMu.Unlock()
			t.Error("the GC rewrote a file without keeping the committer out")
		}
	}
	if err := e.RunValueLogGC(); err != nil {
		_ = e.Close()
		t.Fatalf("value log GC: %v", err)
	}
	if !hooked {
		t.Fatal("the GC rewrote nothing")
	}
	checkValues(t, e, "after the GC", want)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, dir, Options{})
	defer e.Close()
	checkValues(t, e, "after the GC and a reopen", want)
}
