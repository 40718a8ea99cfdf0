package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/emptypb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
)

// wireProtocols are the protocols a broker serves (docs/api.md:
// Connect, gRPC and gRPC-Web clients, and JSON); each must keep the limits.
var wireProtocols = map[string][]connect.ClientOption{
	"connect":  nil,
	"json":     {connect.WithProtoJSON()},
	"grpc":     {connect.WithGRPC()},
	"grpc-web": {connect.WithGRPCWeb()},
}

func wantCode(t *testing.T, what string, err error, code connect.Code, field string) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
		return
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: %q does not name %q", what, err.Error(), field)
	}
}

// wantStored checks the stream holds exactly the payloads given.
func wantStored(t *testing.T, h *harness, stream string, payloads ...string) {
	t.Helper()
	recs, err := h.readAll("b1", stream)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, string(r.GetPayload()))
	}
	if strings.Join(got, ",") != strings.Join(payloads, ",") {
		t.Fatalf("stored %q, want %q", got, payloads)
	}
}

// A publish of more records than --max-batch-records is refused with
// ResourceExhausted naming records, on every protocol, and stores nothing;
// so is one of a million empty records (3 MB of JSON, some 100 MB as Go
// structs), decoded only up to the limit.
func TestPublishRecordLimit(t *testing.T) {
	h := newHarness(t)
	h.configure = func(c *Config) { c.MaxBatchRecords = 16 }
	h.start("b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "keep")
	ctx := context.Background()
	records := func(n int) []*strandv1.Record {
		recs := make([]*strandv1.Record, n)
		for i := range recs {
			recs[i] = &strandv1.Record{Payload: []byte("x")}
		}
		return recs
	}
	for name, opts := range wireProtocols {
		cli := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"]), opts...)
		for _, n := range []int{17, 100_000} {
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: records(n)}))
			wantCode(t, fmt.Sprintf("%s: %d records", name, n), err, connect.CodeResourceExhausted, "records")
		}
	}
	// JSON as curl sends it, records after a bad stream name: the count
	// is what is known of the batch.
	body := `{"records":[` + strings.Repeat(`{},`, 1<<20) + `{}],"stream":"Bad Name"}`
	resp, err := http.Post("http://"+h.addrs["b1"]+strandv1connect.StreamServicePublishProcedure, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var wire struct{ Code, Message string }
	err = json.NewDecoder(resp.Body).Decode(&wire)
	_ = resp.Body.Close()
	if err != nil || wire.Code != "resource_exhausted" || !strings.HasPrefix(wire.Message, "records") {
		t.Errorf("JSON of a million empty records: HTTP %d %+v (%v), want resource_exhausted naming records", resp.StatusCode, wire, err)
	}
	wantStored(t, h, "s", "keep")
	// At the limit, a batch is taken.
	if _, err := h.streams("b1").Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: records(16)})); err != nil {
		t.Fatalf("a batch at the limit: %v", err)
	}
}

// A request larger than any valid one is refused with ResourceExhausted
// before it is decoded, sent as it is or gzipped (a small body that
// inflates past the limit); a batch a little over --max-batch-bytes still
// reaches Publish's own check, which names the field.
func TestPublishReadLimit(t *testing.T) {
	h := newHarness(t)
	h.configure = func(c *Config) { c.MaxBatchBytes = 64 << 10; c.MaxBatchRecords = 16 }
	h.start("b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "keep")
	ctx := context.Background()
	for name, opts := range wireProtocols {
		if name == "json" {
			continue // JSON has no unknown fields to send
		}
		for _, gzip := range []bool{false, true} {
			if gzip {
				opts = append(opts, connect.WithSendGzip())
			}
			cli := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"]), opts...)
			// Without the read limit this one is stored: the handler
			// counts payload and header bytes only.
			rec := clustertest.WithUnknownField(&strandv1.Record{Payload: []byte("x")}, 1<<20)
			_, err := cli.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: []*strandv1.Record{rec}}))
			wantCode(t, fmt.Sprintf("%s (gzip %v): 1 MiB request", name, gzip), err, connect.CodeResourceExhausted, "larger than")
		}
	}
	half := bytes.Repeat([]byte("y"), 33<<10)
	_, err := h.streams("b1").Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "s", Records: []*strandv1.Record{{Payload: half}, {Payload: half}}}))
	wantCode(t, "batch of 66 KiB", err, connect.CodeResourceExhausted, "records: batch of")
	wantStored(t, h, "s", "keep")
}

// Requests other than a publish, and the peers' and tools' requests, are
// names and numbers: one of a megabyte is refused with ResourceExhausted
// before any handler runs.
func TestSmallRequestReadLimits(t *testing.T) {
	h := newHarness(t, "b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "keep")
	ctx := context.Background()
	const big = 1 << 20
	for name, opts := range wireProtocols {
		if name == "json" {
			continue
		}
		opts = append(opts, connect.WithSendGzip())
		streams := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"]), opts...)
		_, err := streams.GetCursor(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.GetCursorRequest{Stream: "s", Cursor: "c"}, big)))
		wantCode(t, name+": GetCursor", err, connect.CodeResourceExhausted, "larger than")
		_, err = streams.CommitCursor(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.CommitCursorRequest{Stream: "s", Cursor: "c", Offset: 1}, big)))
		wantCode(t, name+": CommitCursor", err, connect.CodeResourceExhausted, "larger than")
		peers := strandv1connect.NewReplicationServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"]), append(opts, rpcserver.WithPeerToken(harnessPeerToken))...)
		_, err = peers.Seal(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.SealRequest{Stream: "s", FenceEpoch: 0, TransitionId: "t"}, big)))
		wantCode(t, name+": Seal", err, connect.CodeResourceExhausted, "larger than")
		follow := peers.Follow(ctx)
		_ = follow.Send(clustertest.WithUnknownField(&strandv1.FollowRequest{Node: "b9", Starts: []*strandv1.FollowStart{{Id: 1, Stream: "s", Epoch: 1}}}, big))
		_, err = follow.Receive()
		_ = follow.CloseRequest()
		_ = follow.CloseResponse()
		wantCode(t, name+": Follow", err, connect.CodeResourceExhausted, "larger than")
	}
	// A gzip body that inflates far past the limit is not inflated past it
	// (connect-go would inflate all of it to report its size).
	bomb := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"]), connect.WithSendGzip())
	_, err := bomb.GetCursor(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.GetCursorRequest{Stream: "s", Cursor: "c"}, 32<<20)))
	wantCode(t, "GetCursor of 32 MiB, gzipped", err, connect.CodeResourceExhausted, "inflates past")
	// Health and reflection (a tool's requests: any message will do, the
	// unknown field is what counts), gzipped and not.
	for _, gzip := range []bool{false, true} {
		var opts []connect.ClientOption
		if gzip {
			opts = append(opts, connect.WithSendGzip())
		}
		base := rpcserver.BaseURL(h.addrs["b1"])
		health := connect.NewClient[strandv1.LocateRequest, emptypb.Empty](rpcserver.HTTPClient(), base+"/grpc.health.v1.Health/Check", opts...)
		_, err = health.CallUnary(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.LocateRequest{}, big)))
		wantCode(t, fmt.Sprintf("health (gzip %v)", gzip), err, connect.CodeResourceExhausted, "larger than")
		for _, path := range []string{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"} {
			refl := connect.NewClient[strandv1.LocateRequest, emptypb.Empty](rpcserver.HTTPClient(), base+path, append(opts, connect.WithGRPC())...).CallBidiStream(ctx)
			_ = refl.Send(clustertest.WithUnknownField(&strandv1.LocateRequest{}, big))
			_, err = refl.Receive()
			_ = refl.CloseRequest()
			_ = refl.CloseResponse()
			wantCode(t, fmt.Sprintf("%s (gzip %v)", path, gzip), err, connect.CodeResourceExhausted, "larger than")
		}
	}
	if _, err := h.streams("b1").GetCursor(ctx, connect.NewRequest(&strandv1.GetCursorRequest{Stream: "s", Cursor: "c"})); err != nil {
		t.Fatalf("a small request: %v", err)
	}
	health := connect.NewClient[emptypb.Empty, emptypb.Empty](rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"])+"/grpc.health.v1.Health/Check")
	if _, err := health.CallUnary(ctx, connect.NewRequest(&emptypb.Empty{})); err != nil {
		t.Fatalf("a health check: %v", err)
	}
	wantStored(t, h, "s", "keep")
}

// A record storage cannot hold in one entry (--max-record-bytes above
// it) is too large (docs/errors.md): ResourceExhausted naming the
// records and storage's bound, not Internal; nothing is stored.
func TestPublishRecordAboveStorageEntry(t *testing.T) {
	h := newHarness(t)
	h.configure = func(c *Config) { c.MaxRecordBytes = 8 << 20 }
	h.start("b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "keep")
	_, err := h.streams("b1").Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: "s",
		Records: []*strandv1.Record{{Payload: []byte("a")}, {Payload: make([]byte, 4<<20)}}}))
	wantCode(t, "4 MiB record", err, connect.CodeResourceExhausted, "records")
	if err != nil && !strings.Contains(err.Error(), "limit") {
		t.Errorf("4 MiB record: %q does not say the limit", err)
	}
	wantStored(t, h, "s", "keep")
}

// An explicit offset is never read as another start position: offset
// 2^64-1 is past the record tail (OutOfRange naming offset), as any
// offset past it is, not the latest position.
func TestSubscribeAtTheLargestOffset(t *testing.T) {
	h := newHarness(t, "b1")
	h.assign(cluster.Assignment{Stream: "s", Epoch: 1, Owner: "b1"})
	h.publish("b1", "s", "keep")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, off := range []uint64{2, math.MaxUint64 - 1, math.MaxUint64} {
		sub, err := h.streams("b1").Subscribe(ctx, connect.NewRequest(&strandv1.SubscribeRequest{Stream: "s", Start: strandv1.StartPosition_START_POSITION_OFFSET, Offset: off}))
		if err == nil {
			sub.Receive()
			err = sub.Err()
			_ = sub.Close()
		}
		wantCode(t, fmt.Sprintf("subscribe at %d", off), err, connect.CodeOutOfRange, "offset")
	}
	_, err := h.streams("b1").Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: "s", FromOffset: math.MaxUint64}))
	wantCode(t, "read at 2^64-1", err, connect.CodeOutOfRange, "offset")
}

// gaugeValue is the value of gauge name (its only series), or -1 when there
// is none.
func gaugeValue(fams map[string]*dto.MetricFamily, name string) float64 {
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		return -1
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

// Publishes hold at most --max-publish-inflight-bytes of request bytes
// together: one that does not fit in time is answered Unavailable, unread,
// and stores nothing; a retry once there is room is handled as usual. Here
// the first publish holds 40 KiB of a 64 KiB bound while it waits for its
// second copy (W=2) to come up; a second 40 KiB publish, in every wire
// protocol, is refused, and once the copy is up the first is confirmed and
// the second's retry is stored after it.
func TestPublishBytesInFlightAreBounded(t *testing.T) {
	h := newHarness(t)
	h.confirm = time.Minute
	h.configure = func(cfg *Config) { cfg.MaxPublishBytesInFlight = 64 << 10 }
	h.start("b1")
	// local_durable on two copies: a publish waits for b2, not started.
	h.assign(cluster.Assignment{Stream: "held", Epoch: 1, Owner: "b1", Followers: []string{"b2"}})
	clustertest.Eventually(t, 10*time.Second, "b1 owns the stream", func() error {
		_, err := h.heartbeat("b1", "held")
		return err
	})
	big := func(tag string) []*strandv1.Record {
		return []*strandv1.Record{{Payload: bytes.Repeat([]byte(tag), 40<<10)}}
	}
	type result struct {
		resp *strandv1.PublishResponse
		err  error
	}
	first := make(chan result, 1)
	go func() { r, err := h.publishRecords("b1", "held", big("a")); first <- result{r, err} }()
	clustertest.Eventually(t, 10*time.Second, "the first publish admitted", func() bool {
		select {
		case r := <-first:
			t.Fatalf("the first publish was answered before b2 came up: %v %v", r.resp, r.err)
		default:
		}
		return gaugeValue(h.scrape("b1"), "strand_broker_publish_inflight_bytes") >= 40<<10
	})
	for proto, opts := range wireProtocols {
		c := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs["b1"]), opts...)
		_, err := c.Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: "held", Records: big("b")}))
		if connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("%s: a publish that does not fit: %v, want unavailable", proto, err)
		}
	}
	if v := counterValue(h.scrape("b1"), "strand_broker_publishes_refused_total"); v != float64(len(wireProtocols)) {
		t.Fatalf("publishes_refused_total %v, want %d", v, len(wireProtocols))
	}
	h.start("b2")
	select {
	case r := <-first:
		if r.err != nil || len(r.resp.GetOffsets()) != 1 || r.resp.GetOffsets()[0] != 0 {
			t.Fatalf("first publish: %v %v", r.resp, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("first publish not answered after b2 came up")
	}
	// The refused publishes stored nothing: the retry lands right after.
	r, err := h.publishRecords("b1", "held", big("b"))
	if err != nil || len(r.GetOffsets()) != 1 || r.GetOffsets()[0] != 1 {
		t.Fatalf("the retried publish: %v %v, want offset 1", r, err)
	}
	if v := gaugeValue(h.scrape("b1"), "strand_broker_publish_inflight_bytes"); v != 0 {
		t.Fatalf("publish bytes in flight after both were answered: %v", v)
	}
}
