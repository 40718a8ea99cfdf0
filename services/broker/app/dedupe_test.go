package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// sequenced returns records of producer with the given sequences; the
// payload names both, so a read shows which record is where.
func sequenced(producer string, seqs ...uint64) []*strandv1.Record {
	out := make([]*strandv1.Record, len(seqs))
	for i, s := range seqs {
		out[i] = &strandv1.Record{Payload: fmt.Appendf(nil, "%s/%d", producer, s), ProducerId: producer, Sequence: s}
	}
	return out
}

// publishRecords sends one publish, once.
func (h *harness) publishRecords(node, stream string, recs []*strandv1.Record) (*strandv1.PublishResponse, error) {
	resp, err := h.streams(node).Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: recs}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// publishUntilServed retries a publish while the node is not yet serving
// the stream (an assignment is applied asynchronously), as h.publish does.
func (h *harness) publishUntilServed(node, stream string, recs []*strandv1.Record) *strandv1.PublishResponse {
	h.t.Helper()
	var out *strandv1.PublishResponse
	clustertest.Eventually(h.t, 10*time.Second, "publish on "+node, func() error {
		resp, err := h.publishRecords(node, stream, recs)
		if err != nil {
			return err
		}
		out = resp
		return nil
	})
	return out
}

func wantPublish(t *testing.T, what string, resp *strandv1.PublishResponse, offsets []uint64, dup []bool) {
	t.Helper()
	if !slices.Equal(resp.GetOffsets(), offsets) || !slices.Equal(resp.GetDuplicate(), dup) {
		t.Fatalf("%s: offsets %v duplicate %v, want %v %v", what, resp.GetOffsets(), resp.GetDuplicate(), offsets, dup)
	}
}

// wantLog checks that node's confirmed records are exactly payloads, in order.
func (h *harness) wantLog(node, stream string, payloads ...string) {
	h.t.Helper()
	clustertest.Eventually(h.t, 10*time.Second, node+" holds the log", func() error {
		recs, err := h.readAll(node, stream)
		if err != nil {
			return err
		}
		got := make([]string, len(recs))
		for i, r := range recs {
			got[i] = string(r.GetPayload())
		}
		if !slices.Equal(got, payloads) {
			return fmt.Errorf("records %v, want %v", got, payloads)
		}
		return nil
	})
}

func wantSequenceError(t *testing.T, what string, err error, code connect.Code, field string) {
	t.Helper()
	if connect.CodeOf(err) != code || !strings.Contains(err.Error(), field) {
		t.Fatalf("%s: %v, want %v naming %s", what, err, code, field)
	}
}

// A republished (producer, sequence) gets its original offset, marked
// duplicate, and nothing new is stored; after a restart of the owner too.
// The broker runs with a window of 256 records (--dedupe-window).
func TestPublishDeduplicatesAcrossRestart(t *testing.T) {
	h := newHarness(t)
	h.configure = func(cfg *Config) { cfg.DedupeWindow = 256 }
	h.start("b1")
	h.assign(cluster.Assignment{Stream: "idem", Epoch: 1, Owner: "b1"})
	const f, d = false, true

	resp := h.publishUntilServed("b1", "idem", sequenced("p", 1, 2, 3))
	wantPublish(t, "first publish", resp, []uint64{0, 1, 2}, []bool{f, f, f})
	resp = h.publishUntilServed("b1", "idem", []*strandv1.Record{{Payload: []byte("plain")}})
	wantPublish(t, "a record without a producer", resp, []uint64{3}, []bool{f})

	resp, err := h.publishRecords("b1", "idem", sequenced("p", 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	wantPublish(t, "the same publish again", resp, []uint64{0, 1, 2}, []bool{d, d, d})
	resp, err = h.publishRecords("b1", "idem", sequenced("p", 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	wantPublish(t, "a retry that partly landed", resp, []uint64{2, 4}, []bool{d, f})
	h.wantLog("b1", "idem", "p/1", "p/2", "p/3", "plain", "p/4")

	_, err = h.publishRecords("b1", "idem", sequenced("p", 5, 7))
	wantSequenceError(t, "a gap", err, connect.CodeFailedPrecondition, "records[1].sequence")
	// Past the 256-record window, the oldest sequences cannot be told.
	many := make([]uint64, 0, 300)
	for s := uint64(5); s < 305; s++ {
		many = append(many, s)
	}
	resp, err = h.publishRecords("b1", "idem", sequenced("p", many...))
	if err != nil || len(resp.GetOffsets()) != 300 || resp.GetOffsets()[0] != 5 || slices.Contains(resp.GetDuplicate(), true) {
		t.Fatalf("300 more records: %v, %v", resp, err)
	}
	_, err = h.publishRecords("b1", "idem", sequenced("p", 2))
	wantSequenceError(t, "below the window", err, connect.CodeOutOfRange, "records[0].sequence")

	h.stop("b1")
	h.start("b1")
	resp = h.publishUntilServed("b1", "idem", sequenced("p", 303, 304, 305))
	wantPublish(t, "a retry after the restart", resp, []uint64{303, 304, 305}, []bool{d, d, f})
	_, err = h.publishRecords("b1", "idem", sequenced("p", 307))
	wantSequenceError(t, "a gap after the restart", err, connect.CodeFailedPrecondition, "records[0].sequence")
	recs, err := h.readAll("b1", "idem")
	if err != nil || len(recs) != 306 {
		t.Fatalf("after the restart: %d records, %v; want 306", len(recs), err)
	}
}

// A new owner rebuilt its table from the records it replicated: a
// republish there answers with the offsets the old owner gave.
func TestPublishDeduplicatesOnNewOwner(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	policy := cluster.Policy{Name: cluster.MajorityDurable}
	h.assign(threeCopies("moved", policy))
	first := h.publishUntilServed("b1", "moved", sequenced("p", 1, 2, 3, 4, 5))
	wantPublish(t, "on b1", first, []uint64{0, 1, 2, 3, 4}, []bool{false, false, false, false, false})
	for _, n := range []string{"b2", "b3"} {
		clustertest.Eventually(t, 10*time.Second, n+" holds the records", func() error {
			tails, err := h.heartbeat(n, "moved")
			if err != nil {
				return err
			}
			if tails.RecordTail != 5 {
				return fmt.Errorf("record tail %d", tails.RecordTail)
			}
			return nil
		})
		if _, err := h.replication(n).Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "moved", FenceEpoch: 2, TransitionId: "t1"})); err != nil {
			t.Fatalf("seal %s: %v", n, err)
		}
	}
	h.assign(cluster.Assignment{Stream: "moved", Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: policy})

	resp := h.publishUntilServed("b2", "moved", sequenced("p", 3, 4, 5))
	wantPublish(t, "the republish on b2", resp, []uint64{2, 3, 4}, []bool{true, true, true})
	if resp.GetEpoch() != 2 {
		t.Fatalf("answered at epoch %d, want 2", resp.GetEpoch())
	}
	resp, err := h.publishRecords("b2", "moved", sequenced("p", 5, 6))
	if err != nil {
		t.Fatal(err)
	}
	wantPublish(t, "the next sequence on b2", resp, []uint64{4, 5}, []bool{true, false})
	h.wantLog("b2", "moved", "p/1", "p/2", "p/3", "p/4", "p/5", "p/6")
	h.wantLog("b3", "moved", "p/1", "p/2", "p/3", "p/4", "p/5", "p/6")
}

// A publish the client never saw confirmed (W not reached) but that a
// follower holds: after the failover the retry is answered with the
// original offset once the new owner confirms it, and stored once.
func TestRetryOfAnUnconfirmedPublishOnNewOwner(t *testing.T) {
	h := newHarness(t)
	h.confirm = 400 * time.Millisecond
	for _, n := range []string{"b1", "b2", "b3"} {
		h.start(n)
	}
	policy := cluster.Policy{Name: cluster.LocalDurable} // every copy
	h.assign(threeCopies("retry", policy))
	h.publishUntilServed("b1", "retry", sequenced("p", 1, 2))
	h.stop("b3")
	_, err := h.publishRecords("b1", "retry", sequenced("p", 3))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("publish with a copy down under local_durable: %v, want Unavailable", err)
	}
	clustertest.Eventually(t, 10*time.Second, "b2 holds the unconfirmed record", func() error {
		tails, err := h.heartbeat("b2", "retry")
		if err != nil {
			return err
		}
		if tails.RecordTail != 3 || tails.ConfirmWatermark != 2 {
			return fmt.Errorf("record tail %d, confirm watermark %d", tails.RecordTail, tails.ConfirmWatermark)
		}
		return nil
	})
	// With W = E, R = 1: sealing b2 alone is enough to move the stream.
	if _, err := h.replication("b2").Seal(context.Background(), connect.NewRequest(&strandv1.SealRequest{Stream: "retry", FenceEpoch: 2, TransitionId: "t1"})); err != nil {
		t.Fatal(err)
	}
	h.assign(cluster.Assignment{Stream: "retry", Epoch: 2, Owner: "b2", Followers: []string{"b1"}, Policy: policy})
	resp := h.publishUntilServed("b2", "retry", sequenced("p", 3))
	wantPublish(t, "the retry on b2", resp, []uint64{2}, []bool{true})
	// Answered only once confirmed: readers on the new owner see it.
	recs, err := h.readAll("b2", "retry")
	if err != nil || len(recs) != 3 || string(recs[2].GetPayload()) != "p/3" {
		t.Fatalf("b2 after the retry: %v, %v", recs, err)
	}
	h.wantLog("b1", "retry", "p/1", "p/2", "p/3")
}
