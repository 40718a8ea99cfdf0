package rpcerr

import (
	"context"
	"sync/atomic"
	"time"
)

// EntryEnded reports whether an entry's caller has stopped waiting: its
// context ended, or its deadline passed. A context's deadline timer fires
// on a goroutine of its own, and on a busy machine ctx.Err() can stay nil
// for milliseconds past the deadline while the caller, woken by another
// context with the same deadline, has already been answered. An entry
// taken into a call then would reach the server after its caller gave up
// on it: a publish the caller was told timed out, a seal for a round no
// longer listening.
func EntryEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

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
