package api

import (
	"math"
	"net/http"
	"slices"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Limits bounds what a client may send.
type Limits struct {
	MaxRecordBytes int
	// MaxBatchBytes bounds one publish: its payload and header bytes.
	MaxBatchBytes int
	// MaxBatchRecords bounds the records of one publish, whatever their
	// size: a record costs a broker memory and work of its own, and an
	// empty one is two bytes on the wire.
	MaxBatchRecords int
	// MaxReadRecords and MaxReadBytes bound one Read or Subscribe message.
	MaxReadRecords int
	MaxReadBytes   int
	// MaxPublishBytesInFlight bounds the request bytes of the publishes a
	// broker reads and handles at once (publishgate.go); more wait.
	MaxPublishBytesInFlight int
}

// Defaults for Limits fields left zero (strand-broker's flag defaults).
// The Go client's batches stay well inside them: it merges publishes into
// batches of at most client.DefaultMaxBatchRecords (1024) records and
// client.DefaultMaxBatchBytes (4 MiB) of payload.
const (
	DefaultMaxRecordBytes  = 1 << 20
	DefaultMaxBatchBytes   = 16 << 20
	DefaultMaxBatchRecords = 1 << 16
)

func (l Limits) withDefaults() Limits {
	if l.MaxRecordBytes <= 0 {
		l.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if l.MaxBatchBytes <= 0 {
		l.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if l.MaxBatchRecords <= 0 {
		l.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if l.MaxReadRecords <= 0 {
		l.MaxReadRecords = 1000
	}
	if l.MaxReadBytes <= 0 {
		l.MaxReadBytes = 4 << 20
	}
	if l.MaxPublishBytesInFlight <= 0 {
		l.MaxPublishBytesInFlight = DefaultMaxPublishBytesInFlight
	}
	return l
}

// Request read limits. connect-go reads a request message whole, and
// inflates a compressed one whole, before a handler sees it; without a
// limit a body of any size, or a small gzip body that inflates to
// gigabytes, is held in memory. A message above its limit is refused with
// ResourceExhausted before it is decoded (connect.WithReadMaxBytes bounds
// the message both as sent and as inflated; rpcserver.ReadLimit).
const (
	// smallRequestMaxBytes bounds every request but a publish: the largest
	// legitimate one, a FollowRequest, SealRequest or a cursor call, is a
	// stream name (128 bytes), a node id (64), a transition id (128) or a
	// cursor name (storage.MaxCursorName, 256) and a few numbers, under
	// 1 KiB. The rest is room for fields a newer peer or client adds.
	smallRequestMaxBytes = 64 << 10
	// recordFraming bounds what one record of a publish costs on the wire
	// beyond the payload and header bytes MaxBatchBytes counts: in
	// protobuf its tag and length in the request, the payload's, a
	// sequence and a producer id of up to storage.MaxProducerID bytes with
	// their tags and lengths (26 bytes and the id); in JSON the same
	// spelled out, {"payload":"","producerId":"…","sequence":"…"} with
	// base64 padding (about 70 and the id). A header's framing is not
	// counted: a batch of records with many tiny headers may be refused by
	// the read limit rather than by MaxBatchBytes, still with
	// ResourceExhausted.
	recordFraming = 96 + storage.MaxProducerID
)

// publishRequestMaxBytes is the read limit of Publish: the largest batch
// MaxBatchBytes admits, as JSON (base64 payloads, a third larger than
// binary), with MaxBatchRecords records framed, and a stream name. Every
// publish the handler would accept fits, but for records with many headers
// (recordFraming), so the handler's own checks, which name the field, are
// what refuse a batch a little too large; the read limit refuses bodies
// no valid publish has. At the defaults it is about 43 MiB.
func (l Limits) publishRequestMaxBytes() int {
	framing := min(l.MaxBatchRecords, math.MaxInt32/recordFraming) * recordFraming
	batch := min(l.MaxBatchBytes, math.MaxInt32)
	return min(batch+batch/3+framing+smallRequestMaxBytes, math.MaxInt32)
}

// entryFraming bounds what one PublishMany entry costs on the wire beyond
// its records: a stream name (128 bytes) and, in JSON, its key, the
// records key and the braces and brackets ({"stream":"…","records":[]},),
// about 30.
const entryFraming = 128 + 32

// publishManyRequestMaxBytes is the read limit of PublishMany: that of a
// Publish (its records are bounded as one batch's, in all entries) and
// the framing of MaxPublishManyEntries entries.
func (l Limits) publishManyRequestMaxBytes() int {
	return min(l.publishRequestMaxBytes()+MaxPublishManyEntries*entryFraming, math.MaxInt32)
}

// Handler serves s as strand.v1.StreamService (path and handler for a
// ServeMux) with its read limits: Publish reads up to
// publishRequestMaxBytes and decodes at most MaxBatchRecords+1 records of
// a request (publishCodecs), so an oversized batch costs the broker no
// more to refuse than a full one, PublishMany likewise (publishManyRequestMaxBytes,
// MaxPublishManyEntries+1 entries and MaxBatchRecords+1 records in all),
// and publishes hold at most MaxPublishBytesInFlight request bytes
// together (publishGate); the other
// procedures read smallRequestMaxBytes. opts apply to every procedure.
func (s *StreamService) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	publishOpts := append(slices.Clone(opts), rpcserver.ReadLimit(s.limits.publishRequestMaxBytes()))
	publishOpts = append(publishOpts, publishCodecs(s.limits.MaxBatchRecords+1)...)
	path, publish := strandv1connect.NewStreamServiceHandler(s, publishOpts...)
	manyOpts := append(slices.Clone(opts), rpcserver.ReadLimit(s.limits.publishManyRequestMaxBytes()))
	manyOpts = append(manyOpts, publishCodecs(s.limits.MaxBatchRecords+1)...)
	_, publishMany := strandv1connect.NewStreamServiceHandler(s, manyOpts...)
	_, rest := strandv1connect.NewStreamServiceHandler(s, append(slices.Clone(opts), rpcserver.ReadLimit(smallRequestMaxBytes))...)
	mux := http.NewServeMux()
	mux.Handle(strandv1connect.StreamServicePublishProcedure, s.gate.wrap(publish))
	// PublishMany holds its request bytes among the publishes' in flight:
	// its entries are publishes.
	mux.Handle(strandv1connect.StreamServicePublishManyProcedure, s.gate.wrap(publishMany))
	mux.Handle(path, rest)
	return path, mux
}

// Handler serves s as strand.v1.ReplicationService (path and handler for
// a ServeMux), reading messages of at most smallRequestMaxBytes: Follow
// and Seal requests are names and numbers (records flow the other way);
// SealMany, up to MaxSealManyEntries seals, reads sealManyRequestMaxBytes.
// opts apply to every procedure.
func (s *ReplicationService) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	path, rest := strandv1connect.NewReplicationServiceHandler(s, append(slices.Clone(opts), rpcserver.ReadLimit(smallRequestMaxBytes))...)
	_, many := strandv1connect.NewReplicationServiceHandler(s, append(slices.Clone(opts), rpcserver.ReadLimit(sealManyRequestMaxBytes))...)
	mux := http.NewServeMux()
	mux.Handle(strandv1connect.ReplicationServiceSealManyProcedure, many)
	mux.Handle(path, rest)
	return path, mux
}
