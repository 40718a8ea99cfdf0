package main

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// TestKilledOwnerKeptWhileDead: after an eager failover (the owner
// SIGKILLed; followers suspect it, the controller's probe fails), the
// recovery keeps the dead owner's copy as a follower, so it can rejoin from
// its own tail (docs/protocol.md, "Replacing a missing copy"). Its broker
// key and stale heartbeat live on until its lease expires; neither while
// they do nor after does the controller change the assignment again: the
// copy is replaced only after --replace-after (10m here), and E, W and R
// stay those of the stream before the kill.
func TestKilledOwnerKeptWhileDead(t *testing.T) {
	p := startProcCluster(t)
	const stream = "dead-owner"
	if _, err := p.client.Admin().CreateStream(p.ctx(), connect.NewRequest(&strandv1.CreateStreamRequest{
		Name: stream, Copies: 3, Policy: &strandv1.ConfirmPolicy{Name: cluster.MajorityDurable},
	})); err != nil {
		t.Fatal(err)
	}
	a0, _ := p.Assignment(stream)
	p.WaitApplied(a0, 20*time.Second, nil)
	for i := range 20 {
		if _, err := p.client.Publish(p.ctx(), stream, []*strandv1.Record{{Payload: []byte(fmt.Sprint(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	owner := a0.Owner
	if err := p.cl.Kill(owner, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.cl.Wait(p.ctx(), owner); err != nil {
		t.Fatal(err)
	}
	var a1 cluster.Assignment
	clustertest.Eventually(t, 20*time.Second, "recovery committed", func() error {
		a, _ := p.Assignment(stream)
		if a.Epoch == a0.Epoch || p.recoveryPending(stream) {
			return fmt.Errorf("assignment %+v", a)
		}
		a1 = a
		return nil
	})
	if !slices.Contains(a1.Followers, owner) || a1.Copies() != a0.Copies() {
		t.Fatalf("recovered assignment %+v: want the 3 old copies, the killed %s a follower", a1, owner)
	}
	// Until the dead broker's lease expires, and after, the assignment
	// stays as recovered.
	clustertest.Eventually(t, 15*time.Second, "the killed owner's lease expired", func() error {
		if a, _ := p.Assignment(stream); fmt.Sprint(a) != fmt.Sprint(a1) {
			t.Fatalf("assignment %+v changed from %+v while %s was away", a, a1, owner)
		}
		if _, registered := clustertest.Get[cluster.BrokerInfo](p.View, p.Schema.BrokerKey(owner)); registered {
			return fmt.Errorf("%s still registered", owner)
		}
		return nil
	})
	if a, _ := p.Assignment(stream); fmt.Sprint(a) != fmt.Sprint(a1) || p.recoveryPending(stream) {
		t.Fatalf("assignment %+v changed from %+v after %s's lease ended", a, a1, owner)
	}
}
