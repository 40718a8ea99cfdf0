package onebox

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// TestSealedRawTailWithOlderSuffixLosesNoConfirmedRecord: the known limit
// (docs/limits.md) that a copy whose broker did not apply its last role
// change before being sealed holds a raw tail that can include an older
// owner's unconfirmed suffix must not cost confirmed records.
//
// b1 owned epoch 1 and holds 30 unconfirmed records (tail 40). Epoch 2 is
// recovered onto b2 at 10 (start {2, 10, b2}) and confirms 5 records
// (10..14) on b2 and b3. b1 returns; the controller adds it back on the fast
// path, and b2 is lost before b1 applied that assignment, so the seal of
// the next recovery finds b1 still on epoch 1's history (the test seals b1
// just before writing the assignment that adds it, which leaves b1 in the
// same state as a seal arriving before it applied it). Had the seal answered
// its raw tail 40, the recoverer would pick b1 over b3 (15) and record the start
// {3, 40, b1}; applying epoch 3, b1 would cut at 10 and lose the records
// confirmed at epoch 2. So the seal reports the tails the copy will have
// after its cut (replica.effectiveTails), and the recoverer picks b3. No
// controller runs: the test writes the recoveries and assignments
// the controller would; the recoverer is real.
func TestSealedRawTailWithOlderSuffixLosesNoConfirmedRecord(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3"}, Recoverers: 1})
	const stream = "raw"
	placeWithTenRecords(t, c, stream)
	c.StopBroker("b2")
	c.StopBroker("b3")
	publishUnconfirmed(t, c, "b1", stream, Numbered("e1-unconfirmed", 30))
	waitTails(t, c, "b1", stream, 40, 0)
	c.StopBroker("b1")
	c.StartBroker("b2")
	c.StartBroker("b3")
	// b1 is removed, as the controller does for a copy missing past
	// --replace-after, so the assignment that adds it back comes later.
	c.Put(c.Schema.RecoveryKey(stream), cluster.Recovery{Stream: stream, FromEpoch: 1, FenceEpoch: 2, TransitionID: "t2",
		OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2", RemovedMembers: []string{"b1"}, Policy: majority, Reason: "owner b1 lost"})
	a2 := c.WaitAssignment(stream, 15*time.Second, "epoch 2 committed", func(a cluster.Assignment) error {
		if a.Epoch != 2 {
			return fmt.Errorf("%+v", a)
		}
		return nil
	})
	c.WaitApplied(a2)
	confirmed := c.Publish(a2.Owner, stream, Numbered("e2", 5)...)
	other := a2.Followers[0]
	waitTails(t, c, other, stream, 15, 0)

	c.StartBroker("b1")
	if _, err := c.Replication("b1").Seal(c.Ctx(), connect.NewRequest(&strandv1.SealRequest{Stream: stream, FenceEpoch: 3, TransitionId: "t3"})); err != nil {
		t.Fatal(err)
	}
	back := a2
	back.Followers = append(append([]string(nil), a2.Followers...), "b1")
	c.Put(c.Schema.AssignmentKey(stream), back)
	c.StopBroker(a2.Owner)
	c.Put(c.Schema.RecoveryKey(stream), cluster.Recovery{Stream: stream, FromEpoch: 2, FenceEpoch: 3, TransitionID: "t3",
		OldOwner: a2.Owner, OldFollowers: back.Followers, ProposedOwner: other, Policy: majority, Reason: "owner lost"})
	a3 := c.WaitAssignment(stream, 15*time.Second, "epoch 3 committed", func(a cluster.Assignment) error {
		if a.Epoch != 3 {
			return fmt.Errorf("%+v", a)
		}
		return nil
	})
	clustertest.Eventually(t, 10*time.Second, "the records confirmed at epoch 2 on the new owner", func() error {
		got, err := c.ReadAll(a3.Owner, stream)
		if err != nil {
			return err
		}
		p := Payloads(got)
		for i, off := range confirmed {
			if int(off) >= len(p) || p[off] != fmt.Sprintf("e2-%03d", i) {
				tt, _ := c.Tails(a3.Owner, stream)
				return fmt.Errorf("confirmed e2-%03d at %d missing: owner %s shows %v, publishes %+v; history %+v",
					i, off, a3.Owner, p, tt, c.History(stream))
			}
		}
		return nil
	})
}
