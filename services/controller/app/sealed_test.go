package app

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
)

// TestWithdrawnFailoverOfLiveOwnerRecordedAgain: an operator fails over a
// stream whose owner is live, the recoverer seals its copies at the fence
// epoch, and the operator withdraws the recovery before it commits. The
// owner is not lost, yet every copy refuses publishes until an assignment at
// the fence epoch includes it, so the liveness loop records a new recovery at
// that fence epoch with a new transition id (docs/protocol.md, "Withdrawing a
// recovery"). It records nothing for a copy sealed at the assignment's own epoch
// (a committed recovery not applied yet), for a sealed copy left out of the
// assignment, or while a recovery is pending; a single-copy stream sealed
// the same way gets no recovery and is listed under attention instead.
//
// The streams are reconciled in name order, so the recovery recorded for
// "b-withdrawn" after the withdrawal proves that a pass which read every
// heartbeat below has judged the "a-" streams too.
func TestWithdrawnFailoverOfLiveOwnerRecordedAgain(t *testing.T) {
	h := newHarness(t)
	nodes := []string{"b1", "b2", "b3", "b4"}
	for _, n := range nodes {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	ctx := ctxT(t)
	asg := map[string]cluster.Assignment{}
	for _, name := range []string{"a-committed", "a-outsider", "a-pending", "b-withdrawn"} {
		create(t, c, name, 3, nil)
		asg[name], _ = get[cluster.Assignment](h, schema.AssignmentKey(name))
	}
	create(t, c, "a-solo", 1, nil)
	asg["a-solo"], _ = get[cluster.Assignment](h, schema.AssignmentKey("a-solo"))

	failover := func(stream string) cluster.Recovery {
		t.Helper()
		if _, err := c.Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, Who: "ops", Why: "test"})); err != nil {
			t.Fatalf("failover %s: %v", stream, err)
		}
		rec, ok := get[cluster.Recovery](h, schema.RecoveryKey(stream))
		if !ok || rec.FenceEpoch != 2 {
			t.Fatalf("failover of %s recorded %+v", stream, rec)
		}
		return rec
	}
	withdrawn := failover("b-withdrawn")
	pending := failover("a-pending")

	// "a-committed" was recovered to epoch 2, as the recoverer commits:
	// the assignment at the fence epoch and no recovery.
	committed := asg["a-committed"]
	committed.Epoch = 2
	if _, err := h.cli.Put(ctx, schema.AssignmentKey("a-committed"), cluster.Encode(committed)); err != nil {
		t.Fatal(err)
	}
	asg["a-committed"] = committed

	// Every copy publishes its seal at epoch 2, except that the members of
	// "a-outsider" serve at epoch 1 while its non-member holds a copy
	// sealed at 2.
	sealed := cluster.CopyTails{Epoch: 2, Role: cluster.RoleSealed, RecordTail: 5, SealEpoch: 2}
	for _, n := range nodes {
		streams := map[string]cluster.CopyTails{}
		for name, a := range asg {
			switch {
			case name == "a-outsider" && a.Owner == n:
				streams[name] = cluster.CopyTails{Epoch: 1, Role: cluster.RoleOwner, RecordTail: 5}
			case name == "a-outsider" && a.Includes(n):
				streams[name] = cluster.CopyTails{Epoch: 1, Role: cluster.RoleFollower, RecordTail: 5}
			case name == "a-outsider" || a.Includes(n):
				streams[name] = sealed
			}
		}
		h.heartbeat(n, streams)
	}

	if _, err := c.WithdrawRecovery(ctx, connect.NewRequest(&strandv1.WithdrawRecoveryRequest{Stream: "b-withdrawn", Who: "ops", Why: "test"})); err != nil {
		t.Fatal(err)
	}
	again := h.recovery("b-withdrawn", withdrawn.TransitionID)
	a := asg["b-withdrawn"]
	if again.FromEpoch != 1 || again.FenceEpoch != withdrawn.FenceEpoch || again.TransitionID == "" ||
		again.OldOwner != a.Owner || len(again.AddedMembers) != 0 || !a.Includes(again.ProposedOwner) ||
		!strings.Contains(again.Reason, "sealed at epoch 2") {
		t.Fatalf("recovery recorded again as %+v, withdrawn %+v: want from epoch 1 at the same fence epoch, the live owner kept as a member", again, withdrawn)
	}

	for _, name := range []string{"a-committed", "a-outsider", "a-solo"} {
		if rec, ok := get[cluster.Recovery](h, schema.RecoveryKey(name)); ok {
			t.Errorf("%s: recovery %+v recorded", name, rec)
		}
	}
	if rec, _ := get[cluster.Recovery](h, schema.RecoveryKey("a-pending")); rec.TransitionID != pending.TransitionID {
		t.Errorf("a-pending: pending recovery %+v replaced %+v", rec, pending)
	}

	resp, err := c.ListAttention(ctx, connect.NewRequest(&strandv1.ListAttentionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	// Only the single copy waits on an operator.
	if es := resp.Msg.GetEntries(); len(es) != 1 || es[0].GetStream() != "a-solo" || es[0].GetKind() != "single_copy_sealed" ||
		es[0].GetNode() != asg["a-solo"].Owner {
		t.Fatalf("attention %v, want one single_copy_sealed entry for a-solo", es)
	}
}
