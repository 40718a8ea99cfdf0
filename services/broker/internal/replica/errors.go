package replica

import (
	"errors"
	"fmt"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

var (
	// ErrUnknownStream: no assignment names the stream, no copy is held,
	// and the broker's assignments mirror etcd, so the stream does not
	// exist. While they do not, the same lookup is ErrUnavailable.
	ErrUnknownStream = errors.New("replica: unknown stream")
	// ErrNoCopy: a seal reached a broker that holds no copy of the stream
	// and is not a member of its assignment.
	ErrNoCopy = errors.New("replica: no copy of the stream on this broker")
	// ErrUnavailable: the copy cannot serve right now (recovering, sealed,
	// shutting down, role changing); a client should re-locate and retry.
	ErrUnavailable = errors.New("replica: unavailable")
	// ErrConfirmTimeout: W copies did not hold the records in time. The
	// records may remain, unconfirmed.
	ErrConfirmTimeout = errors.New("replica: confirm timeout")
	// ErrNotMember: a follow request from a node the assignment does not name.
	ErrNotMember = errors.New("replica: not a member of the assignment")
	// ErrEpochMismatch: a follow request at an epoch other than the owner's.
	ErrEpochMismatch = errors.New("replica: epoch mismatch")
	// ErrInvalidFollow: a Follow call's message that is not valid for the
	// call as a whole (another node, a start without an id); it ends the
	// call.
	ErrInvalidFollow = errors.New("replica: invalid follow request")
	// ErrPastTail: a follower claims more than the owner holds.
	ErrPastTail = errors.New("replica: past the owner's tail")
	// ErrChainMismatch: the follower's prefix disagrees with the owner's.
	ErrChainMismatch = errors.New("replica: chain mismatch")
	// ErrStaleFence: a seal below the copy's epoch.
	ErrStaleFence = errors.New("replica: stale fence epoch")
	// ErrOtherIncarnation: a seal for another incarnation of the stream
	// (one deleted, or created again, since).
	ErrOtherIncarnation = errors.New("replica: seal for another incarnation of the stream")
)

// FollowFieldError is an ErrInvalidFollow naming the message field it
// refuses, so the edge answers it as any refused field: InvalidArgument
// with the field in its message and a BadRequest detail (docs/errors.md).
type FollowFieldError struct {
	Field, Detail string
}

func (e *FollowFieldError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidFollow, e.Field, e.Detail)
}

func (e *FollowFieldError) Unwrap() error { return ErrInvalidFollow }

// NotOwnerError says this broker does not own the stream, and who does.
type NotOwnerError struct {
	Hint *strandv1.OwnerHint
}

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("replica: stream %q not owned here (owner %q at epoch %d)", e.Hint.GetStream(), e.Hint.GetNode(), e.Hint.GetEpoch())
}
