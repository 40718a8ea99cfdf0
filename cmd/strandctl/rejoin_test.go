package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// TestKilledOwnerNotAddedBackWhileDead: after an eager failover (the owner
// SIGKILLed; followers suspect it, the controller's probe fails), the dead
// owner's broker key and heartbeat live on until its lease expires. The
// controller must not take that stale heartbeat for a copy that is "live
// again" and add the dead broker back as a follower on the fast path
// (docs/protocol.md, "The fast path": a left-out copy that is live again
// is added back): the assignment would count a dead copy in E, and the next
// recovery would need more answers (E=3, W=2: R=2 instead of R=1).
func TestKilledOwnerNotAddedBackWhileDead(t *testing.T) {
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
	clustertest.Eventually(t, 20*time.Second, "recovery committed", func() error {
		if a, _ := p.Assignment(stream); a.Epoch == a0.Epoch || p.recoveryPending(stream) {
			return fmt.Errorf("assignment %+v", a)
		}
		return nil
	})
	// Until the dead broker's lease expires, and after, the assignment
	// must not name it.
	clustertest.Eventually(t, 15*time.Second, "the killed owner's lease expired", func() error {
		if a, _ := p.Assignment(stream); a.Includes(owner) {
			t.Fatalf("assignment %+v names %s, which was SIGKILLed and judged lost; its stale heartbeat was taken for a returning copy", a, owner)
		}
		if _, registered := clustertest.Get[cluster.BrokerInfo](p.View, p.Schema.BrokerKey(owner)); registered {
			return fmt.Errorf("%s still registered", owner)
		}
		return nil
	})
	if a, _ := p.Assignment(stream); a.Includes(owner) {
		t.Fatalf("assignment %+v names the dead %s", a, owner)
	}
}
