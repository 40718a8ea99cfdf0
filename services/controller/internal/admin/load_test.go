package admin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// The placement load kept across snapshots is the one counted afresh from
// each (transition.LoadOf) through creations, a change of members, a
// deletion, and counts that go to zero; a snapshot older than one counted
// before gets the newer counts with its own live brokers.
func TestLoadsFollowTheSnapshots(t *testing.T) {
	f := startFlood(t, Config{}, "b1", "b2", "b3", "b4")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(a cluster.Assignment) {
		t.Helper()
		if _, err := f.cli.Put(ctx, f.schema.AssignmentKey(a.Stream), cluster.Encode(a)); err != nil {
			t.Fatal(err)
		}
	}
	del := func(stream string) {
		t.Helper()
		if _, err := f.cli.Delete(ctx, f.schema.AssignmentKey(stream)); err != nil {
			t.Fatal(err)
		}
	}
	fresh := func() *state.Snapshot {
		t.Helper()
		snap, err := f.view.Fresh(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	var l loads
	check := func(step string, snap *state.Snapshot) {
		t.Helper()
		got, want := l.of(snap), transition.LoadOf(snap)
		if !slices.Equal(got.Live, want.Live) || !maps.Equal(got.Copies, want.Copies) || !maps.Equal(got.Owned, want.Owned) {
			t.Errorf("%s: load %+v, counted afresh %+v", step, got, want)
		}
	}

	check("no streams", fresh())
	put(cluster.Assignment{Stream: "a", Epoch: 1, Owner: "b1", Followers: []string{"b2"}})
	put(cluster.Assignment{Stream: "b", Epoch: 1, Owner: "b2", Followers: []string{"b3", "b4"}})
	check("two created", fresh())
	old := fresh()
	put(cluster.Assignment{Stream: "a", Epoch: 2, Owner: "b3", Followers: []string{"b4"}})
	check("members of a changed", fresh())
	put(cluster.Assignment{Stream: "c", Epoch: 1, Owner: "b1"})
	newer := fresh()
	check("c created", newer)
	// The older snapshot is answered with the newer counts.
	got, want := l.of(old), transition.LoadOf(newer)
	if !maps.Equal(got.Copies, want.Copies) || !maps.Equal(got.Owned, want.Owned) || !slices.Equal(got.Live, old.LiveBrokers()) {
		t.Errorf("older snapshot: load %+v, want the newer counts %+v with its own live brokers", got, want)
	}
	del("b")
	check("b deleted", fresh())
	put(cluster.Assignment{Stream: "c", Epoch: 2, Owner: "b3"})
	check("c moved off b1", fresh())
	del("a")
	del("c")
	check("every stream deleted", fresh())
	// The caller's load is its own: changing it changes nothing kept.
	put(cluster.Assignment{Stream: "d", Epoch: 1, Owner: "b1"})
	snap := fresh()
	l.of(snap).Copies["b1"] = 99
	check("after a caller changed its load", snap)
}

// Concurrent creations each count the placements of the others still in
// flight: owners come out even (within one of each other), so the owner
// balancing finds nothing to hand over on a cluster just filled with
// streams. Counted on the snapshots alone, creations that read the same
// counts put their owners on the same broker.
func TestConcurrentCreationsSpreadOwnersEvenly(t *testing.T) {
	const n = 600
	f := startFlood(t, Config{}, "b1", "b2", "b3")
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("even-%04d", i)
	}
	for name, err := range createAll(context.Background(), f.admin, names, 3, 64) {
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	owned := map[string]int{}
	for _, a := range f.stored(t) {
		owned[a.Owner]++
	}
	lo, hi := n, 0
	for _, b := range f.live {
		lo, hi = min(lo, owned[b]), max(hi, owned[b])
	}
	if hi-lo > 1 {
		t.Fatalf("owners %v: %d apart, want within one", owned, hi-lo)
	}
}
