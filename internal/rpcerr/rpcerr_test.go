package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/strandhq/strand/internal/clustertest"
)

// Each builder's detail is read back through wrapping, and only the reader
// of its own kind finds it.
func TestDetailsReadBack(t *testing.T) {
	bad := fmt.Errorf("client: publish: %w", BadField(connect.CodeResourceExhausted, "records[2]", "%d bytes", 9))
	if fv := FieldViolations(bad); connect.CodeOf(bad) != connect.CodeResourceExhausted || len(fv) != 1 || fv[0].GetField() != "records[2]" || fv[0].GetDescription() != "9 bytes" {
		t.Errorf("BadField: code %v, violations %v", connect.CodeOf(bad), fv)
	}
	var cerr *connect.Error
	if !errors.As(bad, &cerr) || cerr.Message() != "records[2]: 9 bytes" {
		t.Errorf("BadField message %q, want the field first", cerr.Message())
	}
	if _, ok := Precondition(bad, PreconditionPlacement); ok {
		t.Error("a BadRequest read as a PreconditionFailure")
	}

	pre := FieldPrecondition("incarnation", PreconditionIncarnation, "stream %q is incarnation %q", "s", "b")
	if v, ok := Precondition(pre, PreconditionIncarnation); !ok || v.GetSubject() != "incarnation" {
		t.Errorf("FieldPrecondition: violation %v, %v", v, ok)
	}
	if _, ok := Precondition(pre, PreconditionPlacement); ok {
		t.Error("a violation of one type read as another")
	}
	if len(FieldViolations(pre)) != 0 {
		t.Error("a PreconditionFailure read as a BadRequest")
	}

	if h, ok := LeaderHint(fmt.Errorf("wrapped: %w", NotLeader("10.0.0.1:7102"))); !ok || h.GetAddress() != "10.0.0.1:7102" {
		t.Errorf("LeaderHint of NotLeader: %v, %v", h, ok)
	}
	if _, ok := LeaderHint(NotLeader("")); ok {
		t.Error("a leader hint without a leader")
	}
	if _, ok := OwnerHint(NotLeader("x:1")); ok {
		t.Error("a leader hint read as an owner hint")
	}
}

func TestRetryDelay(t *testing.T) {
	withInfo := connect.NewError(connect.CodeUnavailable, errors.New("busy"))
	d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(250 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	withInfo.AddDetail(d)
	if got, ok := RetryDelay(withInfo); !ok || got != 250*time.Millisecond {
		t.Fatalf("RetryDelay = %v, %v; want 250ms", got, ok)
	}
	if got, ok := RetryDelay(connect.NewError(connect.CodeUnavailable, errors.New("down"))); ok {
		t.Fatalf("RetryDelay without a RetryInfo = %v, want none", got)
	}
	if got, ok := RetryDelay(errors.New("plain")); ok {
		t.Fatalf("RetryDelay of a non-Connect error = %v, want none", got)
	}
}

func TestEntryEnded(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	later, cancelLater := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLater()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"no deadline", context.Background(), false},
		{"deadline ahead", later, false},
		{"cancelled", cancelled, true},
		{"deadline passed, Err still nil", clustertest.PastDeadline(), true},
	} {
		if got := EntryEnded(c.ctx); got != c.want {
			t.Errorf("%s: EntryEnded = %v, want %v", c.name, got, c.want)
		}
	}
}
