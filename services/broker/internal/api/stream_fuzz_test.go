package api

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// marshals reports whether m can be sent at all: a string field that is
// not UTF-8 fails in the client, before the broker sees it.
func marshals(m proto.Message) bool {
	_, err := proto.Marshal(m)
	return err == nil
}

// FuzzPublish: a publish is stored whole, its records at the record tail
// (their offsets, the tail moved by the records not duplicates), or
// refused with a field named and nothing stored.
func FuzzPublish(f *testing.F) {
	b := startFuzzBroker(f)
	f.Add(fuzzStream, []byte("payload"), "k", "v", "", uint64(0), "", uint64(0), uint8(0))
	f.Add(fuzzStream, []byte("p"), "", "", "prod", uint64(1), "prod", uint64(2), uint8(1))
	f.Add(fuzzStream, []byte{}, "", "", "", uint64(0), "", uint64(0), uint8(2))
	f.Add("other", []byte("x"), "", "", "", uint64(0), "", uint64(0), uint8(0))
	f.Add("Bad Name", []byte("x"), "", "", "", uint64(0), "", uint64(0), uint8(0))
	f.Add(fuzzStream, []byte("x"), "", "v", "", uint64(7), "", uint64(0), uint8(0))
	f.Add(fuzzStream, []byte("x"), strings.Repeat("k", maxHeaderKey+1), "", strings.Repeat("p", storage.MaxProducerID+1), uint64(1), "", uint64(0), uint8(0))
	f.Add(fuzzStream, []byte("x"), "", "", "gap", uint64(5), "gap", uint64(9), uint8(1))
	f.Add(fuzzStream, []byte("x"), "", "", "", uint64(0), "", uint64(0), uint8(255))
	f.Fuzz(func(t *testing.T, stream string, payload []byte, hkey, hval, producer string, seq uint64, producer2 string, seq2 uint64, more uint8) {
		req := &strandv1.PublishRequest{Stream: stream}
		if more != 255 { // 255: a publish of no records
			r := &strandv1.Record{Payload: payload, ProducerId: producer, Sequence: seq}
			if hkey != "" || hval != "" {
				r.Headers = map[string]string{hkey: hval}
			}
			req.Records = append(req.Records, r)
			for i := range uint64(more % 4) {
				req.Records = append(req.Records, &strandv1.Record{ProducerId: producer2, Sequence: seq2 + i})
			}
		}
		if !marshals(req) {
			return
		}
		before := b.state()
		res, err := b.sc.Publish(fuzzCtx(t), connect.NewRequest(req))
		if err != nil {
			checkRefusal(t, "Publish", err, connect.CodeInvalidArgument, connect.CodeResourceExhausted, connect.CodeOutOfRange,
				connect.CodeFailedPrecondition, connect.CodeNotFound)
			b.unchanged(t, "Publish", before)
			return
		}
		if stream != fuzzStream {
			t.Fatalf("a publish to %q, which the broker has no copy of, answered %v", stream, res.Msg)
		}
		offsets, dup := res.Msg.GetOffsets(), res.Msg.GetDuplicate()
		if len(offsets) != len(req.Records) || len(dup) != len(req.Records) {
			t.Fatalf("%d records answered %d offsets, %d duplicate flags", len(req.Records), len(offsets), len(dup))
		}
		tail := before.tails[fuzzStream].RecordTail
		for i, o := range offsets {
			if !dup[i] && o != tail {
				t.Fatalf("records[%d] stored at %d, want the record tail %d", i, o, tail)
			}
			if !dup[i] {
				tail++
			} else if o >= before.tails[fuzzStream].RecordTail {
				t.Fatalf("records[%d] is a duplicate of offset %d, at or past the record tail %d before", i, o, before.tails[fuzzStream].RecordTail)
			}
		}
		if got := b.m.Tails()[fuzzStream].RecordTail; got != tail {
			t.Fatalf("record tail %d after the publish, want %d", got, tail)
		}
	})
}

// FuzzRead: a read answers records from its offset (or the head) on, at
// most max_records of them, below the confirm watermark; or is refused
// naming the field.
func FuzzRead(f *testing.F) {
	b := startFuzzBroker(f)
	f.Add(fuzzStream, uint64(0), uint32(0), uint32(0), false)
	f.Add(fuzzStream, uint64(1), uint32(1), uint32(1), false)
	f.Add(fuzzStream, uint64(0), uint32(5), uint32(0), true)
	f.Add(fuzzStream, uint64(3), uint32(0), uint32(0), false)
	f.Add(fuzzStream, uint64(1<<63), uint32(0), uint32(0), false)
	f.Add("", uint64(0), uint32(0), uint32(0), false)
	f.Add("missing", uint64(0), uint32(0), uint32(0), true)
	f.Fuzz(func(t *testing.T, stream string, from uint64, maxRecords, maxBytes uint32, earliest bool) {
		req := &strandv1.ReadRequest{Stream: stream, FromOffset: from, MaxRecords: maxRecords, MaxBytes: maxBytes, FromEarliest: earliest}
		if !marshals(req) {
			return
		}
		before := b.state()
		res, err := b.sc.Read(fuzzCtx(t), connect.NewRequest(req))
		b.unchanged(t, "Read", before)
		if err != nil {
			checkRefusal(t, "Read", err, connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodeNotFound)
			return
		}
		recs := res.Msg.GetRecords()
		if maxRecords > 0 && len(recs) > int(maxRecords) {
			t.Fatalf("max_records %d answered %d records", maxRecords, len(recs))
		}
		want := from
		if earliest {
			want = res.Msg.GetHead()
		}
		for i, r := range recs {
			if r.GetOffset() != want+uint64(i) {
				t.Fatalf("records[%d] at offset %d, want %d", i, r.GetOffset(), want+uint64(i))
			}
			if r.GetOffset() >= res.Msg.GetConfirmWatermark() {
				t.Fatalf("records[%d] at offset %d, at or past the confirm watermark %d", i, r.GetOffset(), res.Msg.GetConfirmWatermark())
			}
		}
		if res.Msg.GetNextOffset() != want+uint64(len(recs)) && len(recs) > 0 {
			t.Fatalf("next_offset %d after %d records from %d", res.Msg.GetNextOffset(), len(recs), want)
		}
	})
}

// FuzzSubscribe: a subscription starts (its first message arrives) or is
// refused naming the field; nothing is stored either way.
func FuzzSubscribe(f *testing.F) {
	b := startFuzzBroker(f)
	for _, s := range []strandv1.StartPosition{strandv1.StartPosition_START_POSITION_UNSPECIFIED, strandv1.StartPosition_START_POSITION_EARLIEST,
		strandv1.StartPosition_START_POSITION_LATEST, strandv1.StartPosition_START_POSITION_OFFSET, strandv1.StartPosition_START_POSITION_CURSOR} {
		f.Add(fuzzStream, int32(s), uint64(1), fuzzCursor, uint32(2))
	}
	f.Add(fuzzStream, int32(strandv1.StartPosition_START_POSITION_OFFSET), ^uint64(0), "", uint32(0))
	f.Add(fuzzStream, int32(strandv1.StartPosition_START_POSITION_OFFSET), uint64(100), "", uint32(0))
	f.Add(fuzzStream, int32(strandv1.StartPosition_START_POSITION_CURSOR), uint64(0), "", uint32(0))
	f.Add(fuzzStream, int32(42), uint64(0), "", uint32(0))
	f.Add("no", int32(0), uint64(0), "", uint32(0))
	f.Fuzz(func(t *testing.T, stream string, start int32, offset uint64, cursor string, maxBatch uint32) {
		req := &strandv1.SubscribeRequest{Stream: stream, Start: strandv1.StartPosition(start), Offset: offset, Cursor: cursor, MaxBatch: maxBatch}
		if !marshals(req) {
			return
		}
		before := b.state(cursor)
		ctx := fuzzCtx(t)
		sub, err := b.sc.Subscribe(ctx, connect.NewRequest(req))
		if err == nil {
			if !sub.Receive() {
				err = sub.Err()
			}
			_ = sub.Close()
		}
		b.unchanged(t, "Subscribe", before, cursor)
		if err != nil {
			checkRefusal(t, "Subscribe", err, connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodeNotFound)
		}
	})
}

// FuzzCommitCursor: a commit moves the cursor to its offset or is refused
// naming the field, the cursor and the cursor event tail as they were.
func FuzzCommitCursor(f *testing.F) {
	b := startFuzzBroker(f)
	f.Add(fuzzStream, fuzzCursor, uint64(2))
	f.Add(fuzzStream, "new", uint64(0))
	f.Add(fuzzStream, fuzzCursor, uint64(3))
	f.Add(fuzzStream, fuzzCursor, uint64(4))
	f.Add(fuzzStream, "", uint64(1))
	f.Add(fuzzStream, strings.Repeat("c", storage.MaxCursorName+1), uint64(1))
	f.Add("other", fuzzCursor, uint64(1))
	f.Add(fuzzStream, fuzzCursor, ^uint64(0))
	f.Fuzz(func(t *testing.T, stream, cursor string, offset uint64) {
		req := &strandv1.CommitCursorRequest{Stream: stream, Cursor: cursor, Offset: offset}
		if !marshals(req) {
			return
		}
		before := b.state(cursor)
		res, err := b.sc.CommitCursor(fuzzCtx(t), connect.NewRequest(req))
		if err != nil {
			checkRefusal(t, "CommitCursor", err, connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodeNotFound, connect.CodeFailedPrecondition)
			b.unchanged(t, "CommitCursor", before, cursor)
			return
		}
		// Forward only, clamped to [head, confirm watermark] (docs/api.md).
		tails := before.tails[fuzzStream]
		prev, existed := before.cursors[cursor]
		want := max(min(offset, tails.ConfirmWatermark), tails.Head, prev)
		if res.Msg.GetOffset() != want {
			t.Fatalf("committed %d to a cursor at %d (%v) with head %d and watermark %d, answered %d",
				offset, prev, existed, tails.Head, tails.ConfirmWatermark, res.Msg.GetOffset())
		}
		if pos, ok, err := b.m.Cursor(t.Context(), fuzzStream, cursor); err != nil || !ok || pos != want {
			t.Fatalf("cursor %q after committing %d: %d, %v, %v", cursor, want, pos, ok, err)
		}
		if existed && want == prev {
			b.unchanged(t, "CommitCursor of a position not past the cursor", before, cursor)
			return
		}
		b.settleCursors(t, res.Msg.GetCursorEventOffset()+1)
	})
}

// FuzzGetCursor and FuzzLocate: read-only calls, answered or refused
// naming the field.
func FuzzGetCursor(f *testing.F) {
	b := startFuzzBroker(f)
	f.Add(fuzzStream, fuzzCursor)
	f.Add(fuzzStream, "none")
	f.Add(fuzzStream, "")
	f.Add("x.y", fuzzCursor)
	f.Fuzz(func(t *testing.T, stream, cursor string) {
		req := &strandv1.GetCursorRequest{Stream: stream, Cursor: cursor}
		if !marshals(req) {
			return
		}
		before := b.state(cursor)
		res, err := b.sc.GetCursor(fuzzCtx(t), connect.NewRequest(req))
		b.unchanged(t, "GetCursor", before, cursor)
		if err != nil {
			checkRefusal(t, "GetCursor", err, connect.CodeInvalidArgument, connect.CodeNotFound)
			return
		}
		if want, found := before.cursors[cursor]; res.Msg.GetFound() != found || res.Msg.GetOffset() != want {
			t.Fatalf("GetCursor(%q) = %d, %v; stored %d, %v", cursor, res.Msg.GetOffset(), res.Msg.GetFound(), want, found)
		}
	})
}

func FuzzLocate(f *testing.F) {
	b := startFuzzBroker(f)
	f.Add(fuzzStream)
	f.Add("elsewhere")
	f.Add("-bad")
	f.Fuzz(func(t *testing.T, stream string) {
		req := &strandv1.LocateRequest{Stream: stream}
		if !marshals(req) {
			return
		}
		before := b.state()
		_, err := b.sc.Locate(fuzzCtx(t), connect.NewRequest(req))
		b.unchanged(t, "Locate", before)
		if err != nil {
			checkRefusal(t, "Locate", err, connect.CodeInvalidArgument, connect.CodeNotFound)
		}
	})
}
