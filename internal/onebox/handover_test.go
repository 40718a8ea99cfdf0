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

// publishing starts a publisher on stream through the Go client, recording
// every confirm in l, and waits until it confirmed n records.
func publishing(t *testing.T, c *Cluster, stream, prefix string, l *ledger.Ledger, n int) *ledger.Publisher {
	t.Helper()
	cl := c.Client()
	p := ledger.Start(cl.Publish, stream, prefix, 4, 20*time.Second, l)
	t.Cleanup(p.Stop)
	more(t, l, n, p)
	return p
}

// more waits until l holds n more confirms than now.
func more(t *testing.T, l *ledger.Ledger, n int, p *ledger.Publisher) {
	t.Helper()
	want := l.Count() + n
	clustertest.Eventually(t, 30*time.Second, fmt.Sprintf("%d records confirmed", want), func() error {
		if l.Count() >= want {
			return nil
		}
		return fmt.Errorf("%d confirmed; last publish error: %s", l.Count(), p.LastError())
	})
}

// oneOwner checks that exactly one live copy of stream reports itself its
// owner at the assignment's epoch, the assignment's owner, and no other copy
// takes publishes.
func oneOwner(t *testing.T, c *Cluster, stream string, a cluster.Assignment, nodes []string) {
	t.Helper()
	clustertest.Eventually(t, 20*time.Second, stream+" has one owner", func() error {
		var owners []string
		for _, n := range nodes {
			if c.Broker(n) == nil {
				continue
			}
			if tl, ok := c.Tails(n, stream); ok && tl.Role == cluster.RoleOwner {
				owners = append(owners, fmt.Sprintf("%s@%d", n, tl.Epoch))
			}
		}
		if len(owners) != 1 || owners[0] != fmt.Sprintf("%s@%d", a.Owner, a.Epoch) {
			return fmt.Errorf("owners %v, assignment %+v", owners, a)
		}
		return nil
	})
}

// TestHandoverMovesOwnerLosesNothing: with publishing throughout, a
// failover to a chosen follower moves the owner there at the next epoch
// through the seal path, and every confirmed record is on the new owner at
// its confirmed offset.
func TestHandoverMovesOwnerLosesNothing(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "handover"
	a0 := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	p := publishing(t, c, stream, "h", l, 50)
	target := a0.Followers[1]

	resp, err := c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: target, Who: "test", Why: "handover"}))
	if err != nil {
		t.Fatalf("handover to %s: %v", target, err)
	}
	if got := resp.Msg.GetRecovery(); got.GetReason() != "handover" || got.GetProposedOwner() != target {
		t.Fatalf("recovery %v: want reason handover proposing %s", got, target)
	}
	if a := resp.Msg.GetAssignment(); a.GetOwner() != target || a.GetEpoch() != a0.Epoch+1 {
		t.Fatalf("committed assignment %v: want owner %s at epoch %d", a, target, a0.Epoch+1)
	}
	more(t, l, 50, p)
	p.Stop()
	a1, _ := c.Assignment(stream)
	oneOwner(t, c, stream, a1, a0.Members())
	verify(t, c, target, stream, l)
	if l.AtEpoch(a1.Epoch) == 0 {
		t.Fatalf("no record confirmed at epoch %d", a1.Epoch)
	}
}

// TestHandoverTargetKilledMidwayLeavesOneOwner: the target is crash-killed
// while the handover's recovery is pending (or just after it committed):
// the stream ends with one owner, by the seal path, and loses nothing.
func TestHandoverTargetKilledMidwayLeavesOneOwner(t *testing.T) {
	t.Parallel()
	handoverKilledMidway(t, "handover-kill-target", func(a cluster.Assignment, target string) string { return target })
}

// TestHandoverOwnerKilledMidwayLeavesOneOwner: the same with the paused
// owner crash-killed: an ordinary failover, one owner, nothing lost.
func TestHandoverOwnerKilledMidwayLeavesOneOwner(t *testing.T) {
	t.Parallel()
	handoverKilledMidway(t, "handover-kill-owner", func(a cluster.Assignment, _ string) string { return a.Owner })
}

// handoverKilledMidway hands stream over to its first follower and
// crash-kills the broker victim names once the handover is recorded.
func handoverKilledMidway(t *testing.T, stream string, victim func(a cluster.Assignment, target string) string) {
	c := three(t)
	a0 := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	p := publishing(t, c, stream, "k", l, 50)
	target := a0.Followers[0]
	killed := victim(a0, target)

	done := make(chan error, 1)
	go func() {
		_, err := c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: target}))
		done <- err
	}()
	clustertest.Eventually(t, 20*time.Second, "the handover recorded", func() bool {
		if r, ok := c.Recovery(stream); ok && r.Reason == "handover" {
			return true
		}
		a, _ := c.Assignment(stream)
		return a.Epoch > a0.Epoch
	})
	if err := <-c.KillBroker(killed); err != nil {
		t.Logf("kill %s: %v", killed, err)
	}
	// The call's answer depends on when the kill landed (committed, or an
	// error once the target was gone); the state below is what counts.
	if err := <-done; err != nil {
		t.Logf("handover call: %v", err)
	}

	a := c.WaitAssignment(stream, 60*time.Second, stream+" owned by a live broker", func(a cluster.Assignment) error {
		if a.Owner == killed {
			return fmt.Errorf("still owned by the killed %s at epoch %d", killed, a.Epoch)
		}
		if _, pending := c.Recovery(stream); pending {
			return fmt.Errorf("recovery pending")
		}
		return nil
	})
	more(t, l, 30, p)
	p.Stop()
	oneOwner(t, c, stream, a, a0.Members())
	verify(t, c, a.Owner, stream, l)
}

// TestDrainOwnerMovesEverything: draining the owner's broker, with
// publishing throughout, hands the stream over and replaces the drained
// copy; the stream serves throughout, loses nothing, and the drained
// broker owns and holds nothing.
func TestDrainOwnerMovesEverything(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3", "b4"}, Controllers: 1, Recoverers: 1})
	const stream = "drain"
	a0 := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	p := publishing(t, c, stream, "d", l, 50)
	node := a0.Owner

	resp, err := c.Admin().DrainBroker(c.Ctx(), connect.NewRequest(&strandv1.DrainBrokerRequest{Node: node, Who: "test", Why: "drain"}))
	if err != nil {
		t.Fatalf("drain %s: %v", node, err)
	}
	if !resp.Msg.GetBroker().GetDraining() {
		t.Fatalf("broker %v: want draining", resp.Msg.GetBroker())
	}
	a := c.WaitAssignment(stream, 60*time.Second, node+" drained from "+stream, func(a cluster.Assignment) error {
		if a.Includes(node) || a.Copies() != 3 {
			return fmt.Errorf("assignment %+v", a)
		}
		if _, pending := c.Recovery(stream); pending {
			return fmt.Errorf("recovery pending")
		}
		return nil
	})
	more(t, l, 30, p)
	p.Stop()
	if p.Errors() > 0 {
		t.Logf("%d publishes failed during the drain (retried by the publisher): %s", p.Errors(), p.LastError())
	}
	oneOwner(t, c, stream, a, []string{"b1", "b2", "b3", "b4"})
	verify(t, c, a.Owner, stream, l)
	clustertest.Eventually(t, 10*time.Second, node+" listed drained", func() error {
		br, err := c.Admin().ListBrokers(c.Ctx(), connect.NewRequest(&strandv1.ListBrokersRequest{}))
		if err != nil {
			return err
		}
		i := slices.IndexFunc(br.Msg.GetBrokers(), func(b *strandv1.Broker) bool { return b.GetNode() == node })
		if i < 0 || !br.Msg.GetBrokers()[i].GetDrained() || br.Msg.GetBrokers()[i].GetCopies() != 0 {
			return fmt.Errorf("brokers %v", br.Msg.GetBrokers())
		}
		return nil
	})

	// Drained, it takes no new copy; undrained, placement uses it again
	// (it holds the fewest copies).
	if got := c.CreateStream("drain-after", 3, majority); got.Includes(node) {
		t.Fatalf("a stream placed on the draining %s: %+v", node, got)
	}
	und, err := c.Admin().UndrainBroker(c.Ctx(), connect.NewRequest(&strandv1.UndrainBrokerRequest{Node: node}))
	if err != nil || und.Msg.GetBroker().GetDraining() {
		t.Fatalf("undrain %s: %v, %v", node, und, err)
	}
	if c.HasKey(c.Schema.DrainingKey(node)) {
		t.Fatalf("the drain of %s is still stored", node)
	}
	if got := c.CreateStream("undrained", 3, majority); !got.Includes(node) {
		t.Fatalf("a stream placed without the undrained %s, which holds the fewest copies: %+v", node, got)
	}
}

// TestDrainAndHandoverBadInput: an unknown node is NotFound; draining the
// last broker that could take a copy is FailedPrecondition and writes
// nothing; a handover to a node that is no follower is FailedPrecondition.
func TestDrainAndHandoverBadInput(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "drain-bad"
	a0 := c.CreateStream(stream, 3, majority)
	_, err := c.Admin().DrainBroker(c.Ctx(), connect.NewRequest(&strandv1.DrainBrokerRequest{Node: "b9"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("drain of an unknown broker: %v, want NotFound", err)
	}
	_, err = c.Admin().DrainBroker(c.Ctx(), connect.NewRequest(&strandv1.DrainBrokerRequest{Node: "b1"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("drain with no broker to take the copy: %v, want FailedPrecondition", err)
	}
	if c.HasKey(c.Schema.DrainingKey("b1")) {
		t.Fatal("a refused drain wrote its key")
	}
	_, err = c.Admin().DrainBroker(c.Ctx(), connect.NewRequest(&strandv1.DrainBrokerRequest{Node: "not a node"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("drain of an invalid node id: %v, want InvalidArgument", err)
	}
	_, err = c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: a0.Owner}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("handover to the owner: %v, want FailedPrecondition", err)
	}
	_, err = c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: "b9"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("handover to a node that is no follower: %v, want FailedPrecondition", err)
	}
	_, err = c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: "not a node"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("handover to an invalid node id: %v, want InvalidArgument", err)
	}
	_, err = c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, To: a0.Followers[0], CatchUpMs: 30_001}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("handover with a catch-up too long: %v, want InvalidArgument", err)
	}
	_, err = c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, CatchUpMs: 100}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a catch-up without a target: %v, want InvalidArgument", err)
	}
	_, err = c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: "nope", To: a0.Followers[0]}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("handover of a stream that does not exist: %v, want NotFound", err)
	}
	_, err = c.Admin().UndrainBroker(c.Ctx(), connect.NewRequest(&strandv1.UndrainBrokerRequest{Node: "b9"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("undrain of an unknown broker: %v, want NotFound", err)
	}
	if a, _ := c.Assignment(stream); a.Epoch != a0.Epoch {
		t.Fatalf("refused calls moved the stream: %+v", a)
	}
	if _, pending := c.Recovery(stream); pending {
		t.Fatal("a refused call recorded a recovery")
	}
}

// TestRebalanceHandsOwnersToARestartedBroker: a broker that stopped and
// came back owns nothing (its streams failed over); the controller's
// balancing hands streams back to it until every broker owns within one of
// even, through handovers that lose nothing.
func TestRebalanceHandsOwnersToARestartedBroker(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1, Recoverers: 1, RebalanceDelay: time.Second})
	streams := []string{"rb0", "rb1", "rb2", "rb3", "rb4", "rb5"}
	ledgers := map[string]*ledger.Ledger{}
	for _, s := range streams {
		c.CreateStream(s, 3, majority)
		ledgers[s] = ledger.New()
		publishAll(t, c, s, ledgers[s], Numbered(s+"-before", 5)...)
	}
	c.StopBroker("b1")
	for _, s := range streams {
		c.WaitAssignment(s, 30*time.Second, s+" owned away from b1", func(a cluster.Assignment) error {
			if a.Owner == "b1" {
				return fmt.Errorf("owned by b1 at epoch %d", a.Epoch)
			}
			return nil
		})
	}
	c.StartBroker("b1")
	clustertest.Eventually(t, 60*time.Second, "owners balanced over b1, b2, b3", func() error {
		owned := map[string]int{}
		for _, s := range streams {
			a, _ := c.Assignment(s)
			owned[a.Owner]++
			if _, pending := c.Recovery(s); pending {
				return fmt.Errorf("%s: recovery pending", s)
			}
		}
		if owned["b1"] != 2 || owned["b2"] != 2 || owned["b3"] != 2 {
			return fmt.Errorf("owned %v", owned)
		}
		return nil
	})
	plan, err := c.Admin().GetRebalancePlan(c.Ctx(), connect.NewRequest(&strandv1.GetRebalancePlanRequest{}))
	if err != nil || len(plan.Msg.GetMoves()) != 0 {
		t.Fatalf("plan once balanced: %v, %v", plan, err)
	}
	for _, s := range streams {
		publishAll(t, c, s, ledgers[s], Numbered(s+"-after", 5)...)
		a, _ := c.Assignment(s)
		verify(t, c, a.Owner, s, ledgers[s])
	}
}

// TestHandoverRPC: the owner's side of a handover. A target that cannot
// catch up (its broker is gone, and the owner took records since) is
// answered caught_up false with its tails, and the owner takes publishes
// again at once; a caught-up target holds the owner paused until resume;
// bad requests are refused naming the field, or as not the owner.
func TestHandoverRPC(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "handover-rpc"
	a := c.CreateStream(stream, 3, majority)
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("a", 10)...)
	gone, live := a.Followers[0], a.Followers[1]
	if err := <-c.KillBroker(gone); err != nil {
		t.Logf("kill %s: %v", gone, err)
	}
	publishAll(t, c, stream, l, Numbered("b", 10)...)

	owner := c.Replication(a.Owner)
	resp, err := owner.Handover(c.Ctx(), connect.NewRequest(&strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: gone, CatchUpMs: 200}))
	if err != nil {
		t.Fatalf("handover to %s: %v", gone, err)
	}
	if m := resp.Msg; m.GetCaughtUp() || m.GetTargetRecordTail() >= m.GetRecordTail() || m.GetRecordTail() < 20 {
		t.Fatalf("handover to the killed %s: %v, want not caught up, behind the owner's 20 records", gone, m)
	}
	publishAll(t, c, stream, l, Numbered("c", 5)...) // the owner resumed

	resp, err = owner.Handover(c.Ctx(), connect.NewRequest(&strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: live, HoldMs: 30_000}))
	if err != nil || !resp.Msg.GetCaughtUp() || resp.Msg.GetTargetRecordTail() != resp.Msg.GetRecordTail() {
		t.Fatalf("handover to %s: %v, %v; want caught up at the owner's tail", live, resp, err)
	}
	_, err = owner.Handover(c.Ctx(), connect.NewRequest(&strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: live}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("a second handover while paused: %v, want FailedPrecondition", err)
	}
	published := make(chan error, 1)
	go func() {
		_, err := c.Client().Publish(c.Ctx(), stream, []*strandv1.Record{{Payload: []byte("paused")}})
		published <- err
	}()
	if _, err := owner.Handover(c.Ctx(), connect.NewRequest(&strandv1.HandoverRequest{Stream: stream, Resume: true})); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := <-published; err != nil {
		t.Fatalf("publish after resume: %v", err)
	}

	for _, bad := range []struct {
		name string
		node string
		req  *strandv1.HandoverRequest
		code connect.Code
	}{
		{"epoch 0", a.Owner, &strandv1.HandoverRequest{Stream: stream, Target: live}, connect.CodeInvalidArgument},
		{"a bad target", a.Owner, &strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: "not a node"}, connect.CodeInvalidArgument},
		{"a catch-up too long", a.Owner, &strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: live, CatchUpMs: 60_001}, connect.CodeInvalidArgument},
		{"a bad stream", a.Owner, &strandv1.HandoverRequest{Stream: "Bad!", Epoch: a.Epoch, Target: live}, connect.CodeInvalidArgument},
		{"another epoch", a.Owner, &strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch + 1, Target: live}, connect.CodeFailedPrecondition},
		{"a target that is no follower", a.Owner, &strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: a.Owner}, connect.CodeFailedPrecondition},
		{"a broker that is not the owner", live, &strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: live}, connect.CodeFailedPrecondition},
	} {
		if _, err := c.Replication(bad.node).Handover(c.Ctx(), connect.NewRequest(bad.req)); connect.CodeOf(err) != bad.code {
			t.Errorf("%s: %v, want %v", bad.name, err, bad.code)
		}
	}
	if got, _ := c.Assignment(stream); got.Epoch != a.Epoch || got.Owner != a.Owner {
		t.Fatalf("the handover calls moved the stream: %+v", got)
	}
	verify(t, c, a.Owner, stream, l)
}
