package app_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/recoverer/app"
)

// Many streams failing over at once are recovered concurrently, but no more
// than MaxInFlight at a time: every stream's seal round waits for a slot,
// and every recovery still commits.
func TestRecoveriesInFlightAreBounded(t *testing.T) {
	e := newEnv(t)
	const streams, limit = 30, 4
	b1 := startFakeBroker(t, "b1", fail, 0, 0)
	b2 := startFakeBroker(t, "b2", answer, 10, 0)
	b3 := startFakeBroker(t, "b3", answer, 10, 0)
	for _, b := range []*fakeBroker{b1, b2, b3} {
		b.register(t, e)
	}
	// b2 holds every seal until the test opens the gate, counting the
	// rounds it holds at once (one seal of b2 per round).
	var mu sync.Mutex
	active, most := 0, 0
	gate := make(chan struct{})
	b2.setHook(func(int) {
		mu.Lock()
		active++
		most = max(most, active)
		mu.Unlock()
		<-gate
		mu.Lock()
		active--
		mu.Unlock()
	})
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	for i := range streams {
		s := fmt.Sprintf("orders-%02d", i)
		a := cluster.Assignment{Stream: s, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}
		e.put(t, e.schema.AssignmentKey(s), a)
		e.put(t, e.schema.RecoveryKey(s), cluster.Recovery{
			Stream: s, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t-" + s,
			OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2", Reason: "owner lease expired", Created: time.Now(),
		})
	}
	e.startRecoverer(t, "r1", func(c *app.Config) { c.MaxInFlight = limit })

	clustertest.Eventually(t, 10*time.Second, fmt.Sprintf("%d seal rounds held at b2", limit), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return active >= limit
	})
	close(gate)
	clustertest.Eventually(t, 30*time.Second, "every recovery is committed", func() bool {
		resp, err := e.cli.Get(context.Background(), e.schema.RecoveriesDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if most != limit {
		t.Fatalf("%d seal rounds at once, want %d (MaxInFlight)", most, limit)
	}
	for i := range streams {
		s := fmt.Sprintf("orders-%02d", i)
		got, _ := get[cluster.Assignment](t, e, e.schema.AssignmentKey(s))
		if got.Epoch != 4 || got.Owner == "b1" {
			t.Errorf("%s after its recovery: %+v", s, got)
		}
	}
}
