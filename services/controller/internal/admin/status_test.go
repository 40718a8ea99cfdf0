package admin

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/state"
)

func TestCopyStatuses(t *testing.T) {
	a := cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Followers: []string{"b2", "b3", "b4"}}
	s := state.Build().Live("b1", "b2", "b3", "b5").
		Tails("b1", "s", cluster.CopyTails{Epoch: 2, Role: cluster.RoleOwner, RecordTail: 10, ConfirmWatermark: 8}).
		Tails("b2", "s", cluster.CopyTails{Epoch: 2, Role: cluster.RoleFollower, RecordTail: 8}).  // holds every confirmed record
		Tails("b3", "s", cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: 10}). // old epoch
		// b4 is down and published nothing.
		Tails("b5", "s", cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, RecordTail: 12, SealEpoch: 2}). // left out
		Stream(a).Snapshot()

	want := []string{
		"b1 owner e2 rt10 lag=0 in_sync sync=true live=true",
		"b2 follower e2 rt8 lag=2 in_sync sync=true live=true",
		"b3 follower e1 rt10 lag=0 lagging sync=false live=true",
		"b4 follower e0 rt0 lag=? down sync=false live=false",
		"b5 sealed e1 rt12 lag=0 - sync=false live=true",
	}
	if got := rows(s, a, nil); !slices.Equal(got, want) {
		t.Fatalf("copy statuses\n got %q\nwant %q", got, want)
	}

	// A follower further below the owner's confirm watermark than the
	// slack is not in sync.
	a = cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Followers: []string{"b2"}}
	s = state.Build().Live("b1", "b2").
		Tails("b1", "s", cluster.CopyTails{Epoch: 2, RecordTail: 5000, ConfirmWatermark: 4000}).
		Tails("b2", "s", cluster.CopyTails{Epoch: 2, RecordTail: 3000}).Stream(a).Snapshot()
	if cs := copyStatuses(s, a, nil); cs[1].GetInSync() || cs[1].GetState() != attention.Lagging || cs[1].GetLag() != 2000 {
		t.Fatalf("follower below the watermark by more than the slack: %v", cs[1])
	}
}

// After a failover that dropped its dead owner, a stream of three copies
// has two members: the third row is the dropped owner, missing, named from
// what the controller remembers, not live, with its lag unknown and since
// when it was first seen down.
func TestCopyStatusesShowMissingOwner(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	before := cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}}
	after := cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b2", Followers: []string{"b3"}}
	tails := func(b *state.Builder) *state.Builder {
		return b.Tails("b2", "s", cluster.CopyTails{Epoch: 2, Role: cluster.RoleOwner, RecordTail: 9, ConfirmWatermark: 9}).
			Tails("b3", "s", cluster.CopyTails{Epoch: 2, Role: cluster.RoleFollower, RecordTail: 9})
	}
	mem := attention.NewMemory()
	mem.Observe(state.Build().Live("b2", "b3").Stream(before).Snapshot(), t0)
	s := tails(state.Build().Live("b2", "b3")).Stream(after).Snapshot()
	s.Streams["s"] = state.Versioned[cluster.StreamSpec]{Value: cluster.StreamSpec{Name: "s", Copies: 3}}
	mem.Observe(s, t0.Add(time.Second))

	want := []string{
		"b2 owner e2 rt9 lag=0 in_sync sync=true live=true",
		"b3 follower e2 rt9 lag=0 in_sync sync=true live=true",
		"b1 owner e0 rt0 lag=? missing sync=false live=false since=" + t0.Format(time.RFC3339),
	}
	if got := rows(s, after, mem); !slices.Equal(got, want) {
		t.Fatalf("copy statuses\n got %q\nwant %q", got, want)
	}
	// Without the memory the slot is still shown, unnamed.
	if got := rows(s, after, nil); len(got) != 3 || got[2] != " - e0 rt0 lag=? missing sync=false live=false" {
		t.Fatalf("copy statuses without memory: %q", got)
	}
}

func rows(s *state.Snapshot, a cluster.Assignment, mem *attention.Memory) []string {
	var got []string
	for _, c := range copyStatuses(s, a, mem) {
		lag := "?"
		if c.Lag != nil {
			lag = fmt.Sprint(c.GetLag())
		}
		row := fmt.Sprintf("%s %s e%d rt%d lag=%s %s sync=%v live=%v", c.GetNode(), or(c.GetRole()), c.GetEpoch(), c.GetRecordTail(), lag,
			or(c.GetState()), c.GetInSync(), c.GetLive())
		if c.GetSince() != nil {
			row += " since=" + c.GetSince().AsTime().Format(time.RFC3339)
		}
		got = append(got, row)
	}
	return got
}

func or(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
