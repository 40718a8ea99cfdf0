package app

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	strandv1 "github.com/strandhq/strand/internal/gen/strand/v1"
)

// After the followers are sealed at the next epoch, the old owner's batches
// are rejected: it confirms nothing after the fence (seed, "Safety argument").
func TestSealFencesTheStaleOwner(t *testing.T) {
	h := newHarness(t)
	h.confirm = 500 * time.Millisecond
	for _, n := range []string{"b1", "b2", "b3"} {
		h.start(n)
	}
	h.assign(threeCopies("fenced", cluster.Policy{Name: cluster.MajorityDurable}))
	h.publish("b1", "fenced", "a", "b")
	sealed := map[string]*strandv1.SealResponse{}
	for _, n := range []string{"b2", "b3"} {
		clustertest.Eventually(t, 10*time.Second, n+" caught up before the seal", func() error {
			_, err := h.heartbeat(n, "fenced")
			return err
		})
		resp, err := h.replication(n).Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "fenced", FenceEpoch: 2, TransitionId: "t1"}))
		if err != nil {
			t.Fatalf("seal %s: %v", n, err)
		}
		sealed[n] = resp.Msg
	}
	_, err := h.streams("b1").Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{
		Stream: "fenced", Records: []*strandv1.Record{{Payload: []byte("after-fence")}},
	}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("stale owner publish after the fence: %v, want Unavailable", err)
	}
	// A repeated seal is idempotent and reports the same tails: nothing from
	// the stale owner got in.
	for n, first := range sealed {
		again, err := h.replication(n).Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "fenced", FenceEpoch: 2, TransitionId: "t1"}))
		if err != nil {
			t.Fatalf("reseal %s: %v", n, err)
		}
		if again.Msg.GetRecordTail() != first.GetRecordTail() || again.Msg.GetChain() != first.GetChain() {
			t.Fatalf("%s tail moved after the fence: %d -> %d", n, first.GetRecordTail(), again.Msg.GetRecordTail())
		}
	}
	// A stale fence epoch is refused and changes nothing.
	_, err = h.replication("b2").Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "fenced", FenceEpoch: 1, TransitionId: "old"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stale fence: %v, want FailedPrecondition", err)
	}
	// Unknown stream.
	_, err = h.replication("b2").Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "nope", FenceEpoch: 2, TransitionId: "t"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown stream seal: %v, want NotFound", err)
	}

	// The recovered assignment at the fence epoch releases the sealed copy
	// in place; it is promoted at its own tails and serves.
	h.assign(cluster.Assignment{Stream: "fenced", Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}})
	offsets := h.publish("b2", "fenced", "on-new-owner")
	if offsets[0] != sealed["b2"].GetRecordTail() {
		t.Fatalf("new owner appended at %d, want its own tail %d", offsets[0], sealed["b2"].GetRecordTail())
	}
}
