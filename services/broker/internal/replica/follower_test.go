package replica

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A follow call that broke on the owner's side names the owner suspect; one
// that failed on this copy's own storage does not.
func TestOwnerSuspected(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"owner unreachable", connect.NewError(connect.CodeUnavailable, errors.New("dial")), true},
		{"stream broke", fmt.Errorf("receive: %w", connect.NewError(connect.CodeUnknown, errors.New("EOF"))), true},
		{"owner timed out", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), true},
		{"owner refused the epoch", connect.NewError(connect.CodeFailedPrecondition, ErrEpochMismatch), false},
		{"own store closed", localErr(storage.ErrClosed), false},
		{"own write failed", localErr(errors.New("storage: syncing batch: input/output error")), false},
	} {
		if got := ownerSuspected(c.err); got != c.want {
			t.Errorf("%s: ownerSuspected(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A follow starts with a sync only when the copy queued a batch since its
// last one: after a mass failover thousands of followers retry an owner
// that is gone, and a sync per attempt loaded the committer the seals and
// the new roles wait on. A copy that did queue one still syncs first, so
// its follow starts at tails that hold what it took.
func TestFollowRetriesSyncOnlyAfterAQueuedBatch(t *testing.T) {
	var commits atomic.Int64
	db, err := storage.Open(storage.Options{Dir: t.TempDir(), Logger: zerolog.Nop(),
		OnCommit: func(_, _ time.Duration, _ bool) { commits.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(Config{Node: "b1", Storage: db, Logger: zerolog.Nop(),
		History: func(context.Context, string, int64) (cluster.HistoryStarts, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); _ = db.Close() })
	c, err := m.openCopy("s")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The engine counts a group (OnCommit) before it tells the group's
	// waiters (OnDone): once this sync returns, every commit so far is
	// counted, the copy's first metadata's with it.
	if err := c.st.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	before := commits.Load()
	for range 5 {
		// "gone" is not registered: every attempt fails before any follow.
		if err := c.followOnce(ctx, "gone", 1); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("follow of an unregistered owner: %v, want Unavailable", err)
		}
	}
	// Nothing was queued, so nothing was synced: a sync a retry made
	// would be counted before that retry went on.
	if got := commits.Load(); got != before {
		t.Fatalf("%d commits by 5 retries with nothing queued, want none", got-before)
	}
	c.followQueued.Store(true)
	if err := c.followOnce(ctx, "gone", 1); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("follow of an unregistered owner: %v, want Unavailable", err)
	}
	if commits.Load() == before {
		t.Fatal("a follow after a queued batch started without a sync")
	}
	if c.followQueued.Load() {
		t.Fatal("the sync left the copy marked as having queued a batch")
	}
}
