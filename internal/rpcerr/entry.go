package rpcerr

import (
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// A call carrying several requests (StreamService.PublishMany, docs/api.md
// "PublishMany") answers each entry what the request alone would have
// answered, as a strand.v1.PublishError: the code, the message and the
// details of the Connect error, with every field they name put under the
// entry's ("records[0].sequence" of entry 2 is
// "publishes[2].records[0].sequence"). FromEntry takes the entry's prefix
// off again, so a client hands its caller the error of a Publish.

// EntryPrefix is what the fields of entry i of the repeated field list are
// named under: "publishes[2].".
func EntryPrefix(list string, i int) string { return fmt.Sprintf("%s[%d].", list, i) }

// ToEntry is err as the entry under prefix answers it. An error that is no
// *connect.Error is Unknown with its message, as connect-go would send it.
func ToEntry(err error, prefix string) *strandv1.PublishError {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return &strandv1.PublishError{Code: uint32(connect.CodeUnknown), Message: err.Error()}
	}
	out := &strandv1.PublishError{Code: uint32(cerr.Code()), Message: cerr.Message()}
	renamed := false
	for _, d := range cerr.Details() {
		a := &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()}
		if v, verr := d.Value(); verr == nil && renameFields(v, func(f string) (string, bool) { return prefix + f, true }) {
			renamed = true
			if na, aerr := anypb.New(v); aerr == nil {
				a = na
			}
		}
		out.Details = append(out.Details, a)
	}
	if renamed {
		// rpcerr's messages start with the field they refuse (BadField).
		out.Message = prefix + out.Message
	}
	return out
}

// FromEntry is the error pe carries with prefix taken off the fields it
// names: what a request alone, not an entry of a call, would have answered.
func FromEntry(pe *strandv1.PublishError, prefix string) *connect.Error {
	code := connect.Code(pe.GetCode())
	if code == 0 || code > connect.CodeUnauthenticated {
		code = connect.CodeUnknown
	}
	var ds []*connect.ErrorDetail
	renamed := false
	for _, a := range pe.GetDetails() {
		if v, err := a.UnmarshalNew(); err == nil && renameFields(v, func(f string) (string, bool) {
			return strings.CutPrefix(f, prefix)
		}) {
			renamed = true
			if na, aerr := anypb.New(v); aerr == nil {
				a = na
			}
		}
		if d, err := connect.NewErrorDetail(a); err == nil {
			ds = append(ds, d)
		}
	}
	msg := pe.GetMessage()
	if renamed {
		msg = strings.TrimPrefix(msg, prefix)
	}
	out := connect.NewError(code, errors.New(msg))
	for _, d := range ds {
		out.AddDetail(d)
	}
	return out
}

// renameFields renames the fields a BadRequest or PreconditionFailure
// detail names by rename, and reports whether it renamed any.
func renameFields(m proto.Message, rename func(string) (string, bool)) bool {
	renamed := false
	do := func(f *string) {
		if n, ok := rename(*f); ok {
			*f, renamed = n, true
		}
	}
	switch d := m.(type) {
	case *errdetails.BadRequest:
		for _, v := range d.GetFieldViolations() {
			do(&v.Field)
		}
	case *errdetails.PreconditionFailure:
		for _, v := range d.GetViolations() {
			do(&v.Subject)
		}
	}
	return renamed
}
