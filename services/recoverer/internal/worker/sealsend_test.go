package worker

import (
	"context"
	"errors"
	"testing"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/clustertest"
)

// A seal whose round has stopped listening is never sent: not one whose
// context ended, nor one whose deadline passed before its context says so
// (a late seal fences a copy for a round gone). Each is answered with its
// context's outcome; the live one alone goes into the call.
func TestSealSenderTakesNoEndedSeal(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	entry := func(ctx context.Context, stream string) *sealEntry {
		return &sealEntry{ctx: ctx, req: &strandv1.SealRequest{Stream: stream}, res: make(chan sealAnswer, 1)}
	}
	live := entry(context.Background(), "live")
	gone := entry(cancelled, "gone")
	late := entry(clustertest.PastDeadline(), "late")
	s := &sealSender{queue: []*sealEntry{gone, late, live}}
	s.mu.Lock()
	batch := s.takeLocked()
	s.mu.Unlock()
	if len(batch) != 1 || batch[0] != live {
		var names []string
		for _, e := range batch {
			names = append(names, e.req.GetStream())
		}
		t.Fatalf("call carries %v, want only live", names)
	}
	for _, c := range []struct {
		e    *sealEntry
		want error
	}{{gone, context.Canceled}, {late, context.DeadlineExceeded}} {
		select {
		case a := <-c.e.res:
			if !errors.Is(a.err, c.want) {
				t.Errorf("%s answered %v, want %v", c.e.req.GetStream(), a.err, c.want)
			}
		default:
			t.Errorf("%s not answered", c.e.req.GetStream())
		}
	}
	if len(s.queue) != 0 {
		t.Errorf("%d seals left queued, want 0", len(s.queue))
	}
}
