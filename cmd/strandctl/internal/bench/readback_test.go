package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
)

// A read-back asks again after what a busy or moving cluster answers, and
// gives up at once on what asking again cannot change, or when the bench
// is stopping.
func TestReadBackRetryable(t *testing.T) {
	live := context.Background()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"owner moved", live, connect.NewError(connect.CodeFailedPrecondition, errors.New("not the owner")), true},
		{"unavailable", live, connect.NewError(connect.CodeUnavailable, errors.New("recovering")), true},
		{"deadline, wrapped", live, fmt.Errorf("client: read: %w after 5 attempts", context.DeadlineExceeded), true},
		{"not found", live, connect.NewError(connect.CodeNotFound, errors.New("no such stream")), false},
		{"invalid", live, connect.NewError(connect.CodeInvalidArgument, errors.New("from_offset")), false},
		{"data loss", live, connect.NewError(connect.CodeDataLoss, errors.New("chain")), false},
		{"bench stopping", stopped, connect.NewError(connect.CodeUnavailable, errors.New("recovering")), false},
	}
	for _, c := range cases {
		if got := readBackRetryable(c.ctx, c.err); got != c.want {
			t.Errorf("%s: readBackRetryable = %v, want %v", c.name, got, c.want)
		}
	}
}
