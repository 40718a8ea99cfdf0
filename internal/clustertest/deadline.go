package clustertest

import (
	"context"
	"time"
)

// PastDeadline is a context whose deadline has passed while its Err still
// reads nil, as a context.WithDeadline's does until its timer goroutine
// runs on a busy machine: what code that must not act past a deadline
// (rpcerr.EntryEnded) has to see through.
func PastDeadline() context.Context { return pastDeadline{context.Background()} }

type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
