package api

import (
	"context"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/rpcerr"
)

// MaxPublishManyEntries bounds the entries of one PublishMany (docs/api.md,
// "PublishMany"): each is a handler goroutine and a confirm wait of its
// own, whatever its size. The Go client sends at most this many.
const MaxPublishManyEntries = 1024

// PublishMany is a Publish of each entry, the entries concurrently and
// independently, answered once every entry has its result (docs/api.md,
// "PublishMany"). It saves a client with batches for many streams of one
// owner a request, and the broker a request's fixed costs, per stream.
//
// What refuses the whole call stores nothing of any entry: no entries,
// more than MaxPublishManyEntries, more than MaxBatchRecords records or
// MaxBatchBytes payload and header bytes in all (the bounds of one
// Publish: the request is held in memory whole, as a batch is), a stream
// in two entries (their order would be unknown, and an idempotent
// producer's sequences could be taken for a gap). Past those checks each
// entry is a Publish of its stream: the same permission (auth.CheckEntry),
// validation, dedupe and confirm wait, and an entry's error, its fields
// named under "publishes[i].", fails that entry alone.
func (s *StreamService) PublishMany(ctx context.Context, req *connect.Request[strandv1.PublishManyRequest]) (*connect.Response[strandv1.PublishManyResponse], error) {
	pubs := req.Msg.GetPublishes()
	// First, as in Publish: of a request above these bounds Handler's
	// codecs decode only a prefix (publishcodec.go), and what was decoded
	// must never be stored.
	if len(pubs) > MaxPublishManyEntries {
		return nil, rpcerr.InvalidArgument("publishes", "more than %d entries in one call, the entry limit", MaxPublishManyEntries)
	}
	records, bytes := 0, 0
	for _, p := range pubs {
		records += len(p.GetRecords())
		for _, r := range p.GetRecords() {
			bytes += recordBytes(r)
		}
	}
	if records > s.limits.MaxBatchRecords {
		return nil, rpcerr.InvalidArgument("publishes", "more than %d records in all entries, the batch limit", s.limits.MaxBatchRecords)
	}
	if len(pubs) == 0 {
		return nil, rpcerr.InvalidArgument("publishes", "a call needs at least one entry")
	}
	if bytes > s.limits.MaxBatchBytes {
		return nil, rpcerr.InvalidArgument("publishes", "%d bytes in all entries exceeds the batch limit of %d", bytes, s.limits.MaxBatchBytes)
	}
	first := make(map[string]int, len(pubs))
	for i, p := range pubs {
		if j, ok := first[p.GetStream()]; ok {
			return nil, rpcerr.InvalidArgument(fmt.Sprintf("publishes[%d].stream", i), "stream %q is also publishes[%d]'s: one entry per stream", p.GetStream(), j)
		}
		first[p.GetStream()] = i
	}
	out := &strandv1.PublishManyResponse{Results: make([]*strandv1.PublishResult, len(pubs))}
	var wg sync.WaitGroup
	for i, p := range pubs {
		wg.Go(func() { out.Results[i] = s.publishEntry(ctx, i, p) })
	}
	wg.Wait()
	return connect.NewResponse(out), nil
}

// publishEntry is PublishMany's entry i: checked as the guard checks a
// Publish, then published as one.
func (s *StreamService) publishEntry(ctx context.Context, i int, p *strandv1.PublishRequest) *strandv1.PublishResult {
	err := auth.CheckEntry(ctx, p.GetStream(), p)
	var res *strandv1.PublishResponse
	if err == nil {
		res, err = s.publish(ctx, p, s.m.PublishEntry)
	}
	if err != nil {
		return &strandv1.PublishResult{Outcome: &strandv1.PublishResult_Error{Error: rpcerr.ToEntry(err, rpcerr.EntryPrefix("publishes", i))}}
	}
	return &strandv1.PublishResult{Outcome: &strandv1.PublishResult_Response{Response: res}}
}
