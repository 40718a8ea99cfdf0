package replica

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A follow call that broke on the owner's side names the owner suspect; one
// that failed on this copy's own storage does not.
func TestOwnerSuspected(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"owner unreachable", connect.NewError(connect.CodeUnavailable, errors.New("dial")), true},
		{"stream broke", fmt.Errorf("receive: %w", connect.NewError(connect.CodeUnknown, errors.New("EOF"))), true},
		{"owner timed out", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), true},
		{"owner refused the epoch", connect.NewError(connect.CodeFailedPrecondition, ErrEpochMismatch), false},
		{"own store closed", localErr(storage.ErrClosed), false},
		{"own write failed", localErr(errors.New("storage: syncing batch: input/output error")), false},
	} {
		if got := ownerSuspected(c.err); got != c.want {
			t.Errorf("%s: ownerSuspected(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
