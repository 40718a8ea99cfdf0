package client

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/rpcerr"
)

// Errors from a Client keep the cluster's answer in their chain:
// connect.CodeOf(err) is its Connect code, errors.As(err, &cerr) with a
// *connect.Error finds it, and the functions below read its typed details
// (docs/errors.md lists, per RPC, each code, when it comes and what it
// carries). Once the client's retries end, errors.Is(err,
// context.DeadlineExceeded) holds too, and the code is that of the last
// answer.

// OwnerHint returns the owner hint a broker that does not own a stream
// attached to err (a FailedPrecondition): the owner's node, address and
// epoch, as far as that broker knew.
func OwnerHint(err error) (*strandv1.OwnerHint, bool) { return rpcerr.OwnerHint(err) }

// LeaderHint returns the leader hint a controller that does not lead
// attached to err (an Unavailable): the leader's address. The client
// follows it by itself; a caller sees it only once the redirects or the
// deadline ran out.
func LeaderHint(err error) (*strandv1.LeaderHint, bool) { return rpcerr.LeaderHint(err) }

// FieldViolations returns the request fields err says were refused (the
// google.rpc.BadRequest detail of an InvalidArgument, an OutOfRange or a
// ResourceExhausted), each with its field path (e.g. records[3].headers)
// and a description. It is empty for any other error.
func FieldViolations(err error) []*errdetails.BadRequest_FieldViolation {
	return rpcerr.FieldViolations(err)
}
