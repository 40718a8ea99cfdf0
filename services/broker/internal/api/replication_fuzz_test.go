package api

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// FuzzSeal: a seal fences the copy at its fence epoch and reports its
// tails, or is refused naming the field, the copy as it was (no seal
// epoch, no tail moved).
func FuzzSeal(f *testing.F) {
	b := startFuzzBroker(f)
	f.Add(fuzzStream, uint64(2), "t1", "")
	f.Add(fuzzStream, uint64(3), "t2", "inc-1")
	f.Add(fuzzStream, uint64(1), "t3", "")
	f.Add(fuzzStream, uint64(4), "t4", "another")
	f.Add(fuzzStream, uint64(0), "t5", "")
	f.Add(fuzzStream, uint64(5), "", "")
	f.Add(fuzzStream, uint64(5), strings.Repeat("t", 129), "")
	f.Add("elsewhere", uint64(5), "t6", "")
	f.Add("UPPER", uint64(5), "t7", "")
	f.Fuzz(func(t *testing.T, stream string, fence uint64, transition, incarnation string) {
		req := &strandv1.SealRequest{Stream: stream, FenceEpoch: fence, TransitionId: transition, Incarnation: incarnation}
		if !marshals(req) {
			return
		}
		before := b.state()
		res, err := b.rc.Seal(fuzzCtx(t), connect.NewRequest(req))
		if err != nil {
			checkRefusal(t, "Seal", err, connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeNotFound)
			b.unchanged(t, "Seal", before)
			return
		}
		tails, ok := b.m.Tails()[stream]
		if !ok || tails.SealEpoch != fence || res.Msg.GetFenceEpoch() != fence {
			t.Fatalf("sealed %q at %d: answered %d, copy %+v (%v)", stream, fence, res.Msg.GetFenceEpoch(), tails, ok)
		}
		if was := before.tails[stream]; tails.RecordTail != was.RecordTail || tails.CursorEventTail != was.CursorEventTail {
			t.Fatalf("a seal moved the tails from %+v to %+v", was, tails)
		}
	})
}

// followEndCodes are the codes a follow's end may carry: what a per-stream
// call would have ended with (replica.FollowEdge.Wire).
var followEndCodes = []connect.Code{connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeUnavailable,
	connect.CodePermissionDenied, connect.CodeFailedPrecondition, connect.CodeOutOfRange, connect.CodeDataLoss, connect.CodeCanceled}

// FuzzFollow: a Follow call of two messages, a start and then acks and
// stops (each possibly from another node than the call's), ends cleanly
// once the follower closes it, or is refused naming the field; each
// follow that ends carries a code of the table. A follower's call stores
// nothing on the owner whatever it sends.
func FuzzFollow(f *testing.F) {
	b := startFuzzBroker(f)
	// A valid follow from the start, one from the middle, and its ack.
	f.Add(fuzzFollower, uint64(1), fuzzStream, uint64(1), uint64(0), uint64(0), uint64(0), fuzzFollower, uint64(1), uint64(3), uint64(1), uint64(0))
	f.Add(fuzzFollower, uint64(2), fuzzStream, uint64(1), uint64(2), uint64(1), uint64(7), fuzzFollower, uint64(2), uint64(3), uint64(1), uint64(2))
	// Not a member, another epoch, past the tail, an unknown stream, a
	// bad stream name, id 0, a bad node, a second message of another node.
	f.Add("b9", uint64(1), fuzzStream, uint64(1), uint64(0), uint64(0), uint64(0), "b9", uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(fuzzFollower, uint64(1), fuzzStream, uint64(2), uint64(0), uint64(0), uint64(0), fuzzFollower, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(fuzzFollower, uint64(1), fuzzStream, uint64(1), uint64(99), uint64(99), uint64(0), fuzzFollower, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(fuzzFollower, uint64(1), "nope", uint64(1), uint64(0), uint64(0), uint64(0), fuzzFollower, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(fuzzFollower, uint64(1), "Nope!", uint64(1), uint64(0), uint64(0), uint64(0), fuzzFollower, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(fuzzFollower, uint64(0), fuzzStream, uint64(1), uint64(0), uint64(0), uint64(0), fuzzFollower, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add("", uint64(1), fuzzStream, uint64(1), uint64(0), uint64(0), uint64(0), "", uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(fuzzFollower, uint64(1), fuzzStream, uint64(1), uint64(0), uint64(0), uint64(0), "b3", uint64(1), uint64(0), uint64(0), uint64(1))
	f.Fuzz(func(t *testing.T, node string, id uint64, stream string, epoch, recordTail, eventTail, chain uint64,
		node2 string, ackID, ackTail, ackEvents, stopID uint64) {
		first := &strandv1.FollowRequest{Node: node, Starts: []*strandv1.FollowStart{{Id: id, Stream: stream, Epoch: epoch,
			RecordTail: recordTail, CursorEventTail: eventTail, Chain: chain}}}
		second := &strandv1.FollowRequest{Node: node2,
			Acks:  []*strandv1.FollowAck{{Id: ackID, RecordTail: ackTail, CursorEventTail: ackEvents}},
			Stops: []*strandv1.FollowStop{{Id: stopID}}}
		if !marshals(first) || !marshals(second) {
			return
		}
		before := b.state()
		call := b.rc.Follow(fuzzCtx(t))
		// A send fails once the owner ended the call; the call's error is
		// what Receive reports.
		if call.Send(first) == nil {
			_ = call.Send(second)
		}
		_ = call.CloseRequest()
		var ends []*strandv1.FollowEnd
		var err error
		for {
			var res *strandv1.FollowResponse
			if res, err = call.Receive(); err != nil {
				break
			}
			ends = append(ends, res.GetEnds()...)
		}
		_ = call.CloseResponse()
		if errors.Is(err, io.EOF) {
			err = nil
		}
		b.unchanged(t, "Follow", before)
		if err != nil {
			checkRefusal(t, "Follow", err, connect.CodeInvalidArgument, connect.CodeFailedPrecondition)
		}
		for _, e := range ends {
			code := connect.Code(e.GetCode())
			if !slices.Contains(followEndCodes, code) {
				t.Fatalf("follow %d ended with %v (%s), want one of %v", e.GetId(), code, e.GetMessage(), followEndCodes)
			}
			if code == connect.CodeInvalidArgument && !strings.HasPrefix(e.GetMessage(), "starts.stream:") {
				t.Fatalf("follow %d ended with InvalidArgument %q, which names no field", e.GetId(), e.GetMessage())
			}
		}
	})
}
