package rebalance

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// A target that does not catch up: the handover is abandoned before
// anything is written (no term is needed), with an answer naming the
// target and how far behind it is; the owner was asked at the
// assignment's epoch, for the target, with the bound given.
func TestHandoverNotCaughtUpIsAbandoned(t *testing.T) {
	var asked *strandv1.HandoverRequest
	m := &Mover{Log: zerolog.Nop(), Call: func(_ context.Context, addr string, req *strandv1.HandoverRequest) (*strandv1.HandoverResponse, error) {
		if addr != "b1:1" {
			t.Errorf("asked %s, want the owner b1:1", addr)
		}
		asked = req
		return &strandv1.HandoverResponse{RecordTail: 50, CursorEventTail: 4, TargetRecordTail: 38, TargetCursorEventTail: 4}, nil
	}}
	_, err := m.Handover(context.Background(), nil, inSync().Snapshot(), "s", "b2", 300*time.Millisecond)
	if !errors.Is(err, ErrCatchUp) || !strings.Contains(err.Error(), `"b2" is 12 records and 0 cursor events behind`) {
		t.Fatalf("handover: %v, want ErrCatchUp naming b2 and its lag of 12", err)
	}
	if asked.GetEpoch() != 2 || asked.GetTarget() != "b2" || asked.GetCatchUpMs() != 300 || asked.GetResume() {
		t.Fatalf("the owner was asked %v", asked)
	}
}

// An owner that cannot be asked: the handover is not made, and the answer
// is one a caller retries (Aborted), never a recovery written blind.
func TestHandoverOwnerUnreachable(t *testing.T) {
	m := &Mover{Log: zerolog.Nop(), Call: func(context.Context, string, *strandv1.HandoverRequest) (*strandv1.HandoverResponse, error) {
		return nil, errors.New("connection refused")
	}}
	if _, err := m.Handover(context.Background(), nil, inSync().Snapshot(), "s", "b3", 0); !errors.Is(err, transition.ErrConflict) {
		t.Fatalf("handover: %v, want ErrConflict", err)
	}
	// A refused decision asks no broker at all.
	m.Call = func(context.Context, string, *strandv1.HandoverRequest) (*strandv1.HandoverResponse, error) {
		t.Fatal("a broker was asked for a handover the decision refused")
		return nil, nil
	}
	if _, err := m.Handover(context.Background(), nil, inSync().Drain("b3").Snapshot(), "s", "b3", 0); !errors.Is(err, ErrNotInSync) {
		t.Fatalf("handover to a draining follower: %v, want ErrNotInSync", err)
	}
}
