package api

import (
	"context"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/rpcerr"
)

// MaxSealManyEntries bounds the entries of one SealMany (docs/protocol.md,
// "Stream failover"): each is a handler goroutine waiting for one of the
// broker's seal slots (replica.Config.MaxConcurrentSeals), whatever the
// call carries. The recoverer sends at most this many.
const MaxSealManyEntries = 1024

// sealEntryFraming bounds one SealMany entry on the wire: a stream name
// (128 bytes), a transition id (128), an incarnation, a fence epoch and, in
// JSON, their keys and braces. 512 leaves the incarnation 200 bytes, far
// more than the 32 hex digits the controller writes.
const sealEntryFraming = 512

// sealManyRequestMaxBytes is SealMany's read limit: MaxSealManyEntries
// entries and the room smallRequestMaxBytes leaves any call for fields a
// newer peer adds.
const sealManyRequestMaxBytes = MaxSealManyEntries*sealEntryFraming + smallRequestMaxBytes

// SealMany is a Seal of each entry, the entries concurrently and
// independently, each entry's result sent once it has one, naming its
// entry (docs/protocol.md, "Stream failover"). It saves a recoverer
// sealing many streams' copies on this broker a request per copy: after a
// mass failover the seals of thousands of recoveries reach each surviving
// broker together, and their storage writes share group commits either
// way. Results go out as they come, gathered into one message while the
// stream is busy sending, so a seal that waits (a history read, a copy's
// role slow to end) holds up no other entry's answer, as it would not
// have as a Seal of its own.
//
// Every entry keeps exactly one Seal's semantics (ReplicationService.seal:
// the fields checked, the incarnation check, the fence at the fence epoch
// before the tails are read, the effective tails), so the recovery that
// asked decides on the same answer a Seal would give; an entry's error,
// its fields named under "seals[i].", fails that entry alone. What refuses
// the whole call seals nothing: no entries, more than
// MaxSealManyEntries, a stream in two entries (two seals of one copy in
// one call would race for its fence with no order between them).
func (s *ReplicationService) SealMany(ctx context.Context, req *connect.Request[strandv1.SealManyRequest], stream *connect.ServerStream[strandv1.SealManyResponse]) error {
	seals := req.Msg.GetSeals()
	if len(seals) == 0 {
		return rpcerr.InvalidArgument("seals", "a call needs at least one entry")
	}
	if len(seals) > MaxSealManyEntries {
		return rpcerr.InvalidArgument("seals", "more than %d entries in one call, the entry limit", MaxSealManyEntries)
	}
	first := make(map[string]int, len(seals))
	for i, e := range seals {
		if j, ok := first[e.GetStream()]; ok {
			return rpcerr.InvalidArgument(fmt.Sprintf("seals[%d].stream", i), "stream %q is also seals[%d]'s: one entry per stream", e.GetStream(), j)
		}
		first[e.GetStream()] = i
	}
	// Buffered for every entry: an entry never waits for the sender, and
	// one whose call ended leaves nothing behind.
	results := make(chan *strandv1.SealResult, len(seals))
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, e := range seals {
		wg.Go(func() {
			r := &strandv1.SealResult{Entry: uint32(i)}
			if res, err := s.seal(ctx, e); err != nil {
				r.Outcome = &strandv1.SealResult_Error{Error: rpcerr.ToEntry(err, rpcerr.EntryPrefix("seals", i))}
			} else {
				r.Outcome = &strandv1.SealResult_Response{Response: res}
			}
			results <- r
		})
	}
	for sent := 0; sent < len(seals); {
		msg := &strandv1.SealManyResponse{Results: []*strandv1.SealResult{<-results}}
	gather:
		for {
			select {
			case r := <-results:
				msg.Results = append(msg.Results, r)
			default:
				break gather
			}
		}
		if err := stream.Send(msg); err != nil {
			// The caller left: the entries still running end with ctx.
			return err
		}
		sent += len(msg.Results)
	}
	return nil
}
