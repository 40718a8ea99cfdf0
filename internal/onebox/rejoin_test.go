package onebox

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestLocalDurableOldOwnerRejoins: under local_durable (W = every copy) a
// failover leaves the stream with one copy fewer than its spec. Adding the
// old owner back raises W, so it is not a fast-path change; the controller
// must still bring the stream back to its copies, through a recovery, as
// UpdateStream does for a change that raises W (Replenish reports it
// blocked and the liveness loop records the recovery).
func TestLocalDurableOldOwnerRejoins(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "every"
	a0 := c.CreateStream(stream, 3, cluster.Policy{Name: cluster.LocalDurable})
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("x", 10)...)
	c.StopBroker(a0.Owner)
	a1 := waitRecovered(t, c, stream, a0.Epoch, 15*time.Second)
	c.StartBroker(a0.Owner)
	a2 := c.WaitAssignment(stream, 20*time.Second, a0.Owner+" added back", func(a cluster.Assignment) error {
		if !slices.Contains(a.Followers, a0.Owner) {
			entries, _ := c.Attention(stream)
			return fmt.Errorf("assignment %+v (was %+v; the spec asks for 3 copies), attention %s", a, a1, describe(entries))
		}
		return nil
	})
	c.WaitApplied(a2)
	publishAll(t, c, stream, l, "after")
	verify(t, c, a0.Owner, stream, l)
}
