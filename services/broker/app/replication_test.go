package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/services/broker/internal/storage"
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
	// b2 holds no copy: once its assignment watch has brought it the
	// stream, it answers FailedPrecondition with the owner hint.
	clustertest.Eventually(t, 10*time.Second, "b2 knows the stream's owner", func() error {
		loc, err := h.streams("b2").Locate(context.Background(), connect.NewRequest(&strandv1.LocateRequest{Stream: "solo"}))
		if err != nil {
			return err
		}
		if loc.Msg.GetOwner().GetNode() != "b1" {
			return fmt.Errorf("owner %v", loc.Msg.GetOwner())
		}
		return nil
	})
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

// Bad follows on one call: each start the owner refuses ends that stream's
// follow alone, with the code a call of its own would have ended with,
// while a good follow on the same call goes on receiving. What is wrong
// for the call as a whole ends the call.
func TestFollowBadInput(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3", "b4")
	h.assign(threeCopies("f", cluster.Policy{Name: cluster.MajorityDurable}))
	h.publish("b1", "f", "x", "y")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cases := []struct {
		name  string
		start *strandv1.FollowStart
		code  connect.Code
	}{
		{"unknown stream", &strandv1.FollowStart{Stream: "nope", Epoch: 1}, connect.CodeNotFound},
		{"stale epoch", &strandv1.FollowStart{Stream: "f", Epoch: 0}, connect.CodeFailedPrecondition},
		{"newer epoch", &strandv1.FollowStart{Stream: "f", Epoch: 2}, connect.CodeFailedPrecondition},
		{"past the owner's tail", &strandv1.FollowStart{Stream: "f", Epoch: 1, RecordTail: 99}, connect.CodeOutOfRange},
		{"prefix disagrees", &strandv1.FollowStart{Stream: "f", Epoch: 1, RecordTail: 1, Chain: 12345}, connect.CodeDataLoss},
		{"bad stream name", &strandv1.FollowStart{Stream: "Bad/Name", Epoch: 1}, connect.CodeInvalidArgument},
	}
	// The good follow, id 100, starts from empty; b2 is a follower.
	req := &strandv1.FollowRequest{Node: "b2", Starts: []*strandv1.FollowStart{{Id: 100, Stream: "f", Epoch: 1}}}
	for i, c := range cases {
		c.start.Id = uint64(i + 1)
		req.Starts = append(req.Starts, c.start)
	}
	s := h.replication("b1").Follow(ctx)
	defer func() { _ = s.CloseRequest() }()
	if err := s.Send(req); err != nil {
		t.Fatal(err)
	}
	ends := map[uint64]*strandv1.FollowEnd{}
	var good uint64 // records received on the good follow
	for len(ends) < len(cases) || good < 2 {
		resp, err := s.Receive()
		if err != nil {
			t.Fatalf("the call ended with %d of %d ends and %d records on the good follow: %v", len(ends), len(cases), good, err)
		}
		for _, e := range resp.GetEnds() {
			ends[e.GetId()] = e
		}
		for _, b := range resp.GetBatches() {
			good += countRecords(t, b)
		}
	}
	if _, ok := ends[100]; ok {
		t.Fatal("the good follow was ended with the bad ones")
	}
	for i, c := range cases {
		if got := connect.Code(ends[uint64(i+1)].GetCode()); got != c.code {
			t.Errorf("%s: ended with %v (%q), want %v", c.name, got, ends[uint64(i+1)].GetMessage(), c.code)
		}
	}
	// The good follow goes on after the ends: records published now, one
	// at a time, arrive on the same call.
	for i := range 10 {
		h.publish("b1", "f", fmt.Sprint("z", i))
		for good < uint64(3+i) {
			resp, err := s.Receive()
			if err != nil {
				t.Fatalf("the call ended after the bad follows: %v", err)
			}
			for _, b := range resp.GetBatches() {
				if b.GetId() != 100 {
					t.Fatalf("a batch for follow %d, which was ended", b.GetId())
				}
				good += countRecords(t, b)
			}
		}
	}

	// A node the assignment does not name: each of its follows is refused.
	s4 := h.replication("b1").Follow(ctx)
	defer func() { _ = s4.CloseRequest() }()
	if err := s4.Send(&strandv1.FollowRequest{Node: "b4", Starts: []*strandv1.FollowStart{{Id: 1, Stream: "f", Epoch: 1}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := s4.Receive()
	if err != nil || len(resp.GetEnds()) != 1 || connect.Code(resp.GetEnds()[0].GetCode()) != connect.CodePermissionDenied {
		t.Fatalf("a follow of a node not in the assignment: %v, %v; want one end with PermissionDenied", resp, err)
	}

	// What is wrong for the whole call ends it, naming the field.
	for name, c := range map[string]struct {
		msgs  []*strandv1.FollowRequest
		field string
	}{
		"invalid node":       {[]*strandv1.FollowRequest{{Node: "B 2"}}, "node"},
		"a start without id": {[]*strandv1.FollowRequest{{Node: "b2", Starts: []*strandv1.FollowStart{{Stream: "f", Epoch: 1}}}}, "starts[0].id"},
		"another node later": {[]*strandv1.FollowRequest{{Node: "b2"}, {Node: "b3"}}, "node"},
	} {
		call := h.replication("b1").Follow(ctx)
		for _, m := range c.msgs {
			if err := call.Send(m); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
		}
		_, err := call.Receive()
		_ = call.CloseRequest()
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want InvalidArgument naming %s", name, err, c.field)
		}
	}
	// A follower of the release before, one call per stream naming it in
	// field 1, is told so instead of waiting on a call that sends nothing.
	old := &strandv1.FollowRequest{Node: "b2"}
	old.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "f"))
	call := h.replication("b1").Follow(ctx)
	if err := call.Send(old); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = call.Receive()
	_ = call.CloseRequest()
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "stream") {
		t.Errorf("a per-stream follow: %v, want FailedPrecondition naming stream", err)
	}
	// Nothing changed on the owner.
	recs, err := h.readAll("b1", "f")
	if err != nil || len(recs) != 12 {
		t.Fatalf("owner has %d records after bad follows (%v), want 12", len(recs), err)
	}
}

// countRecords decodes a batch's record segment and counts its records.
func countRecords(t *testing.T, b *strandv1.FollowBatch) uint64 {
	t.Helper()
	recs, err := storage.DecodeSegment(b.GetRecordSegment())
	if err != nil {
		t.Fatalf("batch of follow %d: %v", b.GetId(), err)
	}
	return uint64(len(recs))
}
