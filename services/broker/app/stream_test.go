package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
)

func TestSubscribeAndCursorResume(t *testing.T) {
	h := newHarness(t, "b1")
	h.assign(cluster.Assignment{Stream: "events", Epoch: 1, Owner: "b1"})
	h.publish("b1", "events", "e0", "e1", "e2")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := h.streams("b1").Subscribe(ctx, connect.NewRequest(&strandv1.SubscribeRequest{Stream: "events", Start: strandv1.StartPosition_START_POSITION_EARLIEST}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	next := func() {
		t.Helper()
		if !sub.Receive() {
			t.Fatalf("subscribe ended: %v", sub.Err())
		}
		for _, r := range sub.Msg().GetRecords() {
			got = append(got, fmt.Sprintf("%d:%s", r.GetOffset(), r.GetPayload()))
		}
	}
	for len(got) < 3 {
		next()
	}
	// The live tail: a record published after the subscription started
	// arrives without polling.
	h.publish("b1", "events", "e3")
	for len(got) < 4 {
		next()
	}
	if strings.Join(got, ",") != "0:e0,1:e1,2:e2,3:e3" {
		t.Fatalf("subscribe delivered %v", got)
	}
	cancel()

	// Commit a cursor, then resume a subscription from it.
	commit, err := h.streams("b1").CommitCursor(context.Background(), connect.NewRequest(&strandv1.CommitCursorRequest{Stream: "events", Cursor: "billing", Offset: 2}))
	if err != nil || commit.Msg.GetOffset() != 2 {
		t.Fatalf("commit: %v %v", commit, err)
	}
	// Cursors only move forward.
	back, err := h.streams("b1").CommitCursor(context.Background(), connect.NewRequest(&strandv1.CommitCursorRequest{Stream: "events", Cursor: "billing", Offset: 1}))
	if err != nil || back.Msg.GetOffset() != 2 {
		t.Fatalf("backward commit: %v %v, want the cursor to stay at 2", back, err)
	}
	// Clamped to the tail.
	far, err := h.streams("b1").CommitCursor(context.Background(), connect.NewRequest(&strandv1.CommitCursorRequest{Stream: "events", Cursor: "far", Offset: 99}))
	if err != nil || far.Msg.GetOffset() != 4 {
		t.Fatalf("commit past the tail: %v %v, want clamped to 4", far, err)
	}
	cur, err := h.streams("b1").GetCursor(context.Background(), connect.NewRequest(&strandv1.GetCursorRequest{Stream: "events", Cursor: "billing"}))
	if err != nil || !cur.Msg.GetFound() || cur.Msg.GetOffset() != 2 {
		t.Fatalf("get cursor: %v %v", cur, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	resumed, err := h.streams("b1").Subscribe(ctx2, connect.NewRequest(&strandv1.SubscribeRequest{Stream: "events", Start: strandv1.StartPosition_START_POSITION_CURSOR, Cursor: "billing"}))
	if err != nil {
		t.Fatal(err)
	}
	if first := receiveRecords(t, resumed)[0]; first.GetOffset() != 2 || string(first.GetPayload()) != "e2" {
		t.Fatalf("resumed at %d %q, want 2 e2", first.GetOffset(), first.GetPayload())
	}
	// Cursor state survives a broker restart (snapshot + events).
	h.stop("b1")
	h.start("b1")
	clustertest.Eventually(t, 10*time.Second, "cursor after restart", func() error {
		cur, err := h.streams("b1").GetCursor(context.Background(), connect.NewRequest(&strandv1.GetCursorRequest{Stream: "events", Cursor: "billing"}))
		if err != nil {
			return err
		}
		if cur.Msg.GetOffset() != 2 {
			return fmt.Errorf("cursor at %d", cur.Msg.GetOffset())
		}
		return nil
	})
}

// Every bad input gets the right code naming the field, and nothing stored
// changes.
func TestStreamServiceBadInput(t *testing.T) {
	h := newHarness(t, "b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "keep-0", "keep-1")
	cli := h.streams("b1")
	ctx := context.Background()
	one := []*strandv1.Record{{Payload: []byte("x")}}
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	halfMiB := bytes.Repeat([]byte("y"), 1<<19)
	var batch []*strandv1.Record
	for range 33 {
		batch = append(batch, &strandv1.Record{Payload: halfMiB})
	}
	longCursor := strings.Repeat("c", 257)
	cases := []struct {
		name  string
		call  func() error
		code  connect.Code
		field string
	}{
		{"stream name", func() error {
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "Bad Name", Records: one}))
			return err
		}, connect.CodeInvalidArgument, "stream"},
		{"empty stream name", func() error {
			_, err := cli.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: ""}))
			return err
		}, connect.CodeInvalidArgument, "stream"},
		{"empty batch", func() error {
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s"}))
			return err
		}, connect.CodeInvalidArgument, "records"},
		{"record over 1 MiB", func() error {
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: []*strandv1.Record{{Payload: big}}}))
			return err
		}, connect.CodeResourceExhausted, "records[0]"},
		{"batch over 16 MiB", func() error {
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: batch}))
			return err
		}, connect.CodeResourceExhausted, "records"},
		{"sequence without producer", func() error {
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: []*strandv1.Record{{Payload: []byte("x"), Sequence: 3}}}))
			return err
		}, connect.CodeInvalidArgument, "records[0].producer_id"},
		{"read past the tail", func() error {
			_, err := cli.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: "s", FromOffset: 99}))
			return err
		}, connect.CodeOutOfRange, "from_offset"},
		{"subscribe past the tail", func() error {
			s, err := cli.Subscribe(ctx, connect.NewRequest(&strandv1.SubscribeRequest{Stream: "s", Start: strandv1.StartPosition_START_POSITION_OFFSET, Offset: 99}))
			if err != nil {
				return err
			}
			s.Receive()
			return s.Err()
		}, connect.CodeOutOfRange, "offset"},
		{"unknown stream", func() error {
			_, err := cli.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: "nope"}))
			return err
		}, connect.CodeNotFound, "nope"},
		{"empty cursor", func() error {
			_, err := cli.CommitCursor(ctx, connect.NewRequest(&strandv1.CommitCursorRequest{Stream: "s", Cursor: ""}))
			return err
		}, connect.CodeInvalidArgument, "cursor"},
		{"oversized cursor", func() error {
			_, err := cli.GetCursor(ctx, connect.NewRequest(&strandv1.GetCursorRequest{Stream: "s", Cursor: longCursor}))
			return err
		}, connect.CodeInvalidArgument, "cursor"},
		{"unknown start position", func() error {
			s, err := cli.Subscribe(ctx, connect.NewRequest(&strandv1.SubscribeRequest{Stream: "s", Start: 42}))
			if err != nil {
				return err
			}
			s.Receive()
			return s.Err()
		}, connect.CodeInvalidArgument, "start"},
	}
	for _, c := range cases {
		err := c.call()
		if connect.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %q does not name %q", c.name, err.Error(), c.field)
		}
		// A refused field travels as a BadRequest detail too, so no
		// program reads the message (docs/errors.md); NotFound names the
		// stream in its message only.
		if fv := rpcerr.FieldViolations(err); c.code != connect.CodeNotFound && (len(fv) != 1 || fv[0].GetField() != c.field) {
			t.Errorf("%s: field violations %v, want one naming %q", c.name, fv, c.field)
		}
	}
	// Malformed JSON over the Connect protocol: InvalidArgument, no crash.
	resp, err := http.Post("http://"+h.addrs["b1"]+"/strand.v1.StreamService/Publish", "application/json", strings.NewReader(`{"stream": "s", "records": [`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed JSON: HTTP %d, want 400 (invalid_argument)", resp.StatusCode)
	}
	// Nothing stored changed.
	recs, err := h.readAll("b1", "s")
	if err != nil || len(recs) != 2 || string(recs[1].GetPayload()) != "keep-1" {
		t.Fatalf("after bad input: %d records, %v", len(recs), err)
	}
}
