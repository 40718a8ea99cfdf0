package admin

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/rebalance"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// codes is the one table mapping the controller's sentinel errors to Connect
// codes: every exported Err* of the packages whose errors reach the admin
// edge (TestCodesCoverEverySentinel holds it to that). Their messages are
// written for operators and name the stream or node; anything else is
// reported without its internals. Errors that name a request field do not
// come through here: the handlers answer them with rpcerr's field errors,
// which carry the field as a typed detail (docs/errors.md).
var codes = []struct {
	err  error
	code connect.Code
}{
	// A write that lost its term; the client asks again, and the
	// controller it reaches then names the new leader.
	{leader.ErrNotLeader, connect.CodeUnavailable},
	// A call the controller had no room for was not begun: the client
	// retries it with backoff (admit answers it with a RetryInfo).
	{ErrBusy, connect.CodeUnavailable},
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
	// A guarded transaction that did not commit wrote nothing: a retry
	// reads the new state.
	{transition.ErrConflict, connect.CodeAborted},
	{placement.ErrNotEnoughBrokers, connect.CodeFailedPrecondition},
	// Handovers and drains (docs/errors.md, "AdminService"): a broker
	// nothing names does not exist; the rest refuse a move the cluster's
	// state does not allow now, and change nothing.
	{rebalance.ErrNoBroker, connect.CodeNotFound},
	{rebalance.ErrNotFollower, connect.CodeFailedPrecondition},
	{rebalance.ErrAlreadyOwner, connect.CodeFailedPrecondition},
	{rebalance.ErrNotInSync, connect.CodeFailedPrecondition},
	{rebalance.ErrOwnerDown, connect.CodeFailedPrecondition},
	{rebalance.ErrCatchUp, connect.CodeFailedPrecondition},
	{rebalance.ErrLastBroker, connect.CodeFailedPrecondition},
	// Names and policies are validated by the handlers, which name the
	// field; these rows answer one that slips through as the client's
	// mistake all the same.
	{cluster.ErrInvalidName, connect.CodeInvalidArgument},
	{cluster.ErrInvalidPolicy, connect.CodeInvalidArgument},
	// A stored value that does not decode, or a key outside its
	// directory: the cluster's state is damaged, and a retry will not
	// mend it.
	{cluster.ErrCorrupt, connect.CodeInternal},
	{cluster.ErrNotInDir, connect.CodeInternal},
	// Credentials (auth.go): names are validated by the handlers, which
	// name the field; a write that did not commit wrote nothing.
	{auth.ErrInvalid, connect.CodeInvalidArgument},
	{auth.ErrNotCommitted, connect.CodeAborted},
	{auth.ErrBootstrapped, connect.CodeFailedPrecondition},
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
