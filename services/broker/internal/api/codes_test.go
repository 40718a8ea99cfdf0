package api

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/sentinels"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// edgeSentinels is every exported sentinel of the packages whose errors
// reach the broker's edge, by package and name. The test checks it against
// the packages' source, so a sentinel added there fails until it is listed
// here and given a row in codes.
var edgeSentinels = map[string]map[string]error{
	"../replica": {
		"ErrUnknownStream":    replica.ErrUnknownStream,
		"ErrNoCopy":           replica.ErrNoCopy,
		"ErrInvalidFollow":    replica.ErrInvalidFollow,
		"ErrHandover":         replica.ErrHandover,
		"ErrUnavailable":      replica.ErrUnavailable,
		"ErrConfirmTimeout":   replica.ErrConfirmTimeout,
		"ErrNotMember":        replica.ErrNotMember,
		"ErrEpochMismatch":    replica.ErrEpochMismatch,
		"ErrPastTail":         replica.ErrPastTail,
		"ErrChainMismatch":    replica.ErrChainMismatch,
		"ErrStaleFence":       replica.ErrStaleFence,
		"ErrOtherIncarnation": replica.ErrOtherIncarnation,
	},
	"../storage": {
		"ErrIncarnation":     storage.ErrIncarnation,
		"ErrFenced":          storage.ErrFenced,
		"ErrSealed":          storage.ErrSealed,
		"ErrOffsetMismatch":  storage.ErrOffsetMismatch,
		"ErrChainMismatch":   storage.ErrChainMismatch,
		"ErrOutOfRange":      storage.ErrOutOfRange,
		"ErrClosed":          storage.ErrClosed,
		"ErrInvalidArgument": storage.ErrInvalidArgument,
		"ErrTooLarge":        storage.ErrTooLarge,
		"ErrCorrupt":         storage.ErrCorrupt,
		"ErrSequenceGap":     storage.ErrSequenceGap,
		"ErrBelowWindow":     storage.ErrBelowWindow,
		"ErrSequenceOrder":   storage.ErrSequenceOrder,
	},
}

// Every sentinel that can reach the edge has its own row, so none falls
// through to Internal ("internal error") by omission.
func TestCodesCoverEverySentinel(t *testing.T) {
	sentinels.CheckTable(t, edgeSentinels, func(sentinel error) (connect.Code, bool) {
		for _, c := range codes {
			if c.err == sentinel {
				return c.code, true
			}
		}
		return 0, false
	}, toConnect)
}

// A sequence error names the record's field in the message and in a typed
// detail: a PreconditionFailure for a gap or an order error, a BadRequest
// for a sequence below the dedupe window.
func TestSequenceErrorsCarryTheField(t *testing.T) {
	gap := toConnect(&storage.SequenceError{Err: storage.ErrSequenceGap, Index: 2, ProducerID: "p", Sequence: 9, Expected: 4})
	v, ok := rpcerr.Precondition(gap, rpcerr.PreconditionSequence)
	if !ok || v.GetSubject() != "records[2].sequence" || !strings.HasPrefix(connectMessage(gap), "records[2].sequence: ") {
		t.Errorf("gap: %v (violation %v), want FailedPrecondition naming records[2].sequence", gap, v)
	}
	below := toConnect(&storage.SequenceError{Err: storage.ErrBelowWindow, Index: 0, ProducerID: "p", Sequence: 1, First: 100})
	fv := rpcerr.FieldViolations(below)
	if connect.CodeOf(below) != connect.CodeOutOfRange || len(fv) != 1 || fv[0].GetField() != "records[0].sequence" {
		t.Errorf("below window: %v (violations %v), want OutOfRange naming records[0].sequence", below, fv)
	}
}

func connectMessage(err error) string {
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr.Message()
	}
	return ""
}
