package admin

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// codes is the one table mapping the controller's sentinel errors to Connect
// codes. Their messages are written for operators and name the stream or
// node; anything else is reported without its internals.
var codes = []struct {
	err  error
	code connect.Code
}{
	{leader.ErrNotLeader, connect.CodeUnavailable},
	{transition.ErrNoStream, connect.CodeNotFound},
	{transition.ErrNoRecovery, connect.CodeNotFound},
	{transition.ErrPending, connect.CodeFailedPrecondition},
	{transition.ErrNoCandidate, connect.CodeFailedPrecondition},
	{transition.ErrOwnerLive, connect.CodeFailedPrecondition},
	{transition.ErrNotCopy, connect.CodeFailedPrecondition},
	{transition.ErrNotLive, connect.CodeFailedPrecondition},
	{transition.ErrNotFastPath, connect.CodeFailedPrecondition},
	{transition.ErrSingleCopy, connect.CodeFailedPrecondition},
	{transition.ErrDroppingCopies, connect.CodeFailedPrecondition},
	{transition.ErrConflict, connect.CodeAborted},
	{placement.ErrNotEnoughBrokers, connect.CodeFailedPrecondition},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
	{context.Canceled, connect.CodeCanceled},
}

// toConnect maps err through the table.
func (s *Service) toConnect(err error) error {
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return connect.NewError(c.code, err)
		}
	}
	s.log.Warn().Err(err).Msg("admin request failed on the coordination store; the client may retry")
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("coordination store unavailable"))
}

// fieldPrecondition is a FailedPrecondition naming the field whose value the
// cluster cannot satisfy.
func fieldPrecondition(field, format string, args ...any) *connect.Error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}
