// Package rpcerr carries Strand's structured error details across Connect:
// the owner hint a broker attaches when it does not own a stream, and the
// field name attached to InvalidArgument.
package rpcerr

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// NotOwner is the FailedPrecondition a broker answers when it does not own
// the stream; hint says who does, as far as the broker knows.
func NotOwner(hint *strandv1.OwnerHint) *connect.Error {
	msg := fmt.Sprintf("stream %q is not owned by this broker", hint.GetStream())
	if hint.GetNode() != "" {
		msg = fmt.Sprintf("stream %q is owned by %s at epoch %d", hint.GetStream(), hint.GetNode(), hint.GetEpoch())
	}
	err := connect.NewError(connect.CodeFailedPrecondition, errors.New(msg))
	if d, derr := connect.NewErrorDetail(hint); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// OwnerHint extracts the owner hint from an error, if it carries one.
func OwnerHint(err error) (*strandv1.OwnerHint, bool) {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return nil, false
	}
	for _, d := range cerr.Details() {
		v, verr := d.Value()
		if verr != nil {
			continue
		}
		if h, ok := v.(*strandv1.OwnerHint); ok {
			return h, true
		}
	}
	return nil, false
}

// InvalidArgument names the offending field in the message (docs/errors.md).
func InvalidArgument(field string, format string, args ...any) *connect.Error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
}
