package storage

import (
	"errors"
	"fmt"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Sentinel errors. Every error the package returns wraps one of them with %w
// and adds the numbers that explain it, so callers match with errors.Is and
// the RPC edge maps them to Connect codes from one table.
var (
	// ErrIncarnation: the copy belongs to another incarnation of the name.
	ErrIncarnation = errors.New("storage: another incarnation of the stream")
	// ErrFenced: the caller's epoch is below the copy's epoch, the copy is
	// sealed against replication, or a record carries an epoch the copy has
	// not reached.
	ErrFenced = errors.New("storage: fenced")
	// ErrSealed: the copy is sealed; owner appends and cursor commits are
	// refused until a role change at or after the fence epoch releases it.
	ErrSealed = errors.New("storage: sealed")
	// ErrOffsetMismatch: replicated entries do not start exactly at the tail
	// or are not dense.
	ErrOffsetMismatch = errors.New("storage: offset mismatch")
	// ErrChainMismatch: a replicated record's chain value does not follow
	// from the copy's chain; the copy is not a prefix of the sender's log.
	ErrChainMismatch = errors.New("storage: chain mismatch")
	// ErrOutOfRange: an offset outside [head, tail].
	ErrOutOfRange = errors.New("storage: offset out of range")
	// ErrClosed: the DB or the stream is closed (or dropped), or the DB
	// stopped after a write failure.
	// It is the engine's: a write the engine refused is this too.
	ErrClosed = engine.ErrClosed
	// ErrInvalidArgument: malformed input (an empty or oversized cursor
	// name, a bad stream name, an oversized producer id).
	ErrInvalidArgument = errors.New("storage: invalid argument")
	// ErrTooLarge: a record too large for one storage entry (half of
	// Badger's transaction bound). It is an ErrInvalidArgument too; the
	// API answers it ResourceExhausted, like any record too large.
	ErrTooLarge = fmt.Errorf("%w: record too large", ErrInvalidArgument)
	// ErrCorrupt: stored bytes that do not decode.
	ErrCorrupt = errors.New("storage: corrupt")
	// ErrSequenceGap: a record's sequence skips ahead of its producer's
	// next one (doc.go, "Idempotent publish"). Wrapped in a SequenceError.
	ErrSequenceGap = errors.New("storage: sequence gap")
	// ErrBelowWindow: a record's sequence is at or below its producer's last
	// one but older than the records the dedupe window keeps, so whether it
	// is stored cannot be told. Wrapped in a SequenceError.
	ErrBelowWindow = errors.New("storage: sequence below the dedupe window")
	// ErrSequenceOrder: a batch repeats a sequence, or a duplicate follows a
	// record that is new, so it is not a retry of one earlier batch.
	// Wrapped in a SequenceError.
	ErrSequenceOrder = errors.New("storage: sequence out of order")
)
