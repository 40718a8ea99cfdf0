package onebox

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestFollowerPastOwnersTailShownUnderAttention: an operator accepts the
// loss of a two-copy stream whose owner and follower are both down; no copy
// is live, so the stream moves to a fresh broker, empty, and no history
// start is recorded (the new owner published nothing; docs/limits.md:
// a returning copy is then not cut back). The old follower returns holding
// records the new owner does not: its log is not a prefix of the owner's.
// A mismatch is an error shown under attention (chain_mismatch,
// docs/operating.md), never silent divergence.
//
// The follower's Follow is refused with OutOfRange ("past the owner's
// tail"); the follower treats that as a prefix mismatch and flags the copy,
// so attention lists it.
func TestFollowerPastOwnersTailShownUnderAttention(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "past"
	a0 := c.CreateStream(stream, 2, majority)
	owner, follower := a0.Owner, a0.Followers[0]
	publishAll(t, c, stream, ledger.New(), Numbered("c", 10)...)
	waitTails(t, c, follower, stream, 10, 0)
	// Both copies go while no controller runs: a controller seeing the
	// follower go first would replace it at once (two copies under
	// majority cannot confirm on one), and the test needs both down.
	c.StopController(1)
	c.StopBroker(follower)
	c.StopBroker(owner)
	c.StartController()
	waitPending(t, c, stream, "")
	resp, err := c.Admin().AcceptOwnerLoss(c.Ctx(), connect.NewRequest(&strandv1.AcceptOwnerLossRequest{Stream: stream, Who: "onebox", Why: "both copies down"}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.GetStart() != nil || len(c.History(stream)) != 0 {
		t.Fatalf("accepted %v with start %v; the test needs no start recorded", resp.Msg.GetAssignment(), resp.Msg.GetStart())
	}
	c.StartBroker(follower)
	clustertest.Eventually(t, 15*time.Second, "attention names the copy that cannot follow", func() error {
		entries, err := c.Attention(stream)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.GetNode() == follower && e.GetKind() != "broker_down" {
				return nil
			}
		}
		tt, _ := c.Tails(follower, stream)
		return fmt.Errorf("attention %s; %s publishes %+v", describe(entries), follower, tt)
	})
}
