package onebox

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// waitPending waits for a pending recovery of stream (other than the
// transition not) and returns it.
func waitPending(t *testing.T, c *Cluster, stream, not string) cluster.Recovery {
	t.Helper()
	var rec cluster.Recovery
	clustertest.Eventually(t, 15*time.Second, "pending recovery of "+stream, func() error {
		r, ok := c.Recovery(stream)
		if !ok {
			return fmt.Errorf("none recorded")
		}
		if r.TransitionID == not {
			return fmt.Errorf("still transition %s", not)
		}
		rec = r
		return nil
	})
	return rec
}

// waitSealed waits until node publishes its copy of stream sealed at fence.
func waitSealed(t *testing.T, c *Cluster, stream, node string, fence uint64) cluster.CopyTails {
	t.Helper()
	var tails cluster.CopyTails
	clustertest.Eventually(t, 15*time.Second, fmt.Sprintf("%s sealed at %d on %s", stream, fence, node), func() error {
		tt, ok := c.Tails(node, stream)
		if !ok || tt.SealEpoch != fence {
			return fmt.Errorf("%s publishes %+v (present %v)", node, tt, ok)
		}
		tails = tt
		return nil
	})
	return tails
}

// waitAttention waits for an attention entry of kind for stream.
func waitAttention(t *testing.T, c *Cluster, stream, kind string) *strandv1.AttentionEntry {
	t.Helper()
	var entry *strandv1.AttentionEntry
	clustertest.Eventually(t, 15*time.Second, kind+" attention for "+stream, func() error {
		entries, err := c.Attention(stream)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.GetKind() == kind {
				entry = e
				return nil
			}
		}
		return fmt.Errorf("attention %s", describe(entries))
	})
	return entry
}

// TestRecovererLeaderClosedMidRecovery: the leading recoverer has sealed and
// waits (fewer than R copies answer) when it is closed; the second recoverer
// takes over and, once the missing follower is back, finishes the recovery
// exactly once: one history start appended, the epoch the fence epoch: a recoverer
// leader lost mid-recovery costs nothing but time. The controller that
// records the recovery is the second one too: the first leader is closed
// before the owner is lost.
func TestRecovererLeaderClosedMidRecovery(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 2, Recoverers: 2})
	const stream = "handover"
	a0 := c.CreateStream(stream, 3, majority)
	first := 1
	if c.Controller(2).Leading() {
		first = 2
	}
	c.StopController(first)
	second := 3 - first
	clustertest.Eventually(t, 15*time.Second, "the other controller leads", func() error {
		if !c.Controller(second).Leading() {
			return fmt.Errorf("controller-%d does not lead", second)
		}
		return nil
	})
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("r", 20)...)
	hist0 := c.History(stream)
	f1, f2 := a0.Followers[0], a0.Followers[1]

	// 3 copies under majority: R = 2. With the owner and one follower
	// gone only one copy answers, so the recovery seals it and waits.
	c.StopBroker(f2)
	c.StopBroker(a0.Owner)
	rec := waitPending(t, c, stream, "")
	if rec.FromEpoch != a0.Epoch || rec.FenceEpoch != a0.Epoch+1 || rec.OldOwner != a0.Owner {
		t.Fatalf("recovery %+v for %+v", rec, a0)
	}
	waitSealed(t, c, stream, f1, rec.FenceEpoch)
	leader := c.LeadingRecoverer()
	if leader == "" {
		t.Fatal("no recoverer leads while a seal was answered")
	}
	clustertest.Eventually(t, 10*time.Second, leader+" logs its wait", func() error {
		if _, ok := c.Log(leader).Find("waiting: fewer than R copies answered their seal; retrying", map[string]any{"stream": stream}); !ok {
			return fmt.Errorf("log tail:\n%s", c.Log(leader).Tail(5))
		}
		return nil
	})
	entry := waitAttention(t, c, stream, "recovery_waiting_copies")
	if missing := slices.Sorted(slices.Values(entry.GetMissing())); !slices.Equal(missing, slices.Sorted(slices.Values([]string{a0.Owner, f2}))) {
		t.Errorf("attention names missing %v, want %s and %s", entry.GetMissing(), a0.Owner, f2)
	}

	c.StopRecoverer(leader)
	var successor string
	clustertest.Eventually(t, 15*time.Second, "another recoverer leads", func() error {
		successor = c.LeadingRecoverer()
		if successor == "" {
			return fmt.Errorf("none leads")
		}
		return nil
	})
	if a, _ := c.Assignment(stream); a.Epoch != a0.Epoch {
		t.Fatalf("assignment moved with fewer than R copies: %+v", a)
	}

	c.StartBroker(f2)
	a1 := waitRecovered(t, c, stream, a0.Epoch, 20*time.Second)
	if _, ok := c.Log(fmt.Sprintf("controller-%d", second)).Find("owner lost; pending recovery recorded", map[string]any{"stream": stream}); !ok {
		t.Errorf("controller-%d, the leader left, did not record the recovery", second)
	}
	if a1.Epoch != rec.FenceEpoch || a1.Includes(a0.Owner) || !a1.Includes(f1) || !a1.Includes(f2) {
		t.Fatalf("recovered assignment %+v, want epoch %d on %s and %s", a1, rec.FenceEpoch, f1, f2)
	}
	if _, ok := c.Log(successor).Find("recovery committed", map[string]any{"stream": stream, "fence_epoch": rec.FenceEpoch}); !ok {
		t.Errorf("%s did not log the commit; its log ends:\n%s", successor, c.Log(successor).Tail(10))
	}
	c.WaitApplied(a1)
	publishAll(t, c, stream, l, "after")
	// Exactly once: one start appended, at the fence epoch, even after the
	// stream served again.
	hist1 := c.History(stream)
	if len(hist1) != len(hist0)+1 {
		t.Fatalf("history %+v after %+v: want exactly one start appended", hist1, hist0)
	}
	if s, _ := hist1.Latest(); s.Epoch != rec.FenceEpoch || s.Node != a1.Owner || s.RecordTail != 20 {
		t.Errorf("latest start %+v, want epoch %d at %s with 20 records", s, rec.FenceEpoch, a1.Owner)
	}
	verify(t, c, a1.Owner, stream, l)
}

// TestSecondOwnerLossWaitsForConfirmedPrefix is docs/protocol.md, "The
// confirmed prefix": right after a failover the new owner is the only copy holding the
// records confirmed before it; losing it too is a second failure, and the
// next recovery waits, listed under attention with the start's record count
// and node, until a copy at or past the start answers, then promotes it.
//
// Two copies under majority (W = 2, R = 1) on three brokers: the first
// recovery adds the spare broker as a member that holds no copy; it is down
// when that recovery commits, so it stays empty.
// prefixWait is a stream whose second recovery waits for the confirmed
// prefix: its owner of epoch 2 (follower) is down, and the only copy
// answering (spare) is empty.
type prefixWait struct {
	c               *Cluster
	stream          string
	follower, spare string
	l               *ledger.Ledger
	a1              cluster.Assignment
	rec2            cluster.Recovery
}

// secondLossWaitingForPrefix builds a prefixWait. Two copies under
// majority (W = 2, R = 1) on three brokers: the first recovery adds the
// spare broker as a member that holds no copy; it is down when that
// recovery commits, so it stays empty.
func secondLossWaitingForPrefix(t *testing.T, stream string) prefixWait {
	t.Helper()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1})
	a0 := c.CreateStream(stream, 2, majority)
	owner, follower := a0.Owner, a0.Followers[0]
	spare := Others([]string{"b1", "b2", "b3"}, owner, follower)[0]
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("p", 30)...)

	// No recoverer yet: the recovery is recorded with the spare added,
	// then the spare goes down before it commits.
	c.StopBroker(owner)
	rec1 := waitPending(t, c, stream, "")
	if !slices.Equal(rec1.AddedMembers, []string{spare}) || rec1.ProposedOwner != follower {
		t.Fatalf("first recovery %+v: want %s proposed and %s added", rec1, follower, spare)
	}
	c.StopBroker(spare)
	rcv := c.StartRecoverer()
	a1 := waitRecovered(t, c, stream, a0.Epoch, 15*time.Second)
	if a1.Owner != follower || !slices.Equal(a1.Followers, []string{spare}) || a1.Epoch != rec1.FenceEpoch {
		t.Fatalf("first recovery committed %+v, want %s owning with %s following at epoch %d", a1, follower, spare, rec1.FenceEpoch)
	}
	hist1 := c.History(stream)
	start1, _ := hist1.Latest()
	if len(hist1) != 1 || start1.RecordTail != 30 || start1.Node != follower || start1.Epoch != a1.Epoch {
		t.Fatalf("history after the first recovery %+v, want one start at 30 records on %s", hist1, follower)
	}

	// The second owner loss: only the empty spare can answer.
	c.StopBroker(follower)
	rec2 := waitPending(t, c, stream, "")
	if rec2.FromEpoch != a1.Epoch {
		t.Fatalf("second recovery %+v, want from epoch %d", rec2, a1.Epoch)
	}
	c.StartBroker(spare)
	waitSealed(t, c, stream, spare, rec2.FenceEpoch)
	clustertest.Eventually(t, 10*time.Second, "the recoverer waits for the confirmed prefix", func() error {
		if _, ok := c.Log(rcv).Find("waiting for a copy at the confirmed prefix: the furthest sealed copy is below the latest history start; retrying",
			map[string]any{"stream": stream, "record_tail": 30, "pick": spare}); !ok {
			return fmt.Errorf("log tail:\n%s", c.Log(rcv).Tail(5))
		}
		return nil
	})
	if a, _ := c.Assignment(stream); a.Epoch != a1.Epoch {
		t.Fatalf("promoted below the confirmed prefix: %+v", a)
	}
	entry := waitAttention(t, c, stream, "recovery_waiting_prefix")
	if entry.GetStartRecordTail() != 30 || entry.GetStartNode() != follower {
		t.Errorf("attention %v: want start at 30 records taken over by %s", entry, follower)
	}

	return prefixWait{c: c, stream: stream, follower: follower, spare: spare, l: l, a1: a1, rec2: rec2}
}

func TestSecondOwnerLossWaitsForConfirmedPrefix(t *testing.T) {
	t.Parallel()
	w := secondLossWaitingForPrefix(t, "prefix")
	c, stream, follower, spare, l, a1, rec2 := w.c, w.stream, w.follower, w.spare, w.l, w.a1, w.rec2

	// The copy at the start answers: it is promoted, once.
	c.StartBroker(follower)
	a2 := waitRecovered(t, c, stream, a1.Epoch, 20*time.Second)
	if a2.Owner != follower || a2.Epoch != rec2.FenceEpoch || !slices.Equal(a2.Followers, []string{spare}) {
		t.Fatalf("second recovery committed %+v, want %s owning at epoch %d with %s following", a2, follower, rec2.FenceEpoch, spare)
	}
	hist2 := c.History(stream)
	if s, _ := hist2.Latest(); len(hist2) != 2 || s.Epoch != a2.Epoch || s.RecordTail != 30 || s.Node != follower {
		t.Fatalf("history after the second recovery %+v", hist2)
	}
	clustertest.Eventually(t, 10*time.Second, "attention clears", func() error {
		entries, err := c.Attention(stream)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.GetKind() == "recovery_waiting_prefix" || e.GetKind() == "recovery_waiting_copies" {
				return fmt.Errorf("attention %s", describe(entries))
			}
		}
		return nil
	})
	c.WaitApplied(a2)
	publishAll(t, c, stream, l, Numbered("q", 5)...)
	recs := verify(t, c, follower, stream, l)
	clustertest.Eventually(t, 10*time.Second, "the spare caught up from empty", func() error {
		got, err := c.ReadAll(spare, stream)
		if err != nil {
			return err
		}
		return SameRecords(follower, recs, spare, got)
	})
}

// TestWithdrawRecovery: an operator withdraws a waiting recovery; the
// controller records a new transition at the same fence epoch, which takes
// over the copies' existing seal, and the recovery commits at that epoch
// once enough copies answer.
func TestWithdrawRecovery(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "withdraw"
	a0 := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("w", 10)...)
	f1, f2 := a0.Followers[0], a0.Followers[1]
	c.StopBroker(f2)
	c.StopBroker(a0.Owner)
	rec := waitPending(t, c, stream, "")
	waitSealed(t, c, stream, f1, rec.FenceEpoch)

	if _, err := c.Admin().WithdrawRecovery(c.Ctx(), connect.NewRequest(&strandv1.WithdrawRecoveryRequest{
		Stream: stream, Who: "onebox", Why: "test",
	})); err != nil {
		t.Fatalf("withdraw: %v", err)
	}
	again := waitPending(t, c, stream, rec.TransitionID)
	if again.FenceEpoch != rec.FenceEpoch || again.FromEpoch != rec.FromEpoch {
		t.Fatalf("recovery recorded again as %+v, was %+v: want the same fence epoch", again, rec)
	}
	if _, ok := c.Log("controller-1").Find("operator withdrew a pending recovery", map[string]any{"stream": stream, "who": "onebox", "why": "test"}); !ok {
		t.Errorf("the withdrawal is not logged with who and why; controller log ends:\n%s", c.Log("controller-1").Tail(10))
	}
	c.StartBroker(f2)
	a1 := waitRecovered(t, c, stream, a0.Epoch, 20*time.Second)
	if a1.Epoch != rec.FenceEpoch {
		t.Fatalf("recovered at epoch %d, want the fence epoch %d", a1.Epoch, rec.FenceEpoch)
	}
	if h := c.History(stream); len(h) != 1 || h[0].Epoch != rec.FenceEpoch || h[0].RecordTail != 10 {
		t.Fatalf("history %+v, want one start at epoch %d with 10 records", h, rec.FenceEpoch)
	}
	// With nothing pending there is nothing to withdraw.
	_, err := c.Admin().WithdrawRecovery(c.Ctx(), connect.NewRequest(&strandv1.WithdrawRecoveryRequest{Stream: stream, Who: "onebox", Why: "again"}))
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition && code != connect.CodeNotFound {
		t.Errorf("withdraw with no recovery pending: %v, want FailedPrecondition or NotFound", err)
	}
	c.WaitApplied(a1)
	publishAll(t, c, stream, l, "after")
	verify(t, c, a1.Owner, stream, l)
}

// TestAcceptOwnerLoss: an operator moves a replicated stream whose recovery
// waits for copies to a live copy without sealing more; the start recorded
// is that copy's tails as its heartbeat published them. A single-copy
// stream whose owner is down moves to a live broker, starting empty, and
// records no start since that broker published nothing for it.
func TestAcceptOwnerLoss(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream, solo = "accept", "accept-solo"
	a0 := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("a", 12)...)
	f1, f2 := a0.Followers[0], a0.Followers[1]
	c.StopBroker(f2)
	c.StopBroker(a0.Owner)
	rec := waitPending(t, c, stream, "")
	tails := waitSealed(t, c, stream, f1, rec.FenceEpoch)
	waitAttention(t, c, stream, "recovery_waiting_copies")

	resp, err := c.Admin().AcceptOwnerLoss(c.Ctx(), connect.NewRequest(&strandv1.AcceptOwnerLossRequest{
		Stream: stream, Node: f1, Who: "onebox", Why: "test",
	}))
	if err != nil {
		t.Fatalf("accept owner loss: %v", err)
	}
	got := resp.Msg.GetAssignment()
	if got.GetOwner() != f1 || got.GetEpoch() != rec.FenceEpoch || slices.Contains(got.GetFollowers(), a0.Owner) {
		t.Fatalf("accepted assignment %v, want %s owning at the fence epoch %d without %s", got, f1, rec.FenceEpoch, a0.Owner)
	}
	wantStart := cluster.HistoryStart{Epoch: rec.FenceEpoch, RecordTail: tails.RecordTail, CursorEventTail: tails.CursorEventTail, Node: f1}
	if s := resp.Msg.GetStart(); s == nil || s.GetRecordTail() != 12 || s.GetNode() != f1 || s.GetEpoch() != rec.FenceEpoch {
		t.Errorf("response start %v, want %+v", s, wantStart)
	}
	if h := c.History(stream); len(h) != 1 || h[0] != wantStart {
		t.Errorf("history %+v, want [%+v]", h, wantStart)
	}
	if r, pending := c.Recovery(stream); pending {
		t.Errorf("recovery still pending after the accepted loss: %+v", r)
	}
	// W = 2 of the two copies left: the stream confirms once f2 follows.
	c.StartBroker(f2)
	a1, _ := c.Assignment(stream)
	c.WaitApplied(a1)
	publishAll(t, c, stream, l, "after")
	verify(t, c, f1, stream, l)

	// A single copy whose owner is down.
	s0 := c.CreateStream(solo, 1, majority)
	publishAll(t, c, solo, ledger.New(), "lost")
	c.StopBroker(s0.Owner)
	waitAttention(t, c, solo, "single_copy_owner_down")
	if _, pending := c.Recovery(solo); pending {
		t.Fatal("a single-copy stream got a pending recovery")
	}
	resp, err = c.Admin().AcceptOwnerLoss(c.Ctx(), connect.NewRequest(&strandv1.AcceptOwnerLossRequest{Stream: solo, Who: "onebox", Why: "test"}))
	if err != nil {
		t.Fatalf("accept owner loss of %s: %v", solo, err)
	}
	moved := resp.Msg.GetAssignment()
	if moved.GetOwner() == s0.Owner || moved.GetEpoch() != s0.Epoch+1 || resp.Msg.GetStart() != nil {
		t.Fatalf("accepted %v with start %v, want a live broker at epoch %d and no start", moved, resp.Msg.GetStart(), s0.Epoch+1)
	}
	if h := c.History(solo); len(h) != 0 {
		t.Errorf("history %+v, want none: the new owner published nothing", h)
	}
	sl := ledger.New()
	publishAll(t, c, solo, sl, "fresh")
	if recs := verify(t, c, moved.GetOwner(), solo, sl); len(recs) != 1 || recs[0].GetOffset() != 0 {
		t.Errorf("the moved single copy shows %v, want only the new record at 0", Payloads(recs))
	}
}

// TestAcceptedLossBelowConfirmedPrefix: while the recovery waits for the
// confirmed prefix, an operator accepts the loss onto the empty copy. The
// start recorded for the new epoch is that copy's published tails (0), the
// broker warns that it was promoted below the confirmed prefix, and the
// stream serves again from its tail (docs/limits.md).
func TestAcceptedLossBelowConfirmedPrefix(t *testing.T) {
	t.Parallel()
	w := secondLossWaitingForPrefix(t, "accepted")
	c, stream, spare := w.c, w.stream, w.spare
	resp, err := c.Admin().AcceptOwnerLoss(c.Ctx(), connect.NewRequest(&strandv1.AcceptOwnerLossRequest{
		Stream: stream, Node: spare, Who: "onebox", Why: "the prefix is gone",
	}))
	if err != nil {
		t.Fatalf("accept owner loss: %v", err)
	}
	if a := resp.Msg.GetAssignment(); a.GetOwner() != spare || a.GetEpoch() != w.rec2.FenceEpoch {
		t.Fatalf("accepted assignment %v, want %s at epoch %d", a, spare, w.rec2.FenceEpoch)
	}
	want := cluster.HistoryStart{Epoch: w.rec2.FenceEpoch, RecordTail: 0, Node: spare}
	if h := c.History(stream); len(h) != 2 || h[1] != want {
		t.Fatalf("history %+v, want the accepted start %+v appended", h, want)
	}
	clustertest.Eventually(t, 10*time.Second, spare+" warns it owns below the confirmed prefix", func() error {
		if _, ok := c.Log(spare).Find("promoted below the confirmed prefix (an accepted owner loss); records above this tail are gone",
			map[string]any{"stream": stream, "record_tail": 0, "start_record_tail": 30, "start_node": w.follower}); !ok {
			return fmt.Errorf("log tail:\n%s", c.Log(spare).Tail(5))
		}
		return nil
	})
	l := ledger.New()
	publishAll(t, c, stream, l, "fresh")
	if recs := verify(t, c, spare, stream, l); len(recs) != 1 || recs[0].GetOffset() != 0 {
		t.Errorf("after the accepted loss %s shows %v, want only the new record at 0", spare, Payloads(recs))
	}
}
