package admin

import (
	"fmt"
	"slices"
	"testing"

	"github.com/strandhq/strand/internal/cluster"
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

	var got []string
	for _, c := range copyStatuses(s, a) {
		got = append(got, fmt.Sprintf("%s %s e%d rt%d lag%d sync=%v live=%v", c.GetNode(), c.GetRole(), c.GetEpoch(), c.GetRecordTail(), c.GetLag(), c.GetInSync(), c.GetLive()))
	}
	want := []string{
		"b1 owner e2 rt10 lag0 sync=true live=true",
		"b2 follower e2 rt8 lag2 sync=true live=true",
		"b3 follower e1 rt10 lag0 sync=false live=true",
		"b4 follower e0 rt0 lag0 sync=false live=false",
		"b5 sealed e1 rt12 lag0 sync=false live=true",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("copy statuses\n got %q\nwant %q", got, want)
	}

	// A follower below the owner's confirm watermark is not in sync.
	s = state.Build().Live("b1", "b2").
		Tails("b1", "s", cluster.CopyTails{Epoch: 2, RecordTail: 10, ConfirmWatermark: 9}).
		Tails("b2", "s", cluster.CopyTails{Epoch: 2, RecordTail: 8}).Snapshot()
	if cs := copyStatuses(s, cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Followers: []string{"b2"}}); cs[1].GetInSync() {
		t.Fatalf("follower below the watermark reported in sync: %v", cs[1])
	}
}
