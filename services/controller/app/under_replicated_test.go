package app

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
)

// metric reads one unlabelled series from the controller's /metrics.
func metric(t *testing.T, addr, name string) (float64, bool) {
	t.Helper()
	resp, err := rpcserver.HTTPClient().Get(rpcserver.BaseURL(addr) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("series %s: %q: %v", name, v, err)
			}
			return f, true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return 0, false
}

// untilMetric waits until the series reads want.
func untilMetric(t *testing.T, addr, name string, want float64) {
	t.Helper()
	clustertest.Eventually(t, 15*time.Second, fmt.Sprintf("%s reads %v", name, want), func() bool {
		v, ok := metric(t, addr, name)
		return ok && v == want
	})
}

// underReplicated returns the stream's under_replicated entry, if listed.
func underReplicated(t *testing.T, c strandv1connect.AdminServiceClient, stream string) (*strandv1.AttentionEntry, bool) {
	t.Helper()
	for _, e := range attentionOf(t, c, stream) {
		if e.GetKind() == "under_replicated" {
			return e, true
		}
	}
	return nil, false
}

func copyRow(t *testing.T, c strandv1connect.AdminServiceClient, stream, node string) (*strandv1.CopyStatus, []*strandv1.CopyStatus) {
	t.Helper()
	res, err := c.GetStream(ctxT(t), connect.NewRequest(&strandv1.GetStreamRequest{Name: stream}))
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range res.Msg.GetCopies() {
		if cs.GetNode() == node {
			return cs, res.Msg.GetCopies()
		}
	}
	return nil, res.Msg.GetCopies()
}

// publishAll has every member of a publish tails at a's epoch, all at rt.
func (h *harness) publishAll(a cluster.Assignment, rt uint64) {
	h.t.Helper()
	for _, m := range a.Members() {
		role := cluster.RoleFollower
		if m == a.Owner {
			role = cluster.RoleOwner
		}
		h.heartbeat(m, map[string]cluster.CopyTails{a.Stream: {Epoch: a.Epoch, Role: role, RecordTail: rt, ConfirmWatermark: rt}})
	}
}

// A follower's broker dies: the stream is under-replicated in attention,
// its copy is listed not live with its lag unknown, and the metric reads
// 1; when the broker is back and its copy in sync, both clear.
func TestDeadFollowerUnderReplicated(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3"} {
		h.broker(n)
	}
	app, c := h.leader(Config{})
	a, _ := get[cluster.Assignment](h, schema.AssignmentKey(create(t, c, "s", 3, nil).GetAssignment().GetStream()))
	h.publishAll(a, 10)
	untilMetric(t, app.Addr(), "strand_controller_streams", 1)
	untilMetric(t, app.Addr(), "strand_controller_under_replicated_streams", 0)
	if e, ok := underReplicated(t, c, "s"); ok {
		t.Fatalf("a whole stream listed under-replicated: %v", e)
	}

	dead := a.Followers[1]
	h.kill(dead)
	untilMetric(t, app.Addr(), "strand_controller_under_replicated_streams", 1)
	e, ok := underReplicated(t, c, "s")
	if !ok || !slices.Equal(e.GetMissing(), []string{dead}) || e.GetSince() == nil ||
		!strings.HasPrefix(e.GetReason(), "2 of 3 copies live and in sync at epoch 1; follower copy on "+dead+" is down") ||
		!strings.HasPrefix(e.GetAction(), dead+" missing since ") || !strings.Contains(e.GetAction(), ": replace at ") {
		t.Fatalf("under_replicated entry %v (listed %v), want %s missing with since, reason and action", e, ok, dead)
	}
	row, rows := copyRow(t, c, "s", dead)
	if row == nil || row.GetLive() || row.Lag != nil || row.GetInSync() || row.GetState() != "down" || row.GetSince() == nil ||
		row.GetRole() != cluster.RoleFollower || len(rows) != 3 {
		t.Fatalf("dead follower's row %v of %v: want not live, lag unknown, down, since set", row, rows)
	}
	if _, ok := metric(t, app.Addr(), "strand_controller_pending_recoveries"); !ok {
		t.Fatal("no pending recoveries gauge")
	}
	// A controller that does not lead counts nothing, so a sum over the
	// controllers counts the stream once.
	standby := h.controller(Config{Name: "standby"})
	if v, ok := metric(t, standby.Addr(), "strand_controller_under_replicated_streams"); !ok || v != 0 || standby.Leading() {
		t.Fatalf("standby reads %v (%v) under-replicated streams, leading %v", v, ok, standby.Leading())
	}
	if v, _ := metric(t, standby.Addr(), "strand_controller_leader"); v != 0 {
		t.Fatalf("standby's leader gauge reads %v", v)
	}
	if v, _ := metric(t, app.Addr(), "strand_controller_leader"); v != 1 {
		t.Fatalf("leader's leader gauge reads %v", v)
	}

	// Back, and caught up: the stream is whole again.
	h.broker(dead)
	h.publishAll(a, 10)
	untilMetric(t, app.Addr(), "strand_controller_under_replicated_streams", 0)
	if e, ok := underReplicated(t, c, "s"); ok {
		t.Fatalf("under_replicated still listed after the follower came back: %v", e)
	}
	if row, _ := copyRow(t, c, "s", dead); !row.GetLive() || !row.GetInSync() || row.Lag == nil || row.GetLag() != 0 || row.GetSince() != nil {
		t.Fatalf("returned follower's row %v", row)
	}
}

// A failover drops the dead owner from the assignment: the stream still
// counts three copies, and the dropped owner is listed as missing, until
// it returns and rejoins as a follower.
func TestFailoverDroppedOwnerListedMissing(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3"} {
		h.broker(n)
	}
	app, c := h.leader(Config{})
	ctx := ctxT(t)
	a, _ := get[cluster.Assignment](h, schema.AssignmentKey(create(t, c, "s", 3, nil).GetAssignment().GetStream()))
	h.publishAll(a, 10)
	h.kill(a.Owner)
	rec := h.recovery("s", "")

	// The recoverer's commit, as it would write it: no live broker holds
	// no copy, so the recovery added none, and the dead owner is left out.
	next := cluster.Assignment{Stream: "s", Epoch: 2, Owner: rec.ProposedOwner, Policy: rec.Policy, Incarnation: a.Incarnation}
	for _, f := range a.Followers {
		if f != rec.ProposedOwner {
			next.Followers = append(next.Followers, f)
		}
	}
	if _, err := h.cli.Txn(ctx).Then(
		clientv3.OpPut(schema.AssignmentKey("s"), cluster.Encode(next)),
		clientv3.OpDelete(schema.RecoveryKey("s")),
		clientv3.OpPut(schema.HistoryKey("s"), cluster.Encode(cluster.HistoryStarts{{Epoch: 2, RecordTail: 10, Node: next.Owner}})),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	h.publishAll(next, 10)
	clustertest.Eventually(t, 15*time.Second, "the dropped owner listed under_replicated", func() bool {
		e, ok := underReplicated(t, c, "s")
		return ok && slices.Equal(e.GetMissing(), []string{a.Owner})
	})
	e, _ := underReplicated(t, c, "s")
	if !strings.Contains(e.GetReason(), "owner copy on "+a.Owner+" was left out of the assignment at epoch 2") ||
		!strings.HasPrefix(e.GetAction(), "nothing: every live broker holds a copy already") || e.GetSince() == nil {
		t.Fatalf("under_replicated entry %v", e)
	}
	row, rows := copyRow(t, c, "s", a.Owner)
	if len(rows) != 3 || row == nil || row.GetState() != "missing" || row.GetLive() || row.Lag != nil || row.GetRole() != cluster.RoleOwner {
		t.Fatalf("copies %v: want the dropped owner as a third, missing row", rows)
	}
	untilMetric(t, app.Addr(), "strand_controller_under_replicated_streams", 1)

	// It returns with its sealed copy and rejoins on the fast path; caught
	// up at epoch 2, the stream is whole.
	h.broker(a.Owner)
	h.heartbeat(a.Owner, map[string]cluster.CopyTails{"s": {Epoch: 1, Role: cluster.RoleSealed, RecordTail: 10, SealEpoch: 2}})
	var got cluster.Assignment
	clustertest.Eventually(t, 15*time.Second, "old owner rejoins", func() bool {
		got, _ = get[cluster.Assignment](h, schema.AssignmentKey("s"))
		return got.Includes(a.Owner)
	})
	h.publishAll(got, 10)
	untilMetric(t, app.Addr(), "strand_controller_under_replicated_streams", 0)
	if e, ok := underReplicated(t, c, "s"); ok {
		t.Fatalf("under_replicated still listed after the old owner rejoined: %v", e)
	}
}
