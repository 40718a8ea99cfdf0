package api

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

const maxHeaderKey = 256

// StreamService implements strand.v1.StreamService.
type StreamService struct {
	strandv1connect.UnimplementedStreamServiceHandler
	m      *replica.Manager
	limits Limits
	gate   *publishGate
	log    zerolog.Logger
}

// NewStreamService returns the client-facing handler; zero limits take
// the defaults. Serve it with Handler, which applies its read limits.
func NewStreamService(m *replica.Manager, limits Limits, log zerolog.Logger) *StreamService {
	limits = limits.withDefaults()
	return &StreamService{m: m, limits: limits, log: log,
		gate: newPublishGate(limits.MaxPublishBytesInFlight, limits.publishManyRequestMaxBytes())}
}

func validStream(name string) error { return validStreamField("stream", name) }

// validStreamField is validStream for a stream name in field.
func validStreamField(field, name string) error {
	if err := cluster.ValidateStreamName(name); err != nil {
		return rpcerr.InvalidArgument(field, "must match [a-z0-9][a-z0-9._-]{0,127}, got %q", name)
	}
	return nil
}

// Publish appends records and answers once the stream's confirm policy
// holds for all of them.
//
// Idempotent publish (docs/api.md; storage doc.go, "Idempotent publish"): a
// record with a producer_id and a sequence (1, 2, 3, … per producer and
// stream; 0 means none) is stored once. Each copy keeps, per producer, the
// offsets of its last records (the dedupe window: its last 256 batches, at
// most 65536 records, by default) for the producers that appended most
// recently (10000 by default), rebuilt from its own log after a restart or
// failover. Per record:
//
//   - a (producer_id, sequence) already in the window: duplicate[i] is true,
//     offsets[i] is the original offset, nothing is stored; the answer still
//     waits until the original is confirmed. Duplicates must form a prefix
//     of the batch (a retry of a batch that partly landed).
//   - the producer's next sequence, or any sequence of a producer the copy
//     does not know (new, or evicted from the table): stored.
//   - a sequence past the next one: FailedPrecondition naming
//     records[i].sequence (a gap: an earlier publish was lost).
//   - a sequence at or below the last one but older than the window:
//     OutOfRange naming records[i].sequence (whether it is stored cannot be
//     told any more).
//   - a duplicate after a record new to this batch, or sequences of one
//     producer not consecutive within the batch: FailedPrecondition naming
//     records[i].sequence.
//
// Any error stores nothing of the batch. Records without a producer_id or
// without a sequence are never deduplicated.
func (s *StreamService) Publish(ctx context.Context, req *connect.Request[strandv1.PublishRequest]) (*connect.Response[strandv1.PublishResponse], error) {
	res, err := s.publish(ctx, req.Msg, s.m.Publish)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// publish is Publish of msg: a Publish call's (with replica's Publish), or a
// PublishMany entry's (with its PublishEntry).
func (s *StreamService) publish(ctx context.Context, msg *strandv1.PublishRequest, publish func(context.Context, string, []storage.Record) (replica.PublishResult, error)) (*strandv1.PublishResponse, error) {
	// First: of a batch above the limit, Handler's codecs decode only the
	// first MaxBatchRecords+1 records (publishcodec.go), so nothing else in
	// it is known, and what was decoded must never be stored.
	if len(msg.GetRecords()) > s.limits.MaxBatchRecords {
		return nil, rpcerr.BadField(connect.CodeResourceExhausted, "records", "more than %d records in one batch, the batch limit", s.limits.MaxBatchRecords)
	}
	if err := validStream(msg.GetStream()); err != nil {
		return nil, err
	}
	recs, err := s.validRecords(msg.GetRecords())
	if err != nil {
		return nil, err
	}
	res, err := publish(ctx, msg.GetStream(), recs)
	if err != nil {
		return nil, toConnect(err)
	}
	return &strandv1.PublishResponse{Epoch: res.Epoch, Offsets: res.Offsets, Duplicate: res.Duplicate}, nil
}

// validRecords checks a publish's records against the limits and returns
// them as storage takes them.
func (s *StreamService) validRecords(records []*strandv1.Record) ([]storage.Record, error) {
	if len(records) == 0 {
		return nil, rpcerr.InvalidArgument("records", "a publish needs at least one record")
	}
	total := 0
	recs := make([]storage.Record, 0, len(records))
	for i, r := range records {
		size := recordBytes(r)
		for k := range r.GetHeaders() {
			if k == "" || len(k) > maxHeaderKey {
				return nil, rpcerr.InvalidArgument(fmt.Sprintf("records[%d].headers", i), "header keys must be 1..%d bytes", maxHeaderKey)
			}
		}
		if size > s.limits.MaxRecordBytes {
			return nil, rpcerr.BadField(connect.CodeResourceExhausted, fmt.Sprintf("records[%d]", i), "%d bytes exceeds the record limit of %d", size, s.limits.MaxRecordBytes)
		}
		total += size
		if r.GetSequence() != 0 && r.GetProducerId() == "" {
			return nil, rpcerr.InvalidArgument(fmt.Sprintf("records[%d].producer_id", i), "a sequence needs a producer id")
		}
		if n := len(r.GetProducerId()); n > storage.MaxProducerID {
			return nil, rpcerr.InvalidArgument(fmt.Sprintf("records[%d].producer_id", i), "producer ids must be at most %d bytes, got %d", storage.MaxProducerID, n)
		}
		recs = append(recs, storage.Record{Payload: r.GetPayload(), Headers: r.GetHeaders(), ProducerID: r.GetProducerId(), Sequence: r.GetSequence()})
	}
	if total > s.limits.MaxBatchBytes {
		return nil, rpcerr.BadField(connect.CodeResourceExhausted, "records", "batch of %d bytes exceeds the batch limit of %d", total, s.limits.MaxBatchBytes)
	}
	return recs, nil
}

// recordBytes is what a record counts toward the record and batch limits:
// its payload and header bytes.
func recordBytes(r *strandv1.Record) int {
	size := len(r.GetPayload())
	for k, v := range r.GetHeaders() {
		size += len(k) + len(v)
	}
	return size
}

func (s *StreamService) readLimits(maxRecords, maxBytes uint32) (int, int) {
	n, b := int(maxRecords), int(maxBytes)
	if n <= 0 || n > s.limits.MaxReadRecords {
		n = s.limits.MaxReadRecords
	}
	if b <= 0 || b > s.limits.MaxReadBytes {
		b = s.limits.MaxReadBytes
	}
	return n, b
}

func (s *StreamService) Read(ctx context.Context, req *connect.Request[strandv1.ReadRequest]) (*connect.Response[strandv1.ReadResponse], error) {
	msg := req.Msg
	if err := validStream(msg.GetStream()); err != nil {
		return nil, err
	}
	n, b := s.readLimits(msg.GetMaxRecords(), msg.GetMaxBytes())
	var (
		res replica.ReadResult
		err error
	)
	if msg.GetFromEarliest() {
		res, err = s.m.ReadEarliest(ctx, msg.GetStream(), n, b)
	} else {
		res, err = s.m.Read(ctx, msg.GetStream(), msg.GetFromOffset(), n, b)
		if errors.Is(err, storage.ErrOutOfRange) {
			// Below the retained head or past the record tail: the
			// request's offset, named as its field.
			return nil, rpcerr.BadField(connect.CodeOutOfRange, "from_offset", "%v", err)
		}
	}
	if err != nil {
		return nil, toConnect(err)
	}
	out := &strandv1.ReadResponse{Head: res.Head, ConfirmWatermark: res.Watermark, NextOffset: res.Next}
	for _, r := range res.Records {
		out.Records = append(out.Records, replica.ToProto(r))
	}
	return connect.NewResponse(out), nil
}

func (s *StreamService) Subscribe(ctx context.Context, req *connect.Request[strandv1.SubscribeRequest], stream *connect.ServerStream[strandv1.SubscribeResponse]) error {
	msg := req.Msg
	if err := validStream(msg.GetStream()); err != nil {
		return err
	}
	var from uint64
	switch msg.GetStart() {
	case strandv1.StartPosition_START_POSITION_UNSPECIFIED, strandv1.StartPosition_START_POSITION_EARLIEST:
		from = 0
	case strandv1.StartPosition_START_POSITION_LATEST:
		from = ^uint64(0)
	case strandv1.StartPosition_START_POSITION_OFFSET:
		// replica.Subscribe reads ^uint64(0) as the latest position: an
		// explicit offset must never become that. No log gets there (it
		// takes 2^64-1 records), so it is past every copy's record tail,
		// and answered as any offset past this copy's is.
		if msg.GetOffset() == ^uint64(0) {
			return rpcerr.BadField(connect.CodeOutOfRange, "offset", "%d is past the record tail", msg.GetOffset())
		}
		from = msg.GetOffset()
	case strandv1.StartPosition_START_POSITION_CURSOR:
		if err := validCursor(msg.GetCursor(), "cursor"); err != nil {
			return err
		}
		pos, _, err := s.m.LocalCursor(ctx, msg.GetStream(), msg.GetCursor())
		if err != nil {
			return toConnect(err)
		}
		from = pos
	default:
		return rpcerr.InvalidArgument("start", "unknown start position %d", msg.GetStart())
	}
	n, b := s.readLimits(msg.GetMaxBatch(), 0)
	sub, err := s.m.Subscribe(ctx, msg.GetStream(), from)
	if errors.Is(err, storage.ErrOutOfRange) && msg.GetStart() == strandv1.StartPosition_START_POSITION_OFFSET {
		return rpcerr.BadField(connect.CodeOutOfRange, "offset", "%v", err)
	}
	if err != nil {
		return toConnect(err)
	}
	// A first message with no records sends the response headers at once:
	// clients wait for them before the call returns, and a live-tail
	// subscription may have nothing to send for a long time.
	if err := stream.Send(&strandv1.SubscribeResponse{ConfirmWatermark: sub.Watermark()}); err != nil {
		return err
	}
	for {
		recs, wm, err := sub.Next(ctx, n, b)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return toConnect(err)
		}
		out := &strandv1.SubscribeResponse{ConfirmWatermark: wm}
		for _, r := range recs {
			out.Records = append(out.Records, replica.ToProto(r))
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

func validCursor(name, field string) error {
	if name == "" || len(name) > storage.MaxCursorName {
		return rpcerr.InvalidArgument(field, "cursor names must be 1..%d bytes", storage.MaxCursorName)
	}
	return nil
}

func (s *StreamService) CommitCursor(ctx context.Context, req *connect.Request[strandv1.CommitCursorRequest]) (*connect.Response[strandv1.CommitCursorResponse], error) {
	msg := req.Msg
	if err := validStream(msg.GetStream()); err != nil {
		return nil, err
	}
	if err := validCursor(msg.GetCursor(), "cursor"); err != nil {
		return nil, err
	}
	ev, err := s.m.CommitCursor(ctx, msg.GetStream(), msg.GetCursor(), msg.GetOffset())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&strandv1.CommitCursorResponse{Offset: ev.Position, CursorEventOffset: ev.Offset}), nil
}

func (s *StreamService) GetCursor(ctx context.Context, req *connect.Request[strandv1.GetCursorRequest]) (*connect.Response[strandv1.GetCursorResponse], error) {
	msg := req.Msg
	if err := validStream(msg.GetStream()); err != nil {
		return nil, err
	}
	if err := validCursor(msg.GetCursor(), "cursor"); err != nil {
		return nil, err
	}
	pos, found, err := s.m.Cursor(ctx, msg.GetStream(), msg.GetCursor())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&strandv1.GetCursorResponse{Offset: pos, Found: found}), nil
}

func (s *StreamService) Locate(ctx context.Context, req *connect.Request[strandv1.LocateRequest]) (*connect.Response[strandv1.LocateResponse], error) {
	if err := validStream(req.Msg.GetStream()); err != nil {
		return nil, err
	}
	resp, err := s.m.Locate(ctx, req.Msg.GetStream())
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(resp), nil
}
