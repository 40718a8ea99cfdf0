package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A follower whose copy is empty joins after the owner compacted its cursor
// event log: the owner's events below its snapshot are gone, so the
// follower receives the snapshot, then the events after it, and ends with
// the owner's cursor state, which it keeps across a restart.
func TestEmptyFollowerBootstrapsFromCursorSnapshot(t *testing.T) {
	h := newHarness(t, "b1", "b2")
	a := cluster.Assignment{Stream: "cur", Epoch: 1, Owner: "b1", Policy: cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}}
	h.assign(a)
	for i := range 10 {
		h.publish("b1", "cur", fmt.Sprint(i))
	}
	commit := func(cursor string, offset uint64) {
		t.Helper()
		_, err := h.streams("b1").CommitCursor(context.Background(), connect.NewRequest(&strandv1.CommitCursorRequest{Stream: "cur", Cursor: cursor, Offset: offset}))
		if err != nil {
			t.Fatalf("commit %s at %d: %v", cursor, offset, err)
		}
	}
	commit("c1", 3)
	commit("c2", 5)
	commit("c1", 7)
	commit("c3", 9)
	owner, err := h.brokers["b1"].db.Open("cur")
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if head := owner.CursorEventHead(); head != 4 {
		t.Fatalf("owner retains cursor events from %d, want 4 (compacted below its snapshot)", head)
	}
	if _, err := owner.ReadCursorEvents(0, 0); !errors.Is(err, storage.ErrOutOfRange) {
		t.Fatalf("owner's events below its snapshot: %v, want them compacted", err)
	}
	commit("c2", 8) // after the snapshot: shipped as an event
	if err := owner.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"c1": 7, "c2": 8, "c3": 9}
	if got := cursorsOf(owner, want); !maps.Equal(got, want) {
		t.Fatalf("owner cursors %v, want %v", got, want)
	}

	a.Followers = []string{"b2"}
	h.assign(a)
	caughtUp := func(when string) {
		t.Helper()
		clustertest.Eventually(t, 15*time.Second, "b2 "+when, func() error {
			tails, err := h.heartbeat("b2", "cur")
			if err != nil {
				return err
			}
			if tails.Role != cluster.RoleFollower || tails.CursorEventTail != 5 || tails.RecordTail != 10 {
				return fmt.Errorf("heartbeat %+v", tails)
			}
			return nil
		})
		follower, err := h.brokers["b2"].db.Open("cur")
		if err != nil {
			t.Fatal(err)
		}
		if got := cursorsOf(follower, want); !maps.Equal(got, want) {
			t.Fatalf("%s: follower cursors %v, want the owner's %v", when, got, want)
		}
		// It never held the compacted events: it took the snapshot.
		if head := follower.CursorEventHead(); head < 4 {
			t.Fatalf("%s: follower serves cursor events from %d, below the owner's snapshot at 4", when, head)
		}
	}
	caughtUp("caught up from the owner's cursor snapshot")
	h.stop("b2")
	h.start("b2")
	caughtUp("after a restart")
}

// cursorsOf reads the named cursors of s (absent ones are left out).
func cursorsOf(s *storage.Stream, names map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for n := range names {
		if p, ok := s.Cursor(n); ok {
			out[n] = p
		}
	}
	return out
}
