// Package api serves a broker's Connect services: StreamService for clients
// and ReplicationService for peers. Handlers validate, call the replica
// manager and map its errors to Connect codes in one table (toConnect).
package api

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// toConnect is the one table from internal errors to Connect codes. Wire
// messages name the condition, never internals such as file paths.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr
	}
	var (
		notOwner *replica.NotOwnerError
		seq      *storage.SequenceError
	)
	switch {
	case errors.As(err, &notOwner):
		return rpcerr.NotOwner(notOwner.Hint)
	case errors.As(err, &seq):
		// Idempotent publish (stream.go, Publish): name the record's field.
		code := connect.CodeFailedPrecondition
		if errors.Is(err, storage.ErrBelowWindow) {
			code = connect.CodeOutOfRange
		}
		return connect.NewError(code, fmt.Errorf("records[%d].sequence: %s", seq.Index, seq.Detail()))
	case errors.Is(err, replica.ErrUnknownStream):
		return connect.NewError(connect.CodeNotFound, errors.New(err.Error()))
	case errors.Is(err, replica.ErrUnavailable), errors.Is(err, replica.ErrConfirmTimeout),
		errors.Is(err, storage.ErrSealed), errors.Is(err, storage.ErrClosed):
		return connect.NewError(connect.CodeUnavailable, errors.New(err.Error()))
	case errors.Is(err, replica.ErrNotMember):
		return connect.NewError(connect.CodePermissionDenied, errors.New(err.Error()))
	case errors.Is(err, replica.ErrEpochMismatch), errors.Is(err, replica.ErrStaleFence), errors.Is(err, replica.ErrOtherIncarnation),
		errors.Is(err, storage.ErrFenced):
		return connect.NewError(connect.CodeFailedPrecondition, errors.New(err.Error()))
	case errors.Is(err, replica.ErrPastTail), errors.Is(err, storage.ErrOutOfRange):
		return connect.NewError(connect.CodeOutOfRange, errors.New(err.Error()))
	case errors.Is(err, replica.ErrChainMismatch), errors.Is(err, storage.ErrChainMismatch):
		return connect.NewError(connect.CodeDataLoss, errors.New(err.Error()))
	case errors.Is(err, storage.ErrTooLarge):
		// A record above what one storage entry holds (reached when
		// --max-record-bytes is set above it): too large, as DESIGN says.
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("records: %s", err.Error()))
	case errors.Is(err, replica.ErrInvalidFollow):
		return connect.NewError(connect.CodeInvalidArgument, errors.New(err.Error()))
	case errors.Is(err, storage.ErrInvalidArgument):
		// Input storage refuses that the handler's checks let through
		// (its message names what and the bound).
		return connect.NewError(connect.CodeInvalidArgument, errors.New(err.Error()))
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, errors.New("internal error"))
}
