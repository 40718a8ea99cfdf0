package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// sealFollowers seals the copies of stream on nodes at fence epoch 2 for
// transition t1, each once its heartbeat reports the copy, and returns
// what each seal answered.
func (h *harness) sealFollowers(stream string, nodes ...string) map[string]*strandv1.SealResponse {
	h.t.Helper()
	sealed := map[string]*strandv1.SealResponse{}
	for _, n := range nodes {
		clustertest.Eventually(h.t, 10*time.Second, n+" caught up before the seal", func() error {
			_, err := h.heartbeat(n, stream)
			return err
		})
		resp, err := h.replication(n).Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: stream, FenceEpoch: 2, TransitionId: "t1"}))
		if err != nil {
			h.t.Fatalf("seal %s: %v", n, err)
		}
		sealed[n] = resp.Msg
	}
	return sealed
}

// After the followers are sealed at the next epoch, the old owner's batches
// are rejected: it confirms nothing after the fence (docs/protocol.md, "Safety argument").
func TestSealFencesTheStaleOwner(t *testing.T) {
	h := newHarness(t)
	h.confirm = 500 * time.Millisecond
	for _, n := range []string{"b1", "b2", "b3"} {
		h.start(n)
	}
	h.assign(threeCopies("fenced", cluster.Policy{Name: cluster.MajorityDurable}))
	h.publish("b1", "fenced", "a", "b")
	sealed := h.sealFollowers("fenced", "b2", "b3")
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
	// A stream this broker holds no copy of: FailedPrecondition, not
	// NotFound, which would say the stream does not exist anywhere.
	_, err = h.replication("b2").Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "nope", FenceEpoch: 2, TransitionId: "t"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("seal of a stream with no copy here: %v, want FailedPrecondition", err)
	}

	// The recovered assignment at the fence epoch releases the sealed copy
	// in place; it is promoted at its own tails and serves.
	h.assign(cluster.Assignment{Stream: "fenced", Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}})
	offsets := h.publish("b2", "fenced", "on-new-owner")
	if offsets[0] != sealed["b2"].GetRecordTail() {
		t.Fatalf("new owner appended at %d, want its own tail %d", offsets[0], sealed["b2"].GetRecordTail())
	}
}

// Follow and Seal are for peers only (docs/operating.md, "Peer token"): without the cluster's
// peer token both are refused with Unauthenticated before anything is read
// or changed, while the brokers, which carry it, go on replicating.
func TestReplicationServiceNeedsThePeerToken(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	h.assign(threeCopies("guarded", cluster.Policy{Name: cluster.MajorityDurable}))
	h.publish("b1", "guarded", "a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, token := range []string{"", "not-the-token"} {
		_, err := h.replicationAs("b2", token).Seal(ctx, connect.NewRequest(&strandv1.SealRequest{Stream: "guarded", FenceEpoch: 2, TransitionId: "t1"}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("seal with token %q: %v, want Unauthenticated", token, err)
		}
		s := h.replicationAs("b1", token).Follow(ctx)
		_ = s.Send(&strandv1.FollowRequest{Node: "b2", Starts: []*strandv1.FollowStart{{Id: 1, Stream: "guarded", Epoch: 1}}})
		if _, err := s.Receive(); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("follow with token %q: %v, want Unauthenticated", token, err)
		}
		_ = s.CloseRequest()
	}
	// Nothing was sealed: b2 still follows at epoch 1 and takes the
	// owner's next record (a sealed b2 would refuse it).
	h.publish("b1", "guarded", "c")
	clustertest.Eventually(t, 10*time.Second, "b2 holds the record published after the refused calls", func() error {
		hb, err := h.heartbeat("b2", "guarded")
		if err != nil {
			return err
		}
		if hb.SealEpoch != 0 || hb.Epoch != 1 || hb.RecordTail < 3 {
			return fmt.Errorf("b2 at epoch %d, seal epoch %d, record tail %d", hb.Epoch, hb.SealEpoch, hb.RecordTail)
		}
		return nil
	})
}

// A rolling token rotation midway: b1 already sends the new token and
// still accepts the old one, b2 and b3 still send the old one and already
// accept the new one. Whichever of them owns a stream, every follower keeps
// replicating: local_durable confirms only once all three copies hold a
// record.
func TestPeerTokenRotationKeepsReplicating(t *testing.T) {
	h := newHarnessWithTokens(t, map[string]peerTokens{
		"b1": {token: "new-token", accepted: []string{"old-token"}},
		"b2": {token: "old-token", accepted: []string{"new-token"}},
		"b3": {token: "old-token", accepted: []string{"new-token"}},
	}, "b1", "b2", "b3")
	all := cluster.Policy{Name: cluster.LocalDurable}
	h.assign(cluster.Assignment{Stream: "new-owner", Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: all})
	h.assign(cluster.Assignment{Stream: "old-owner", Epoch: 1, Owner: "b2", Followers: []string{"b1", "b3"}, Policy: all})
	// publish fails the test unless a publish is confirmed, which needs
	// both followers of each owner.
	h.publish("b1", "new-owner", "a", "b")
	h.publish("b2", "old-owner", "a", "b")
	// Neither token admits a third one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, node := range []string{"b1", "b2"} {
		_, err := h.replicationAs(node, "harness-peer-token").Seal(ctx, connect.NewRequest(&strandv1.SealRequest{Stream: "new-owner", FenceEpoch: 2, TransitionId: "t1"}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("seal on %s with a token it does not accept: %v, want Unauthenticated", node, err)
		}
	}
}

// A token that cannot travel in a header as it is stops the broker at
// start, naming the variable, instead of failing every Follow later.
func TestBrokerRefusesAnUnusablePeerToken(t *testing.T) {
	_, err := Start(context.Background(), Config{Node: "b1", DataDir: t.TempDir(), PeerToken: "two words"})
	if err == nil || !strings.Contains(err.Error(), "STRAND_PEER_TOKEN") {
		t.Fatalf("start with token %q: %v, want an error naming STRAND_PEER_TOKEN", "two words", err)
	}
	// Tokens accepted without one of its own would leave the broker open
	// while it looks closed.
	_, err = Start(context.Background(), Config{Node: "b1", DataDir: t.TempDir(), PeerTokensAccepted: []string{"old"}})
	if err == nil || !strings.Contains(err.Error(), "STRAND_PEER_TOKEN_ACCEPT") {
		t.Fatalf("start with accepted tokens and no token: %v, want an error naming STRAND_PEER_TOKEN_ACCEPT", err)
	}
}

// A seal for another incarnation of a stream is refused and changes
// nothing: a recovery of a deleted stream whose seal reaches a broker late,
// after the name was created again, must not fence the new stream's copy
// at an epoch its assignments have not reached (it would wait there for a
// recovery that never comes).
func TestSealOfAnotherIncarnationIsRefused(t *testing.T) {
	h := newHarness(t, "b1")
	h.assign(cluster.Assignment{Stream: "again", Epoch: 1, Owner: "b1", Incarnation: "inc-new"})
	h.publish("b1", "again", "r0")
	ctx := context.Background()
	_, err := h.replication("b1").Seal(ctx, connect.NewRequest(&strandv1.SealRequest{
		Stream: "again", FenceEpoch: 6, TransitionId: "old-recovery", Incarnation: "inc-old",
	}))
	wantCode(t, "seal of the deleted incarnation", err, connect.CodeFailedPrecondition, "")
	if offs := h.publish("b1", "again", "r1"); offs[0] != 1 {
		t.Fatalf("publish after the refused seal went to offset %d, want 1", offs[0])
	}
	// The stream's own incarnation is sealed as before.
	if _, err := h.replication("b1").Seal(ctx, connect.NewRequest(&strandv1.SealRequest{
		Stream: "again", FenceEpoch: 2, TransitionId: "recovery", Incarnation: "inc-new",
	})); err != nil {
		t.Fatalf("seal of the stream's own incarnation: %v", err)
	}
}

// A publish that reaches a copy sealed for a recovery is held until the
// recovery's assignment makes the copy its owner, and then served, rather
// than refused at once and left to the client's backoff. A PublishMany
// entry is refused at once, Unavailable, so one stream's recovery never
// holds the answer for the call's other streams. The held publish shows
// in strand_broker_publishes_awaiting_recovery while it waits.
func TestPublishToASealedCopyWaitsForItsRecovery(t *testing.T) {
	h := newHarness(t)
	// Long enough that the assignment below is always applied within it,
	// however slow the machine.
	h.configure = func(c *Config) { c.PublishApplyWait = time.Minute }
	for _, n := range []string{"b1", "b2", "b3"} {
		h.start(n)
	}
	pol := cluster.Policy{Name: cluster.MajorityDurable}
	h.assign(threeCopies("held", pol))
	h.publish("b1", "held", "a", "b")
	tail := h.sealFollowers("held", "b2", "b3")["b2"].GetRecordTail()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := []*strandv1.Record{{Payload: []byte("after-seal")}}
	many, err := h.streams("b2").PublishMany(ctx, connect.NewRequest(&strandv1.PublishManyRequest{
		Publishes: []*strandv1.PublishRequest{{Stream: "held", Records: recs}},
	}))
	if err != nil {
		t.Fatalf("PublishMany to the sealed copy: %v", err)
	}
	if e := many.Msg.GetResults()[0].GetError(); e == nil || connect.Code(e.GetCode()) != connect.CodeUnavailable {
		t.Fatalf("PublishMany entry to the sealed copy: %v, want an Unavailable entry error", many.Msg.GetResults()[0])
	}

	type result struct {
		resp *connect.Response[strandv1.PublishResponse]
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := h.streams("b2").Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "held", Records: recs}))
		done <- result{resp, err}
	}()
	clustertest.Eventually(t, 10*time.Second, "the publish held by b2", func() error {
		select {
		case r := <-done:
			t.Fatalf("publish to the sealed copy answered before its recovery: %v", r.err)
		default:
		}
		if v := gaugeValue(h.scrape("b2"), "strand_broker_publishes_awaiting_recovery"); v != 1 {
			return fmt.Errorf("%v publishes awaiting recovery", v)
		}
		return nil
	})
	// The recovery's assignment at the fence epoch promotes b2.
	h.assign(cluster.Assignment{Stream: "held", Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: pol})
	r := <-done
	if r.err != nil {
		t.Fatalf("held publish: %v, want it served once b2 owns the stream", r.err)
	}
	if got := r.resp.Msg.GetOffsets(); len(got) != 1 || got[0] != tail || r.resp.Msg.GetEpoch() != 2 {
		t.Fatalf("held publish at %v epoch %d, want offset %d at epoch 2", got, r.resp.Msg.GetEpoch(), tail)
	}
	if v := gaugeValue(h.scrape("b2"), "strand_broker_publishes_awaiting_recovery"); v != 0 {
		t.Fatalf("%v publishes awaiting recovery after it was served, want 0", v)
	}
}
