// Package api serves a broker's Connect services: StreamService for clients
// and ReplicationService for peers. Handlers validate, call the replica
// manager and map its errors to Connect codes in one table (codes).
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

// codes is the one table from the sentinel errors of the packages whose
// errors reach the broker's edge (replica, storage) to Connect codes:
// every exported Err* of them has a row (TestCodesCoverEverySentinel holds
// it to that). Rows are tried in order, so an error that wraps two
// sentinels (storage.ErrTooLarge is an ErrInvalidArgument) takes the first.
// msg, when set, replaces the error's own message on the wire: those
// errors' messages name internals (keys, files) a client has no use for.
var codes = []struct {
	err  error
	code connect.Code
	msg  string
}{
	// NotFound only when the broker's assignments mirror etcd: while they
	// do not, the same lookup is ErrUnavailable (docs/errors.md).
	{err: replica.ErrUnknownStream, code: connect.CodeNotFound},
	// Recovering, sealed, shutting down, role changing, or the view of
	// assignments not current: a client locates the owner again and
	// retries.
	{err: replica.ErrUnavailable, code: connect.CodeUnavailable},
	// W copies did not hold the records in time; they may remain.
	{err: replica.ErrConfirmTimeout, code: connect.CodeUnavailable},
	{err: replica.ErrNotMember, code: connect.CodePermissionDenied},
	{err: replica.ErrEpochMismatch, code: connect.CodeFailedPrecondition},
	{err: replica.ErrPastTail, code: connect.CodeOutOfRange},
	{err: replica.ErrChainMismatch, code: connect.CodeDataLoss},
	{err: replica.ErrStaleFence, code: connect.CodeFailedPrecondition},
	{err: replica.ErrOtherIncarnation, code: connect.CodeFailedPrecondition},
	// A seal to a broker with no copy: the stream may exist elsewhere, so
	// not NotFound.
	{err: replica.ErrNoCopy, code: connect.CodeFailedPrecondition},
	// A Follow call's message that does not hold together (its message
	// names the field): the peer's bug, not this copy's state.
	{err: replica.ErrInvalidFollow, code: connect.CodeInvalidArgument},
	// A handover the owner cannot begin (not the owner at that epoch, a
	// target that is no follower, another handover under way): the
	// controller reads the cluster again.
	{err: replica.ErrHandover, code: connect.CodeFailedPrecondition},
	{err: storage.ErrIncarnation, code: connect.CodeFailedPrecondition},
	{err: storage.ErrFenced, code: connect.CodeFailedPrecondition},
	{err: storage.ErrSealed, code: connect.CodeUnavailable},
	{err: storage.ErrClosed, code: connect.CodeUnavailable},
	// Replicated entries that do not start at the copy's tail: the
	// sender's view of this copy is behind, not the copy broken.
	{err: storage.ErrOffsetMismatch, code: connect.CodeFailedPrecondition},
	{err: storage.ErrChainMismatch, code: connect.CodeDataLoss},
	{err: storage.ErrCorrupt, code: connect.CodeDataLoss, msg: "stored data of the stream does not decode"},
	{err: storage.ErrOutOfRange, code: connect.CodeOutOfRange},
	// Producer sequences normally come wrapped in a SequenceError, which
	// toConnect answers naming the record's field; these rows answer one
	// that does not.
	{err: storage.ErrSequenceGap, code: connect.CodeFailedPrecondition},
	{err: storage.ErrSequenceOrder, code: connect.CodeFailedPrecondition},
	{err: storage.ErrBelowWindow, code: connect.CodeOutOfRange},
	// A record above what one storage entry holds (reached when
	// --max-record-bytes is set above it): too large, as any record above
	// the limits is. Before ErrInvalidArgument, which it wraps.
	{err: storage.ErrTooLarge, code: connect.CodeResourceExhausted},
	// Input storage refuses that the handler's checks let through (its
	// message names what and the bound).
	{err: storage.ErrInvalidArgument, code: connect.CodeInvalidArgument},
	{err: context.Canceled, code: connect.CodeCanceled},
	{err: context.DeadlineExceeded, code: connect.CodeDeadlineExceeded},
}

// toConnect maps an error of the replica manager to its wire form: the
// owner hint and the producer sequence errors, which carry typed details,
// then the table. Wire messages name the condition, never internals such as
// file paths.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr
	}
	var (
		notOwner    *replica.NotOwnerError
		seq         *storage.SequenceError
		followField *replica.FollowFieldError
	)
	switch {
	case errors.As(err, &notOwner):
		return rpcerr.NotOwner(notOwner.Hint)
	case errors.As(err, &followField):
		// A Follow message that does not hold together: the peer's bug,
		// named by its field like any refused request field.
		return rpcerr.InvalidArgument(followField.Field, "%s", followField.Detail)
	case errors.As(err, &seq):
		// Idempotent publish (stream.go, Publish): name the record's field.
		field := fmt.Sprintf("records[%d].sequence", seq.Index)
		if errors.Is(err, storage.ErrBelowWindow) {
			// Whether the record is stored cannot be told any more: the
			// value is out of the range the broker can answer for.
			return rpcerr.BadField(connect.CodeOutOfRange, field, "%s", seq.Detail())
		}
		return rpcerr.FieldPrecondition(field, rpcerr.PreconditionSequence, "%s", seq.Detail())
	case errors.Is(err, storage.ErrTooLarge):
		return rpcerr.BadField(connect.CodeResourceExhausted, "records", "%s", err.Error())
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			msg := c.msg
			if msg == "" {
				msg = err.Error()
			}
			return connect.NewError(c.code, errors.New(msg))
		}
	}
	return connect.NewError(connect.CodeInternal, errors.New("internal error"))
}
