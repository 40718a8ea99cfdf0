package replica

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Every change of what the heartbeat publishes moves StatusGeneration
// before the change is done: the idle heartbeat skips its read of every
// copy's status while the generation stands (docs/etcd-schema.md,
// "Heartbeat shards"), so a change that did not move it would go out only
// with the next read the heartbeat makes whatever the generation says.
// Each step below changes one input of a copy's status, through the path
// the broker takes, and checks that the status changed and the
// generation moved.
func TestStatusGenerationMovesWithEveryStatusChange(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const stream = "counted"
	ctx := context.Background()
	tails := func() cluster.CopyTails {
		c := m.copy(stream)
		if c == nil {
			return cluster.CopyTails{}
		}
		t, _ := c.tails()
		return t
	}
	// step runs change, waits until the status reads done, and checks
	// that the generation moved since before change.
	step := func(what string, change func(), done func(cluster.CopyTails) bool) {
		t.Helper()
		gen, before := m.StatusGeneration(), maps.Collect(m.AllTails(nil))
		change()
		clustertest.Eventually(t, 10*time.Second, what, func() bool { return done(tails()) })
		if maps.Equal(before, maps.Collect(m.AllTails(nil))) {
			t.Fatalf("%s: the statuses read the same", what)
		}
		if m.StatusGeneration() == gen {
			t.Fatalf("%s: the status changed and StatusGeneration did not move", what)
		}
	}

	step("a copy opened and owning epoch 1", func() {
		m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1"})
	}, func(s cluster.CopyTails) bool { return s.Role == cluster.RoleOwner && s.Epoch == 1 })

	step("a confirmed publish (record tail, confirm watermark)", func() {
		if _, err := m.Publish(ctx, stream, []storage.Record{{Payload: []byte("r0")}}); err != nil {
			t.Fatal(err)
		}
	}, func(s cluster.CopyTails) bool { return s.RecordTail == 1 && s.ConfirmWatermark == 1 })

	// Records nobody published through the manager: the durable tail moves
	// in storage, and the owner's tracker counts them (Stream.OnDurable).
	step("an append below the publish path", func() {
		if _, err := m.copy(stream).st.Append(ctx, 1, []storage.Record{{Payload: []byte("r1")}}); err != nil {
			t.Fatal(err)
		}
	}, func(s cluster.CopyTails) bool { return s.RecordTail == 2 && s.ConfirmWatermark == 2 })

	step("a retention that moves the head", func() {
		if _, err := m.copy(stream).st.ApplyRetention(ctx, storage.Retention{MaxRecords: 1}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}, func(s cluster.CopyTails) bool { return s.Head == 1 })

	step("a suspected owner", func() { m.copy(stream).setSuspect("b2") },
		func(s cluster.CopyTails) bool { return s.Suspect == "b2" })

	step("a chain mismatch", func() { m.copy(stream).setChainMismatch() },
		func(s cluster.CopyTails) bool { return s.ChainMismatch })

	step("a seal", func() {
		if _, err := m.Seal(ctx, stream, 2, "t1", ""); err != nil {
			t.Fatal(err)
		}
	}, func(s cluster.CopyTails) bool { return s.Role == cluster.RoleSealed && s.SealEpoch == 2 })

	// An owner with a follower: a record durable here is confirmed only
	// once the follower acknowledges it, which no write of this broker's
	// storage marks.
	step("owning epoch 2 with a follower", func() {
		m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b1", Followers: []string{"b2"}})
	}, func(s cluster.CopyTails) bool { return s.Role == cluster.RoleOwner && s.Epoch == 2 })
	step("an append the follower has not acknowledged", func() {
		if _, err := m.copy(stream).st.Append(ctx, 2, []storage.Record{{Payload: []byte("r2")}}); err != nil {
			t.Fatal(err)
		}
	}, func(s cluster.CopyTails) bool { return s.RecordTail == 3 && s.ConfirmWatermark == 2 })
	step("the follower's acknowledgement", func() {
		_, tracker, _, ok := m.copy(stream).ownerRole()
		if !ok {
			t.Fatal("not the owner")
		}
		tracker.followerDurable("b2", 3)
	}, func(s cluster.CopyTails) bool { return s.ConfirmWatermark == 3 })

	step("following at epoch 3", func() {
		m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b2", Followers: []string{"b1"}})
	}, func(s cluster.CopyTails) bool { return s.Role == cluster.RoleFollower && s.Epoch == 3 })

	// What a follow does with the owner's confirm watermark.
	step("a follower's confirm watermark", func() { m.copy(stream).setFollowerWatermark(3) },
		func(s cluster.CopyTails) bool { return s.ConfirmWatermark == 3 })

	step("the copy dropped", func() { m.DeleteAssignment(stream) },
		func(cluster.CopyTails) bool { return m.copy(stream) == nil })
}
