package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
)

func threeCopies(stream string, policy cluster.Policy) cluster.Assignment {
	return cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: policy}
}

func TestSingleCopyPublishReadAndNotOwnerHint(t *testing.T) {
	h := newHarness(t, "b1", "b2")
	h.assign(cluster.Assignment{Stream: "solo", Epoch: 1, Owner: "b1"})
	offsets := h.publish("b1", "solo", "a", "b", "c")
	if fmt.Sprint(offsets) != "[0 1 2]" {
		t.Fatalf("offsets %v, want [0 1 2]", offsets)
	}
	recs, err := h.readAll("b1", "solo")
	if err != nil || len(recs) != 3 || string(recs[2].GetPayload()) != "c" {
		t.Fatalf("read %v %v", recs, err)
	}
	// b2 holds no copy: it answers FailedPrecondition with the owner hint.
	_, err = h.streams("b2").Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{
		Stream: "solo", Records: []*strandv1.Record{{Payload: []byte("x")}},
	}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("publish on non-owner: %v, want FailedPrecondition", err)
	}
	hint, ok := rpcerr.OwnerHint(err)
	if !ok || hint.GetNode() != "b1" || hint.GetAddress() != h.addrs["b1"] || hint.GetEpoch() != 1 {
		t.Fatalf("hint %v (%v), want b1 at %s epoch 1", hint, ok, h.addrs["b1"])
	}
	// Locate works on any broker.
	loc, err := h.streams("b2").Locate(context.Background(), connect.NewRequest(&strandv1.LocateRequest{Stream: "solo"}))
	if err != nil || loc.Msg.GetOwner().GetNode() != "b1" {
		t.Fatalf("locate: %v %v", loc, err)
	}
}

func TestReplicatedCopiesHoldIdenticalRecords(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	h.assign(threeCopies("orders", cluster.Policy{Name: cluster.MajorityDurable}))
	var want []string
	for i := range 20 {
		p := fmt.Sprintf("record-%02d", i)
		want = append(want, p)
		h.publish("b1", "orders", p)
	}
	owner, err := h.readAll("b1", "orders")
	if err != nil || len(owner) != 20 {
		t.Fatalf("owner read: %d records, %v", len(owner), err)
	}
	for i, r := range owner {
		if string(r.GetPayload()) != want[i] || r.GetOffset() != uint64(i) {
			t.Fatalf("owner offset %d holds %q, want %q at %d", r.GetOffset(), r.GetPayload(), want[i], i)
		}
	}
	for _, node := range []string{"b2", "b3"} {
		clustertest.Eventually(t, 10*time.Second, node+" holds every confirmed record", func() error {
			got, err := h.readAll(node, "orders")
			if err != nil {
				return err
			}
			if len(got) != len(owner) {
				return fmt.Errorf("%d records, want %d", len(got), len(owner))
			}
			for i := range got {
				o, g := owner[i], got[i]
				if g.GetOffset() != o.GetOffset() || !bytes.Equal(g.GetPayload(), o.GetPayload()) ||
					g.GetChain() != o.GetChain() || g.GetEpoch() != o.GetEpoch() || !g.GetPublishTime().AsTime().Equal(o.GetPublishTime().AsTime()) {
					return fmt.Errorf("offset %d differs: %v vs owner %v", i, g, o)
				}
			}
			return nil
		})
	}
}

func TestMajorityKeepsConfirmingWithOneFollowerDown(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	h.assign(threeCopies("m", cluster.Policy{Name: cluster.MajorityDurable}))
	h.publish("b1", "m", "before")
	h.stop("b3")
	start := time.Now()
	offsets := h.publish("b1", "m", "while-b3-down")
	if offsets[0] != 1 {
		t.Fatalf("offset %d, want 1", offsets[0])
	}
	t.Logf("confirmed with a follower down in %s", time.Since(start))
	// The restarted follower resumes at its own tails and catches up.
	h.start("b3")
	clustertest.Eventually(t, 10*time.Second, "b3 caught up", func() error {
		got, err := h.readAll("b3", "m")
		if err != nil {
			return err
		}
		if len(got) != 2 || string(got[1].GetPayload()) != "while-b3-down" {
			return fmt.Errorf("b3 has %d records", len(got))
		}
		return nil
	})
}

func TestLocalDurableWaitsForEveryCopy(t *testing.T) {
	h := newHarness(t)
	h.confirm = 400 * time.Millisecond
	for _, n := range []string{"b1", "b2", "b3"} {
		h.start(n)
	}
	h.assign(threeCopies("all", cluster.Policy{Name: cluster.LocalDurable}))
	h.publish("b1", "all", "first")
	h.stop("b2")
	_, err := h.streams("b1").Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{
		Stream: "all", Records: []*strandv1.Record{{Payload: []byte("unconfirmed")}},
	}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("publish with a copy down under local_durable: %v, want Unavailable", err)
	}
	// The owner shows why it answered so: one confirm timed out.
	if v := counterValue(h.scrape("b1"), "strand_broker_publish_confirm_timeouts_total"); v != 1 {
		t.Fatalf("owner's publish_confirm_timeouts_total = %v after one timed out publish, want 1", v)
	}
	// Readers never see a record above the confirm watermark.
	recs, err := h.readAll("b1", "all")
	if err != nil || len(recs) != 1 {
		t.Fatalf("owner shows %d records (%v); only the confirmed one may show", len(recs), err)
	}
	h.start("b2")
	// Once b2 is back and caught up, both the stuck record and new ones confirm.
	offsets := h.publish("b1", "all", "after")
	if offsets[0] != 2 {
		t.Fatalf("offset %d, want 2", offsets[0])
	}
	recs, err = h.readAll("b1", "all")
	if err != nil || len(recs) != 3 {
		t.Fatalf("after return: %d records, %v", len(recs), err)
	}
}

func TestFastPathFollowerCatchesUpFromEmpty(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3", "b4")
	a := threeCopies("grow", cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 2})
	h.assign(a)
	for i := range 10 {
		h.publish("b1", "grow", fmt.Sprint(i))
	}
	// Same owner and followers, one more copy, W unchanged: the fast path.
	a.Followers = append(a.Followers, "b4")
	if !cluster.IsFastPath(threeCopies("grow", a.Policy), a) {
		t.Fatal("adding a follower under replica_durable(2) must be a fast-path change")
	}
	h.assign(a)
	clustertest.Eventually(t, 10*time.Second, "b4 caught up from empty", func() error {
		got, err := h.readAll("b4", "grow")
		if err != nil {
			return err
		}
		if len(got) != 10 {
			return fmt.Errorf("%d records", len(got))
		}
		return nil
	})
	clustertest.Eventually(t, 5*time.Second, "b4 heartbeat shows a follower at epoch 1", func() error {
		tails, err := h.heartbeat("b4", "grow")
		if err != nil {
			return err
		}
		if tails.Role != cluster.RoleFollower || tails.Epoch != 1 || tails.RecordTail != 10 {
			return fmt.Errorf("heartbeat %+v", tails)
		}
		return nil
	})
}

func TestFollowBadInput(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3", "b4")
	h.assign(threeCopies("f", cluster.Policy{Name: cluster.MajorityDurable}))
	h.publish("b1", "f", "x", "y")
	follow := func(req *strandv1.FollowRequest) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s := h.replication("b1").Follow(ctx)
		if err := s.Send(req); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err := s.Receive()
		return err
	}
	cases := []struct {
		name string
		req  *strandv1.FollowRequest
		code connect.Code
	}{
		{"unknown stream", &strandv1.FollowRequest{Stream: "nope", Node: "b2", Epoch: 1}, connect.CodeNotFound},
		{"node not in the assignment", &strandv1.FollowRequest{Stream: "f", Node: "b4", Epoch: 1}, connect.CodePermissionDenied},
		{"stale epoch", &strandv1.FollowRequest{Stream: "f", Node: "b2", Epoch: 0}, connect.CodeFailedPrecondition},
		{"newer epoch", &strandv1.FollowRequest{Stream: "f", Node: "b2", Epoch: 2}, connect.CodeFailedPrecondition},
		{"past the owner's tail", &strandv1.FollowRequest{Stream: "f", Node: "b2", Epoch: 1, RecordTail: 99}, connect.CodeOutOfRange},
		{"prefix disagrees", &strandv1.FollowRequest{Stream: "f", Node: "b2", Epoch: 1, RecordTail: 1, Chain: 12345}, connect.CodeDataLoss},
		{"bad stream name", &strandv1.FollowRequest{Stream: "Bad/Name", Node: "b2", Epoch: 1}, connect.CodeInvalidArgument},
	}
	for _, c := range cases {
		if err := follow(c.req); connect.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
	// Nothing changed on the owner.
	recs, err := h.readAll("b1", "f")
	if err != nil || len(recs) != 2 {
		t.Fatalf("owner has %d records after bad follows (%v), want 2", len(recs), err)
	}
}
