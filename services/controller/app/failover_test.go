package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// recovery waits for a pending recovery of stream other than the one with
// transition id not.
func (h *harness) recovery(stream, not string) cluster.Recovery {
	h.t.Helper()
	var rec cluster.Recovery
	clustertest.Eventually(h.t, 15*time.Second, "pending recovery of "+stream, func() bool {
		r, ok := get[cluster.Recovery](h, schema.RecoveryKey(stream))
		rec = r
		return ok && r.TransitionID != not
	})
	return rec
}

func TestUpdateStreamFastPath(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3", "b4"} {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	ctx := ctxT(t)
	a := create(t, c, "s", 2, nil).GetAssignment()

	// 2 -> 3 copies under majority_durable keeps W = 2: fast path, same epoch.
	resp, err := c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "s", Copies: 3}))
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := get[cluster.Assignment](h, schema.AssignmentKey("s"))
	if !resp.Msg.GetFastPath() || stored.Epoch != 1 || stored.Owner != a.GetOwner() || stored.Copies() != 3 ||
		!slices.Equal(stored.Followers[:1], a.GetFollowers()) {
		t.Fatalf("fast path: response %v, stored %+v", resp.Msg, stored)
	}
	if spec, _ := get[cluster.StreamSpec](h, schema.StreamKey("s")); spec.Copies != 3 {
		t.Fatalf("spec copies %d, want 3", spec.Copies)
	}
	if _, ok := get[cluster.Recovery](h, schema.RecoveryKey("s")); ok {
		t.Fatal("fast path wrote a recovery")
	}

	// Dropping a copy is refused and changes nothing.
	before := h.dump()
	_, err = c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "s", Copies: 2}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	if after := h.dump(); len(after) != len(before) || after[schema.AssignmentKey("s")] != before[schema.AssignmentKey("s")] {
		t.Fatal("refused change altered the assignment")
	}

	// 3 -> 4 under majority raises W to 3: routed through a pending
	// recovery, the assignment untouched.
	resp, err = c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "s", Copies: 4}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetFastPath() {
		t.Fatal("3 -> 4 copies under majority_durable reported as fast path")
	}
	rec, ok := get[cluster.Recovery](h, schema.RecoveryKey("s"))
	if !ok || rec.FromEpoch != 1 || rec.FenceEpoch != 2 || rec.ProposedOwner != stored.Owner || len(rec.AddedMembers) != 1 || rec.TransitionID == "" {
		t.Fatalf("recovery %+v", rec)
	}
	if after, _ := get[cluster.Assignment](h, schema.AssignmentKey("s")); after.Copies() != 3 || after.Epoch != 1 {
		t.Fatalf("recovery path moved the assignment: %+v", after)
	}
	// A second change while the recovery is pending is refused.
	_, err = c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "s", Policy: &strandv1.ConfirmPolicy{Name: cluster.LocalDurable}}))
	wantCode(t, err, connect.CodeFailedPrecondition)
}

func TestOwnerLossRecordsRecovery(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3", "b4"} {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	// Four brokers, three copies: the live non-member is not added; the
	// recovery keeps the lost owner, to rejoin as a follower
	// (docs/protocol.md, "Replacing a missing copy").
	create(t, c, "filler", 1, nil)
	a, _ := get[cluster.Assignment](h, schema.AssignmentKey(create(t, c, "s", 3, nil).GetAssignment().GetStream()))
	f1, f2 := a.Followers[0], a.Followers[1]
	h.heartbeat(f1, map[string]cluster.CopyTails{"s": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 7, CursorEventTail: 1}})
	h.heartbeat(f2, map[string]cluster.CopyTails{"s": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 9, CursorEventTail: 0}})

	h.kill(a.Owner)
	rec := h.recovery("s", "")
	want := cluster.Recovery{
		Stream: "s", FromEpoch: 1, FenceEpoch: 2, OldOwner: a.Owner, OldFollowers: a.Followers,
		ProposedOwner: f2, Copies: 3, Policy: cluster.Policy{Name: cluster.MajorityDurable},
	}
	if rec.Stream != want.Stream || rec.FromEpoch != want.FromEpoch || rec.FenceEpoch != want.FenceEpoch ||
		rec.OldOwner != want.OldOwner || !slices.Equal(rec.OldFollowers, want.OldFollowers) ||
		rec.ProposedOwner != want.ProposedOwner || len(rec.AddedMembers) != 0 || len(rec.RemovedMembers) != 0 || rec.Copies != want.Copies ||
		rec.Policy != want.Policy || len(rec.TransitionID) != 16 || rec.Reason == "" || rec.Created.IsZero() {
		t.Fatalf("recovery\n got %+v\nwant %+v", rec, want)
	}
	// The assignment is not moved by the controller.
	if now, _ := get[cluster.Assignment](h, schema.AssignmentKey("s")); now.Epoch != 1 || now.Owner != a.Owner {
		t.Fatalf("controller moved a replicated stream: %+v", now)
	}

	// Withdrawn, it is recorded again at the same fence epoch with a new id.
	_, err := c.WithdrawRecovery(ctxT(t), connect.NewRequest(&strandv1.WithdrawRecoveryRequest{Stream: "s", Who: "ops", Why: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	again := h.recovery("s", rec.TransitionID)
	if again.FenceEpoch != rec.FenceEpoch || again.TransitionID == rec.TransitionID || again.ProposedOwner != f2 {
		t.Fatalf("re-recorded recovery %+v after %+v", again, rec)
	}
}

func TestSingleCopyOwnerDownWaits(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	h.broker("b2")
	_, c := h.leader(Config{})
	a := create(t, c, "solo", 1, nil).GetAssignment()
	h.kill(a.GetOwner())
	var entries []*strandv1.AttentionEntry
	clustertest.Eventually(t, 15*time.Second, "single_copy_owner_down attention", func() bool {
		resp, err := c.ListAttention(ctxT(t), connect.NewRequest(&strandv1.ListAttentionRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		entries = resp.Msg.GetEntries()
		return len(entries) > 0
	})
	if len(entries) != 1 || entries[0].GetKind() != "single_copy_owner_down" || entries[0].GetStream() != "solo" || entries[0].GetNode() != a.GetOwner() {
		t.Fatalf("attention %v", entries)
	}
	if _, ok := get[cluster.Recovery](h, schema.RecoveryKey("solo")); ok {
		t.Fatal("single-copy stream got a pending recovery")
	}
	got, err := c.GetStream(ctxT(t), connect.NewRequest(&strandv1.GetStreamRequest{Name: "solo"}))
	if err != nil || len(got.Msg.GetAttention()) != 1 {
		t.Fatalf("GetStream attention %v %v", got, err)
	}
}

func TestAcceptOwnerLoss(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3"} {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	ctx := ctxT(t)
	create(t, c, "with", 3, nil)
	create(t, c, "without", 3, nil)
	aw, _ := get[cluster.Assignment](h, schema.AssignmentKey("with"))
	an, _ := get[cluster.Assignment](h, schema.AssignmentKey("without"))
	// Existing history: the new start is appended after it.
	if _, err := h.cli.Put(ctx, schema.HistoryKey("with"), cluster.Encode(cluster.HistoryStarts{{Epoch: 1, Node: aw.Owner}})); err != nil {
		t.Fatal(err)
	}
	target := aw.Followers[1]
	if target == an.Owner {
		t.Fatalf("placement put the owner of the other stream on %s; the test needs it live", target)
	}
	h.heartbeat(target, map[string]cluster.CopyTails{"with": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 42, CursorEventTail: 3}})

	// The owners are down; accept-loss races the liveness loop, which
	// records a pending recovery: accepting must clear it.
	h.kill(aw.Owner)
	if an.Owner != aw.Owner {
		h.kill(an.Owner)
	}
	h.recovery("with", "")

	resp, err := c.AcceptOwnerLoss(ctx, connect.NewRequest(&strandv1.AcceptOwnerLossRequest{Stream: "with", Node: target, Who: "ops", Why: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := get[cluster.Assignment](h, schema.AssignmentKey("with"))
	if got.Epoch != 2 || got.Owner != target || slices.Contains(got.Followers, aw.Owner) || got.Copies() != 2 {
		t.Fatalf("assignment after accept %+v", got)
	}
	hist, _ := get[cluster.HistoryStarts](h, schema.HistoryKey("with"))
	wantStart := cluster.HistoryStart{Epoch: 2, RecordTail: 42, CursorEventTail: 3, Node: target}
	if len(hist) != 2 || hist[1] != wantStart || resp.Msg.GetStart().GetRecordTail() != 42 {
		t.Fatalf("history %+v, response start %v; want start %+v appended", hist, resp.Msg.GetStart(), wantStart)
	}
	if r, ok := get[cluster.Recovery](h, schema.RecoveryKey("with")); ok && r.FromEpoch == 1 {
		t.Fatalf("accept left the pending recovery %+v", r)
	}

	// No heartbeat from the new owner: no start is recorded.
	h.recovery("without", "")
	resp, err = c.AcceptOwnerLoss(ctx, connect.NewRequest(&strandv1.AcceptOwnerLossRequest{Stream: "without", Who: "ops", Why: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetStart() != nil {
		t.Fatalf("start %v recorded without a heartbeat", resp.Msg.GetStart())
	}
	if _, ok := get[cluster.HistoryStarts](h, schema.HistoryKey("without")); ok {
		t.Fatal("history written without a heartbeat")
	}
	if got, _ := get[cluster.Assignment](h, schema.AssignmentKey("without")); got.Epoch != 2 || got.Owner == an.Owner {
		t.Fatalf("assignment %+v", got)
	}
}

func TestSuspectedOwnerFailsProbe(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3"} {
		h.broker(n)
	}
	var probes atomic.Int64
	var failProbe atomic.Bool
	_, c := h.leader(Config{Probe: func(ctx context.Context, addr string) error {
		probes.Add(1)
		if failProbe.Load() {
			return errors.New("refused")
		}
		return nil
	}})
	a, _ := get[cluster.Assignment](h, schema.AssignmentKey(create(t, c, "s", 3, nil).GetAssignment().GetStream()))
	suspect := map[string]cluster.CopyTails{"s": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 3, Suspect: a.Owner}}
	h.heartbeat(a.Followers[0], suspect)

	// The owner answers its probe: no recovery while the loop keeps probing.
	clustertest.Eventually(t, 15*time.Second, "owner probed twice", func() bool { return probes.Load() >= 2 })
	if _, ok := get[cluster.Recovery](h, schema.RecoveryKey("s")); ok {
		t.Fatal("recovery recorded though the owner answered its probe")
	}
	failProbe.Store(true)
	h.heartbeat(a.Followers[0], suspect)
	rec := h.recovery("s", "")
	if rec.OldOwner != a.Owner || rec.ProposedOwner != a.Followers[0] || rec.FenceEpoch != 2 {
		t.Fatalf("recovery %+v", rec)
	}
}

func TestOldOwnerRejoinsByFastPath(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3"} {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	ctx := ctxT(t)
	a, _ := get[cluster.Assignment](h, schema.AssignmentKey(create(t, c, "s", 3, nil).GetAssignment().GetStream()))
	h.kill(a.Owner)
	rec := h.recovery("s", "")
	if len(rec.AddedMembers) != 0 {
		t.Fatalf("no live non-member exists, yet recovery adds %v", rec.AddedMembers)
	}

	// The recoverer's commit, as it would write it: the followers sealed,
	// the proposal promoted, the start appended.
	next := cluster.Assignment{Stream: "s", Epoch: 2, Owner: rec.ProposedOwner, Policy: rec.Policy}
	for _, f := range a.Followers {
		if f != rec.ProposedOwner {
			next.Followers = append(next.Followers, f)
		}
	}
	starts := cluster.HistoryStarts{{Epoch: 2, RecordTail: 5, Node: next.Owner}}
	if _, err := h.cli.Txn(ctx).Then(
		clientv3.OpPut(schema.AssignmentKey("s"), cluster.Encode(next)),
		clientv3.OpDelete(schema.RecoveryKey("s")),
		clientv3.OpPut(schema.HistoryKey("s"), cluster.Encode(starts)),
	).Commit(); err != nil {
		t.Fatal(err)
	}

	// The old owner returns with its sealed copy: it is added back as a
	// follower at epoch 2, without another recovery.
	h.broker(a.Owner)
	h.heartbeat(a.Owner, map[string]cluster.CopyTails{"s": {Epoch: 1, Role: cluster.RoleSealed, RecordTail: 6, SealEpoch: 2}})
	var got cluster.Assignment
	clustertest.Eventually(t, 15*time.Second, "old owner rejoins", func() bool {
		got, _ = get[cluster.Assignment](h, schema.AssignmentKey("s"))
		return got.Includes(a.Owner)
	})
	if got.Epoch != 2 || got.Owner != next.Owner || !slices.Contains(got.Followers, a.Owner) || got.Copies() != 3 {
		t.Fatalf("rejoined assignment %+v", got)
	}
	if _, ok := get[cluster.Recovery](h, schema.RecoveryKey("s")); ok {
		t.Fatal("rejoin recorded a recovery")
	}
	if hist, _ := get[cluster.HistoryStarts](h, schema.HistoryKey("s")); len(hist) != 1 {
		t.Fatalf("history grew on rejoin: %+v", hist)
	}
}

// TestPlacementSkipsBrokerFailingProbe: brokers write their heartbeats on
// change, so one holding no copy of a stream gives no sign of life in it,
// and a killed one stays registered until its lease ends. The broker that
// placement picks to restore a stream's copies is probed first; one that
// fails is passed over for another.
func TestPlacementSkipsBrokerFailingProbe(t *testing.T) {
	h := newHarness(t)
	for i, n := range []string{"b1", "b2", "b3", "b4"} {
		h.brokerAt(n, fmt.Sprintf("127.0.0.1:%d", i+1))
		h.heartbeat(n, nil)
	}
	var mu sync.Mutex
	var probed []string
	_, _ = h.leader(Config{Probe: func(ctx context.Context, addr string) error {
		mu.Lock()
		defer mu.Unlock()
		probed = append(probed, addr)
		if len(probed) == 1 {
			return errors.New("connection refused")
		}
		return nil
	}})
	ctx := ctxT(t)
	spec := cluster.StreamSpec{Name: "s", Copies: 3, Policy: cluster.DefaultPolicy, Created: time.Now().UTC()}
	a := cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1", Followers: []string{"b2"}, Policy: cluster.DefaultPolicy}
	if _, err := h.cli.Txn(ctx).Then(
		clientv3.OpPut(schema.StreamKey("s"), cluster.Encode(spec)),
		clientv3.OpPut(schema.AssignmentKey("s"), cluster.Encode(a)),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	var got cluster.Assignment
	clustertest.Eventually(t, 15*time.Second, "a third copy placed", func() bool {
		got, _ = get[cluster.Assignment](h, schema.AssignmentKey("s"))
		return got.Copies() == 3
	})
	added := got.Followers[1]
	mu.Lock()
	defer mu.Unlock()
	if len(probed) == 0 {
		t.Fatalf("placed %s without probing it", added)
	}
	first := probed[0]
	if addr := "127.0.0.1:" + added[1:]; addr == first || (added != "b3" && added != "b4") {
		t.Fatalf("placed %s (%s) after the probe of %s failed; probes %v", added, addr, first, probed)
	}
}
