package worker

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
)

// A task's wakes name revisions: its next read is at or past the newest
// (linearizable when a wake named none, or none came), and a task that
// found nothing left to do reads again only for a wake past what it read
// or committed. The watch brings back the delete of the recovery key by
// the task's own commit after every commit: that wake must not cost a
// second read of the stream.
func TestTaskWakesByRevision(t *testing.T) {
	schema := cluster.NewSchema("/strand")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tm := &term{w: &Worker{cfg: Config{Schema: schema, Logger: zerolog.Nop()}}, ctx: ctx, tasks: map[string]*task{}, committed: map[string]int64{}}
	key := schema.RecoveryKey("orders")
	// fresh is a task as ensure starts it, past any commit awaited.
	fresh := func(rev int64) *task {
		delete(tm.committed, "orders")
		k := &task{stream: "orders", kick: make(chan struct{}, 1), wakeRev: rev}
		tm.tasks["orders"] = k
		return k
	}

	// A task started by a watch event reads at or past its revision, once.
	k := fresh(40)
	if got := tm.takeWake(k); got != 40 {
		t.Fatalf("first read at or past %d, want 40", got)
	}
	if got := tm.takeWake(k); got != 0 {
		t.Fatalf("a read with no wake since at or past %d, want 0 (linearizable)", got)
	}

	// It committed at 45; the watch then brings the delete at 45, and an
	// older event the watch was still delivering.
	tm.ensure(key, 45)
	tm.ensure(key, 41)
	if !tm.finish(k, 45, true) {
		t.Fatal("the task read again for its own commit's delete")
	}
	if _, ok := tm.tasks["orders"]; ok {
		t.Fatal("finished task still listed")
	}
	if _, ok := tm.committed["orders"]; ok {
		t.Fatal("the commit's own event came before the task ended, and is still awaited")
	}

	// A change after the commit (a new recovery recorded at 46) is read.
	k = fresh(0)
	tm.ensure(key, 46)
	if tm.finish(k, 45, true) {
		t.Fatal("a task finished with a change past its commit unread")
	}
	if got := tm.takeWake(k); got != 46 {
		t.Fatalf("the read after it at or past %d, want 46", got)
	}

	// A broker registered or went away: the next read is linearizable, to
	// see it; a task with nothing left to do still finishes.
	tm.ensure(key, 47)
	tm.kickAll()
	if got := tm.takeWake(k); got != 0 {
		t.Fatalf("the read after a change of the brokers at or past %d, want 0 (linearizable)", got)
	}
	tm.kickAll()
	if !tm.finish(k, 47, true) {
		t.Fatal("a task with its recovery committed read again for a change of the brokers")
	}
	k = fresh(0)

	// awaited reports whether an ended task's commit event is awaited.
	awaited := func() bool { _, ok := tm.committed["orders"]; return ok }
	mustFinish := func(k *task, covered int64, committed bool) {
		t.Helper()
		if !tm.finish(k, covered, committed) {
			t.Fatalf("the task at %d did not finish", covered)
		}
	}

	// A task that read no recovery at 50 finishes unless woken past 50.
	tm.ensure(key, 50)
	mustFinish(k, 50, false)
	if awaited() {
		t.Fatal("a task that committed nothing awaits its commit's event")
	}

	// A task that committed at 60 ended before the watch brought its
	// delete back: that event starts no task, and the next one does.
	mustFinish(fresh(0), 60, true)
	tm.ensure(key, 59)
	tm.ensure(key, 60)
	if _, ok := tm.tasks["orders"]; ok {
		t.Fatal("the watch's events up to the ended task's own commit started a task")
	}
	if awaited() {
		t.Fatal("the commit's own event came, and is still awaited")
	}

	// A commit at or below the revision the running watch started from:
	// its event will never come, so nothing awaits it.
	tm.watchFrom = 65
	mustFinish(fresh(0), 65, true)
	if awaited() {
		t.Fatal("an ended task awaits an event the running watch will never bring")
	}

	mustFinish(fresh(0), 70, true)
	ended, end := context.WithCancel(ctx)
	end()
	tm.ctx = ended // ensure stops before starting the task's goroutine
	tm.ensure(key, 71)
	if awaited() {
		t.Fatal("a change past the ended task's commit did not reach the start of a task")
	}
}
