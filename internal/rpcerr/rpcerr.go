// Package rpcerr builds and reads Strand's typed error details across
// Connect (docs/errors.md), so no program, the client included, has to read
// an error's message to act on it:
//
//   - strand.v1.OwnerHint on the FailedPrecondition of a broker that does
//     not own the stream;
//   - strand.v1.LeaderHint on the Unavailable of a controller that does not
//     lead;
//   - google.rpc.BadRequest, one field violation, on an error that refuses a
//     request field's value (InvalidArgument, OutOfRange, ResourceExhausted);
//   - google.rpc.PreconditionFailure, one violation whose subject is the
//     field and whose type is one of the Precondition* reasons below, on a
//     FailedPrecondition whose field is well formed but does not fit the
//     cluster's state.
//
// The message of an error with a field detail still starts with the field.
package rpcerr

import (
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// The types of the PreconditionFailure violations Strand sends: which state
// the field's value does not fit. They are part of the wire contract
// (docs/errors.md).
const (
	// PreconditionIncarnation: the request names an incarnation of the
	// stream, and the stream that has the name now is another one (or has
	// no assignment). A delete retried after it deleted the stream sees it.
	PreconditionIncarnation = "STREAM_INCARNATION"
	// PreconditionPlacement: the copies asked for cannot be placed on the
	// live brokers, or dropping copies was asked for.
	PreconditionPlacement = "PLACEMENT"
	// PreconditionSequence: a record's producer sequence does not follow
	// the producer's last one (a gap: an earlier publish was lost) or the
	// batch's sequences are out of order.
	PreconditionSequence = "PRODUCER_SEQUENCE"
)

// NotOwner is the FailedPrecondition a broker answers when it does not own
// the stream; hint says who does, as far as the broker knows.
func NotOwner(hint *strandv1.OwnerHint) *connect.Error {
	msg := fmt.Sprintf("stream %q is not owned by this broker", hint.GetStream())
	if hint.GetNode() != "" {
		msg = fmt.Sprintf("stream %q is owned by %s at epoch %d", hint.GetStream(), hint.GetNode(), hint.GetEpoch())
	}
	return withDetail(connect.NewError(connect.CodeFailedPrecondition, errors.New(msg)), hint)
}

// NotLeader is the Unavailable a controller answers when it does not lead:
// with a LeaderHint when it knows the leader's address (leader non-empty),
// without one while no leader is elected. The message keeps the wording
// docs/api.md ("Controller leadership") gives for people and logs;
// programs read the hint.
func NotLeader(leader string) *connect.Error {
	if leader == "" {
		return connect.NewError(connect.CodeUnavailable, errors.New("not the controller leader; no leader is elected yet"))
	}
	err := connect.NewError(connect.CodeUnavailable, fmt.Errorf("not the controller leader; leader is at %s", leader))
	return withDetail(err, &strandv1.LeaderHint{Address: leader})
}

// OwnerHint extracts the owner hint from an error, if it carries one.
func OwnerHint(err error) (*strandv1.OwnerHint, bool) {
	return detail[*strandv1.OwnerHint](err)
}

// LeaderHint extracts the leader hint from an error, if it carries one with
// an address. Only an Unavailable counts: that is the one code a controller
// that does not lead answers with.
func LeaderHint(err error) (*strandv1.LeaderHint, bool) {
	if connect.CodeOf(err) != connect.CodeUnavailable {
		return nil, false
	}
	h, ok := detail[*strandv1.LeaderHint](err)
	return h, ok && h.GetAddress() != ""
}

// RetryDelay is the delay a RetryInfo detail of err names: when a service
// that refused a call for load (the controller's admission, a principal's
// byte budget) says to ask again. ok is false when err carries none, or a
// negative one.
func RetryDelay(err error) (time.Duration, bool) {
	ri, ok := detail[*errdetails.RetryInfo](err)
	if !ok || ri.GetRetryDelay() == nil {
		return 0, false
	}
	d := ri.GetRetryDelay().AsDuration()
	return d, d >= 0
}

// InvalidArgument refuses a request field's value: the message names the
// field and a BadRequest detail carries it.
func InvalidArgument(field string, format string, args ...any) *connect.Error {
	return BadField(connect.CodeInvalidArgument, field, format, args...)
}

// BadField is an error of code refusing a request field's value (an
// InvalidArgument, an OutOfRange offset, a ResourceExhausted record): the
// message names the field and a BadRequest detail carries it.
func BadField(code connect.Code, field string, format string, args ...any) *connect.Error {
	desc := fmt.Sprintf(format, args...)
	err := connect.NewError(code, fmt.Errorf("%s: %s", field, desc))
	return withDetail(err, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: desc}}})
}

// FieldPrecondition is a FailedPrecondition naming the field whose value
// the cluster's state does not fit; kind is a Precondition* type.
func FieldPrecondition(field, kind, format string, args ...any) *connect.Error {
	desc := fmt.Sprintf(format, args...)
	err := connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %s", field, desc))
	return withDetail(err, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: kind, Subject: field, Description: desc}}})
}

// FieldViolations returns the field violations of err's BadRequest
// details: the request fields whose values were refused.
func FieldViolations(err error) []*errdetails.BadRequest_FieldViolation {
	var out []*errdetails.BadRequest_FieldViolation
	for _, d := range details(err) {
		if br, ok := d.(*errdetails.BadRequest); ok {
			out = append(out, br.GetFieldViolations()...)
		}
	}
	return out
}

// Precondition returns the violation of kind (a Precondition* type) in
// err's PreconditionFailure details, if a FailedPrecondition carries one.
func Precondition(err error, kind string) (*errdetails.PreconditionFailure_Violation, bool) {
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		return nil, false
	}
	for _, d := range details(err) {
		pf, ok := d.(*errdetails.PreconditionFailure)
		if !ok {
			continue
		}
		for _, v := range pf.GetViolations() {
			if v.GetType() == kind {
				return v, true
			}
		}
	}
	return nil, false
}

// withDetail attaches msg to err. A detail that cannot be marshalled (it
// cannot happen for these messages) leaves err without it, still carrying
// its code and message.
func withDetail(err *connect.Error, msg proto.Message) *connect.Error {
	if d, derr := connect.NewErrorDetail(msg); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// detail returns the first detail of type T in err.
func detail[T proto.Message](err error) (T, bool) {
	for _, d := range details(err) {
		if v, ok := d.(T); ok {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// details decodes err's details, skipping those of types this binary does
// not know.
func details(err error) []proto.Message {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return nil
	}
	var out []proto.Message
	for _, d := range cerr.Details() {
		if v, verr := d.Value(); verr == nil {
			out = append(out, v)
		}
	}
	return out
}
