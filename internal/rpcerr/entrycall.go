package rpcerr

import (
	"context"
	"sync/atomic"
)

// EntriesContext is the context of a call carrying the entries of several
// callers (PublishMany, SealMany): derived from parent, it lasts while any
// entry's caller still waits (any of entries not done) and is cancelled
// once none does, as their calls alone would have been. stop cancels it and
// releases what watches the entries; call it when the call returns.
func EntriesContext(parent context.Context, entries []context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	var left atomic.Int64
	left.Store(int64(len(entries)))
	stops := make([]func() bool, 0, len(entries))
	for _, e := range entries {
		stops = append(stops, context.AfterFunc(e, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}
