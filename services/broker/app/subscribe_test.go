package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// A subscriber on a follower keeps receiving after that follower is
// promoted: readers parked on the old role's watermark are woken by the
// role change instead of hanging.
func TestSubscriberOnPromotedFollowerKeepsReceiving(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	majority := cluster.Policy{Name: cluster.MajorityDurable}
	h.assign(threeCopies("promo", majority))
	h.publish("b1", "promo", "before")
	clustertest.Eventually(t, 10*time.Second, "b2 holds the first record", func() error {
		got, err := h.readAll("b2", "promo")
		if err != nil || len(got) != 1 {
			return fmt.Errorf("%d records, %v", len(got), err)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := h.streams("b2").Subscribe(ctx, connect.NewRequest(&strandv1.SubscribeRequest{Stream: "promo", Start: strandv1.StartPosition_START_POSITION_OFFSET, Offset: 1}))
	if err != nil {
		t.Fatal(err)
	}
	h.stop("b1")
	for _, n := range []string{"b2", "b3"} {
		if _, err := h.replication(n).Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "promo", FenceEpoch: 2, TransitionId: "t"})); err != nil {
			t.Fatalf("seal %s: %v", n, err)
		}
	}
	h.assign(cluster.Assignment{Stream: "promo", Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: majority})
	h.publish("b2", "promo", "after")
	recs := receiveRecords(t, sub)
	if r := recs[0]; r.GetOffset() != 1 || string(r.GetPayload()) != "after" {
		t.Fatalf("got %d %q, want 1 after", r.GetOffset(), r.GetPayload())
	}
}

// receiveRecords returns the next message that carries records (the first
// message of a subscription may carry only the watermark).
func receiveRecords(t *testing.T, sub *connect.ServerStreamForClient[strandv1.SubscribeResponse]) []*strandv1.StoredRecord {
	t.Helper()
	for sub.Receive() {
		if recs := sub.Msg().GetRecords(); len(recs) > 0 {
			return recs
		}
	}
	t.Fatalf("subscription ended: %v", sub.Err())
	return nil
}
