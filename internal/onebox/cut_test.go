package onebox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// cutMessage is what a broker logs when it cuts a copy back to the history
// of a new epoch (services/broker/internal/replica/copy.go).
const cutMessage = "copy held records past the new history start; cut them (none was confirmed)"

// publishUnconfirmed appends records on node that cannot be confirmed (its
// followers are down or fenced): the publish fails, the records stay in the
// node's log. It returns the node's record tail afterwards.
func publishUnconfirmed(t *testing.T, c *Cluster, node, stream string, payloads []string) {
	t.Helper()
	recs := make([]*strandv1.Record, len(payloads))
	for i, p := range payloads {
		recs[i] = &strandv1.Record{Payload: []byte(p)}
	}
	_, err := c.Streams(node).Publish(c.Ctx(), connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: recs}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("publish on %s with no copy to confirm: %v, want Unavailable", node, err)
	}
}

// waitTails waits until node publishes its copy of stream with the given
// record and cursor event tails.
func waitTails(t *testing.T, c *Cluster, node, stream string, recordTail, eventTail uint64) cluster.CopyTails {
	t.Helper()
	var tails cluster.CopyTails
	clustertest.Eventually(t, 15*time.Second, fmt.Sprintf("%s on %s at tails %d/%d", stream, node, recordTail, eventTail), func() error {
		tt, ok := c.Tails(node, stream)
		if !ok || tt.RecordTail != recordTail || tt.CursorEventTail != eventTail {
			return fmt.Errorf("%s publishes %+v (present %v)", node, tt, ok)
		}
		tails = tt
		return nil
	})
	return tails
}

// subscribeFrom opens a raw subscription on node and returns the first n
// records it delivers.
func subscribeFrom(t *testing.T, c *Cluster, node string, req *strandv1.SubscribeRequest, n int) []*strandv1.StoredRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(c.Ctx(), 15*time.Second)
	defer cancel()
	s, err := c.Streams(node).Subscribe(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("subscribe on %s: %v", node, err)
	}
	defer s.Close()
	var out []*strandv1.StoredRecord
	for len(out) < n && s.Receive() {
		out = append(out, s.Msg().GetRecords()...)
	}
	if len(out) < n {
		t.Fatalf("subscription on %s %v delivered %d records, want %d: %v", node, req, len(out), n, s.Err())
	}
	return out[:n]
}

// TestReturningOldOwnerIsCutAndTakesNewEntries is the cut of a copy with a
// longer tail (docs/protocol.md, "Copies with a longer tail") with the whole
// cluster: the old owner held records no follower had (its followers were
// down, so none was confirmed) and cursor commits past them, folded into a
// cursor snapshot. It was not sealed. It comes back after a failover: the
// controller adds it back as a follower, and before following it is cut to
// the new owner's start. Its snapshot was durable, so the cursor events
// below it were compacted away and the cut goes below what it retains: its
// cursor log restarts empty and it takes the new owner's cursors on its
// next follow. Afterwards its offsets, bytes, chain values and cursors
// equal the owner's, and readers resuming from its cursors receive records
// again, never skip one.
func TestReturningOldOwnerIsCutAndTakesNewEntries(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "returning"
	a0 := c.CreateStream(stream, 3, majority)
	old, f1, f2 := a0.Owner, a0.Followers[0], a0.Followers[1]
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("confirmed", 20)...)
	if _, err := c.Client().CommitCursor(c.Ctx(), stream, "reader", 10); err != nil {
		t.Fatal(err)
	}
	waitTails(t, c, f1, stream, 20, 1)
	waitTails(t, c, f2, stream, 20, 1)

	// The followers go; the old owner takes records it cannot confirm.
	c.StopBroker(f1)
	c.StopBroker(f2)
	const unconfirmed = 600
	publishUnconfirmed(t, c, old, stream, Numbered("unconfirmed", unconfirmed))
	// Cursor commits the followers never get, enough to fold the state
	// into a snapshot (every 4096 events) that covers events past the cut.
	// A cursor never passes the confirm watermark (20 here), so each
	// cursor moves 16 times, up to 20.
	const workers, perWorker, commits = 8, 32, 16
	const cursors = workers * perWorker
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			sc := c.Streams(old)
			for k := range perWorker {
				for p := range commits {
					if _, err := sc.CommitCursor(c.Ctx(), connect.NewRequest(&strandv1.CommitCursorRequest{
						Stream: stream, Cursor: fmt.Sprintf("c%d", w*perWorker+k), Offset: uint64(20 - commits + 1 + p),
					})); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("cursor commit on the old owner: %v", err)
	}
	waitTails(t, c, old, stream, 20+unconfirmed, 1+cursors*commits)

	c.StopBroker(old)
	c.StartBroker(f1)
	c.StartBroker(f2)
	a1 := waitRecovered(t, c, stream, a0.Epoch, 20*time.Second)
	start, _ := c.History(stream).Latest()
	if start.Epoch != a1.Epoch || start.RecordTail != 20 || start.CursorEventTail != 1 || start.Node != a1.Owner {
		t.Fatalf("start %+v, want epoch %d at 20 records and 1 cursor event on %s", start, a1.Epoch, a1.Owner)
	}
	c.WaitApplied(a1)
	cl := c.Client()
	res, err := cl.Publish(c.Ctx(), stream, []*strandv1.Record{{Payload: []byte("new-000")}})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetOffsets()[0] != 20 {
		t.Fatalf("the promoted copy appended at %d, want its own tail 20", res.GetOffsets()[0])
	}
	l.Confirm("new-000", 20, res.GetEpoch())
	publishAll(t, c, stream, l, Numbered("new", 15)[1:]...)
	if _, err := cl.CommitCursor(c.Ctx(), stream, "reader", 25); err != nil {
		t.Fatal(err)
	}
	hist := c.History(stream)

	// The old owner returns and is added back; it cuts, then follows.
	c.StartBroker(old)
	a2 := waitRejoined(t, c, stream, old, a1.Epoch)
	if a2.Epoch != a1.Epoch || a2.Owner != a1.Owner {
		t.Errorf("the rejoin moved the stream: %+v, was %+v", a2, a1)
	}
	if h := c.History(stream); len(h) != len(hist) {
		t.Errorf("the rejoin changed the history: %+v, was %+v", h, hist)
	}
	if _, ok := c.Log(old).Find(cutMessage, map[string]any{
		"stream": stream, "from_record_tail": 20 + unconfirmed, "record_tail": 20, "cursor_event_tail": 1,
	}); !ok {
		t.Errorf("%s logged no cut from %d to the start 20/1; its log ends:\n%s", old, 20+unconfirmed, c.Log(old).Tail(15))
	}
	waitTails(t, c, old, stream, 35, 2)

	owner, err := c.ReadAll(a1.Owner, stream)
	if err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 10*time.Second, "the returned copy shows the owner's records", func() error {
		got, err := c.ReadAll(old, stream)
		if err != nil {
			return err
		}
		return SameRecords(a1.Owner, owner, old, got)
	})
	verify(t, c, old, stream, l)

	// Cursors: the old owner's state was not kept (it folded commits of
	// the abandoned history and the events below it were compacted), so
	// c3, committed only there, is gone as on the new owner: a reader
	// resuming from it starts at the head and receives records again,
	// none skipped. The new owner's commit holds.
	got := subscribeFrom(t, c, old, &strandv1.SubscribeRequest{Stream: stream, Start: strandv1.StartPosition_START_POSITION_CURSOR, Cursor: "c3"}, 15)
	if err := SameRecords(a1.Owner, owner[:15], old+" from cursor c3", got); err != nil {
		t.Errorf("resuming from a cursor the cut dropped: %v", err)
	}
	got = subscribeFrom(t, c, old, &strandv1.SubscribeRequest{Stream: stream, Start: strandv1.StartPosition_START_POSITION_CURSOR, Cursor: "reader"}, 10)
	if got[0].GetOffset() != 25 {
		t.Errorf("cursor reader on %s resumes at %d, want 25, the new owner's commit", old, got[0].GetOffset())
	}

}

// TestTwoFailoversWhileCopyAwayCutAtLowestStart plays the controller and
// the recoverer by hand (no controller, no recoverer): seals through the
// ReplicationService, assignments and history starts written into etcd as
// their guarded commits would. The old owner is away for two failovers;
// when it returns, its cut is the lowest start recorded after its own epoch
// (the first failover's), not the latest, so it drops its own records that
// the second owner's history replaced too. A copy already on the target
// history is left alone, and each sealed copy is released and promoted at
// its own tails.
func TestTwoFailoversWhileCopyAwayCutAtLowestStart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3"}})
	const stream = "away"
	placeWithTenRecords(t, c, stream)

	var history cluster.HistoryStarts
	// failover seals the copies at fence and commits the assignment with
	// the start of its owner appended, as the recoverer does.
	failover := func(fence uint64, transition string, sealed []string, next cluster.Assignment) cluster.HistoryStart {
		t.Helper()
		var start cluster.HistoryStart
		for _, n := range sealed {
			resp, err := c.Replication(n).Seal(c.Ctx(), connect.NewRequest(&strandv1.SealRequest{Stream: stream, FenceEpoch: fence, TransitionId: transition}))
			if err != nil {
				t.Fatalf("seal %s at %d: %v", n, fence, err)
			}
			if n == next.Owner {
				start = cluster.HistoryStart{Epoch: fence, RecordTail: resp.Msg.GetRecordTail(), CursorEventTail: resp.Msg.GetCursorEventTail(), Node: n}
			}
		}
		history = append(history, start)
		if _, err := c.Cli.Txn(c.Ctx()).Then(
			clientv3.OpPut(c.Schema.AssignmentKey(stream), cluster.Encode(next)),
			clientv3.OpPut(c.Schema.HistoryKey(stream), cluster.Encode(history)),
		).Commit(); err != nil {
			t.Fatal(err)
		}
		return start
	}

	// The followers are fenced first, so the owner's next records are
	// never confirmed; then it goes away.
	for _, n := range []string{"b2", "b3"} {
		if _, err := c.Replication(n).Seal(c.Ctx(), connect.NewRequest(&strandv1.SealRequest{Stream: stream, FenceEpoch: 2, TransitionId: "t2"})); err != nil {
			t.Fatal(err)
		}
	}
	publishUnconfirmed(t, c, "b1", stream, Numbered("e1-unconfirmed", 30))
	waitTails(t, c, "b1", stream, 40, 0)
	c.StopBroker("b1")

	s2 := failover(2, "t2", []string{"b2", "b3"}, cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: majority})
	if off := c.Publish("b2", stream, Numbered("e2", 5)...); off[0] != s2.RecordTail || s2.RecordTail != 10 {
		t.Fatalf("epoch 2 owner appended at %v with start %+v, want its own tail 10", off, s2)
	}
	waitTails(t, c, "b3", stream, 15, 0)
	s3 := failover(3, "t3", []string{"b2", "b3"}, cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b3", Followers: []string{"b2"}, Policy: majority})
	if off := c.Publish("b3", stream, Numbered("e3", 5)...); off[0] != s3.RecordTail || s3.RecordTail != 15 {
		t.Fatalf("epoch 3 owner appended at %v with start %+v, want its own tail 15", off, s3)
	}

	// b1 returns (left out, it only reports its copy) and is added back
	// on the fast path. While the history list cannot be trusted it
	// withholds the role change, cutting nothing on a guess.
	c.StartBroker("b1")
	back := cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b3", Followers: []string{"b2", "b1"}, Policy: majority}
	if _, err := c.Cli.Put(c.Ctx(), c.Schema.HistoryKey(stream), "{not a list"); err != nil {
		t.Fatal(err)
	}
	c.Put(c.Schema.AssignmentKey(stream), back)
	withheld := func(cause string) {
		t.Helper()
		clustertest.Eventually(t, 10*time.Second, "b1 withholds the assignment: "+cause, func() error {
			for _, e := range c.Log("b1").Entries("assignment withheld; retrying") {
				if msg, _ := e["error"].(string); e["stream"] == stream && strings.Contains(msg, cause) {
					return nil
				}
			}
			return fmt.Errorf("log tail:\n%s", c.Log("b1").Tail(5))
		})
		if tt, ok := c.Tails("b1", stream); !ok || tt.Epoch != 1 || tt.RecordTail != 40 || tt.Role == cluster.RoleFollower {
			t.Fatalf("b1 applied the assignment or cut on a %s: %+v", cause, tt)
		}
	}
	withheld("corrupt value")
	// The broker logs a withheld assignment once every few seconds: a
	// restart shows the next cause at once, and that a restart does not
	// apply it either.
	c.Put(c.Schema.HistoryKey(stream), cluster.HistoryStarts{s3, s2})
	c.StopBroker("b1")
	c.StartBroker("b1")
	withheld("out of order")
	c.Put(c.Schema.HistoryKey(stream), history)
	c.WaitApplied(back)
	waitTails(t, c, "b1", stream, 20, 0)
	if _, ok := c.Log("b1").Find(cutMessage, map[string]any{"stream": stream, "from_record_tail": 40, "record_tail": 10, "start_node": "b2"}); !ok {
		t.Errorf("b1 did not cut from 40 to the lowest start in range (10, epoch 2 on b2); its log ends:\n%s", c.Log("b1").Tail(15))
	}
	for _, n := range []string{"b2", "b3"} {
		if e, ok := c.Log(n).Find(cutMessage, map[string]any{"stream": stream}); ok {
			t.Errorf("%s was on the target history but cut: %v", n, e)
		}
	}
	owner, err := c.ReadAll("b3", stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(owner) != 20 {
		t.Fatalf("owner shows %d records, want 20", len(owner))
	}
	for _, n := range []string{"b1", "b2"} {
		clustertest.Eventually(t, 10*time.Second, n+" shows the owner's records", func() error {
			got, err := c.ReadAll(n, stream)
			if err != nil {
				return err
			}
			return SameRecords("b3", owner, n, got)
		})
	}
	for i, want := range append(append(Numbered("e1", 10), Numbered("e2", 5)...), Numbered("e3", 5)...) {
		if string(owner[i].GetPayload()) != want || owner[i].GetOffset() != uint64(i) {
			t.Fatalf("offset %d holds %q, want %q", i, owner[i].GetPayload(), want)
		}
	}
}

// TestDeletedStreamHistoryDropped: deleting a stream drops its history
// starts (and its copies), so a stream recreated under the same name starts
// empty and its first failover does not wait for a confirmed prefix the
// deleted stream recorded.
func TestDeletedStreamHistoryDropped(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "again"
	a0 := c.CreateStream(stream, 3, majority)
	publishAll(t, c, stream, ledger.New(), Numbered("old", 40)...)
	c.StopBroker(a0.Owner)
	waitRecovered(t, c, stream, a0.Epoch, 15*time.Second)
	if h := c.History(stream); len(h) != 1 || h[0].RecordTail != 40 {
		t.Fatalf("history %+v, want one start at 40 records", h)
	}
	c.StartBroker(a0.Owner)
	a1, _ := c.Assignment(stream)
	waitRejoined(t, c, stream, a0.Owner, a1.Epoch)

	if _, err := c.Admin().DeleteStream(c.Ctx(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: stream})); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{c.Schema.HistoryKey(stream), c.Schema.AssignmentKey(stream), c.Schema.RecoveryKey(stream), c.Schema.StreamKey(stream)} {
		if c.HasKey(key) {
			t.Errorf("%s survived the delete", key)
		}
	}
	clustertest.Eventually(t, 10*time.Second, "every broker dropped its copy", func() error {
		for _, n := range []string{"b1", "b2", "b3"} {
			if tt, ok := c.Tails(n, stream); ok {
				return fmt.Errorf("%s still publishes %+v", n, tt)
			}
		}
		return nil
	})

	b0 := c.CreateStream(stream, 3, majority)
	if h := c.History(stream); len(h) != 0 {
		t.Fatalf("the recreated stream inherited history %+v", h)
	}
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("new", 3)...)
	recs := verify(t, c, b0.Owner, stream, l)
	if len(recs) != 3 || recs[0].GetOffset() != 0 {
		t.Fatalf("the recreated stream shows %v, want only its own 3 records from 0", Payloads(recs))
	}
	c.StopBroker(b0.Owner)
	b1 := waitRecovered(t, c, stream, b0.Epoch, 15*time.Second)
	if h := c.History(stream); len(h) != 1 || h[0].Epoch != b1.Epoch || h[0].RecordTail != 3 {
		t.Fatalf("history of the recreated stream %+v, want only its own start at 3 records", h)
	}
	publishAll(t, c, stream, l, "after")
	verify(t, c, b1.Owner, stream, l)
}

// placeWithTenRecords writes stream's first assignment by hand (b1 owns,
// b2 and b3 follow, epoch 1, majority; the test plays the controller),
// publishes e1-000..e1-009 on b1 and waits until both followers hold them.
func placeWithTenRecords(t *testing.T, c *Cluster, stream string) {
	t.Helper()
	a1 := cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}
	c.Put(c.Schema.AssignmentKey(stream), a1)
	c.WaitApplied(a1)
	c.Publish("b1", stream, Numbered("e1", 10)...)
	waitTails(t, c, "b2", stream, 10, 0)
	waitTails(t, c, "b3", stream, 10, 0)
}
