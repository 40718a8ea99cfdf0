package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestWithdrawnFailoverOfLiveOwnerServesAgain runs real brokers, controller
// and recoverer: an operator fails over a stream whose owner is live, the
// recoverer seals the owner's copy at the fence epoch, and the operator
// withdraws the recovery before it commits. Both followers are down, so the
// recoverer has fewer than R answers and cannot commit first. The owner's
// copy stays sealed past its assignment and refuses publishes, so the
// controller records a new recovery at the same fence epoch, which shows
// under attention while it waits for copies and commits once they return;
// the stream then takes publishes again, with every confirmed record kept,
// and no operator acts after the withdrawal.
func TestWithdrawnFailoverOfLiveOwnerServesAgain(t *testing.T) {
	c := onebox.Start(t, onebox.Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1, Recoverers: 1})
	const stream = "withdrawn-live"
	a0 := c.CreateStream(stream, 3, cluster.Policy{Name: cluster.MajorityDurable})
	cl := c.Client()
	l := ledger.New()
	publish := func(payloads ...string) {
		t.Helper()
		for _, p := range payloads {
			ctx, cancel := context.WithTimeout(c.Ctx(), 30*time.Second)
			res, err := cl.Publish(ctx, stream, []*strandv1.Record{{Payload: []byte(p)}})
			cancel()
			if err != nil {
				t.Fatalf("publish %s: %v", p, err)
			}
			l.Confirm(p, res.GetOffsets()[0], res.GetEpoch())
		}
	}
	publish(onebox.Numbered("before", 10)...)

	f1, f2 := a0.Followers[0], a0.Followers[1]
	c.StopBroker(f1)
	c.StopBroker(f2)
	resp, err := c.Admin().Failover(c.Ctx(), connect.NewRequest(&strandv1.FailoverRequest{Stream: stream, Who: "onebox", Why: "test"}))
	if err != nil {
		t.Fatalf("failover: %v", err)
	}
	fence, first := resp.Msg.GetRecovery().GetFenceEpoch(), resp.Msg.GetRecovery().GetTransitionId()
	clustertest.Eventually(t, 15*time.Second, "the live owner's copy sealed at the fence epoch", func() error {
		if tt, ok := c.Tails(a0.Owner, stream); !ok || tt.SealEpoch != fence {
			return fmt.Errorf("%s publishes %+v (present %v)", a0.Owner, tt, ok)
		}
		return nil
	})
	if _, err := c.Admin().WithdrawRecovery(c.Ctx(), connect.NewRequest(&strandv1.WithdrawRecoveryRequest{Stream: stream, Who: "onebox", Why: "test"})); err != nil {
		t.Fatalf("withdraw: %v", err)
	}

	clustertest.Eventually(t, 15*time.Second, "a new recovery at the same fence epoch", func() error {
		r, ok := c.Recovery(stream)
		switch {
		case !ok:
			return fmt.Errorf("none pending")
		case r.TransitionID == first:
			return fmt.Errorf("still the withdrawn transition %s", first)
		case r.FromEpoch != a0.Epoch || r.FenceEpoch != fence:
			return fmt.Errorf("recovery %+v, want from epoch %d at fence epoch %d", r, a0.Epoch, fence)
		}
		return nil
	})
	// The controller logs once its write has succeeded, so just after it.
	clustertest.Eventually(t, 10*time.Second, "the new recovery logged", func() error {
		if _, ok := c.Log("controller-1").Find("copies sealed past their assignment with no recovery pending; pending recovery recorded",
			map[string]any{"stream": stream, "fence_epoch": fence}); !ok {
			return fmt.Errorf("controller log ends:\n%s", c.Log("controller-1").Tail(10))
		}
		return nil
	})
	clustertest.Eventually(t, 15*time.Second, "the wait shown under attention", func() error {
		entries, err := c.Attention(stream)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.GetKind() == "recovery_waiting_copies" {
				return nil
			}
		}
		return fmt.Errorf("attention %v", entries)
	})

	c.StartBroker(f1)
	c.StartBroker(f2)
	a1 := c.WaitAssignment(stream, 20*time.Second, "recovered at the fence epoch", func(a cluster.Assignment) error {
		if r, pending := c.Recovery(stream); pending || a.Epoch != fence {
			return fmt.Errorf("assignment %+v, recovery pending %v (%+v)", a, pending, r)
		}
		return nil
	})
	c.WaitApplied(a1)
	publish("after")
	clustertest.Eventually(t, 10*time.Second, "the new owner shows every confirmed record", func() error {
		recs, err := c.ReadAll(a1.Owner, stream)
		if err != nil {
			return err
		}
		if found, problems := l.Verify(recs); found != l.Count() || len(problems) > 0 {
			return fmt.Errorf("%d of %d confirmed records found; %v", found, l.Count(), problems)
		}
		return nil
	})
}
