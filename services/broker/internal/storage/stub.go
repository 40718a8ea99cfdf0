package storage

// This file fixes the storage API the broker is written against. The storage
// implementation replaces it; signatures stay.

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"
)

// Options configures one broker's Badger store.
type Options struct {
	Dir    string
	Logger zerolog.Logger
	// MemTableBytes and CacheBytes bound Badger's memory; 0 picks small defaults.
	MemTableBytes int64
	CacheBytes    int64
}

// Record is one record as the log holds it.
type Record struct {
	Offset      uint64
	Epoch       uint64
	Payload     []byte
	Headers     map[string]string
	PublishTime time.Time
	ProducerID  string
	Sequence    uint64
	// Chain is the running checksum over every record up to and including this one.
	Chain uint64
}

// CursorEvent is one cursor commit in the cursor event log.
type CursorEvent struct {
	Offset   uint64
	Epoch    uint64
	Cursor   string
	Position uint64
}

// LogEpoch says from which offsets of both logs entries came from an epoch.
type LogEpoch struct {
	Epoch            uint64
	RecordStart      uint64
	CursorEventStart uint64
}

// Retention bounds the retained log; zero fields are unbounded.
type Retention struct {
	MaxRecords uint64
	MaxBytes   uint64
	MaxAge     time.Duration
}

// State is a snapshot of a copy's metadata and tails.
type State struct {
	Epoch            uint64
	LogEpochs        []LogEpoch
	SealEpoch        uint64
	SealTransition   string
	SealedLogEpochs  []LogEpoch
	Head             uint64
	RecordTail       uint64
	CursorEventTail  uint64
	Chain            uint64
	Bytes            uint64
	ConfirmWatermark uint64
}

var (
	ErrFenced         = errors.New("storage: fenced")
	ErrSealed         = errors.New("storage: sealed")
	ErrOffsetMismatch = errors.New("storage: offset mismatch")
	ErrChainMismatch  = errors.New("storage: chain mismatch")
	ErrOutOfRange     = errors.New("storage: offset out of range")
	ErrClosed         = errors.New("storage: closed")
)

type DB struct{}
type Stream struct{}

func Open(opts Options) (*DB, error)             { panic("stub") }
func (db *DB) Close() error                      { panic("stub") }
func (db *DB) Open(name string) (*Stream, error) { panic("stub") }
func (db *DB) Streams() ([]string, error)        { panic("stub") }
func (db *DB) Drop(name string) error            { panic("stub") }
func (s *Stream) Name() string                   { panic("stub") }
func (s *Stream) State() State                   { panic("stub") }
func (s *Stream) Append(ctx context.Context, epoch uint64, recs []Record) ([]Record, error) {
	panic("stub")
}
func (s *Stream) AppendReplicated(ctx context.Context, recs []Record, evs []CursorEvent) error {
	panic("stub")
}
func (s *Stream) ResetTo(head, chain uint64) error { panic("stub") }
func (s *Stream) Read(from uint64, maxRecords, maxBytes int) ([]Record, error) {
	panic("stub")
}
func (s *Stream) ChainAt(offset uint64) (uint64, error) { panic("stub") }
func (s *Stream) CommitCursor(ctx context.Context, epoch uint64, cursor string, position uint64) (CursorEvent, error) {
	panic("stub")
}
func (s *Stream) Cursor(name string) (uint64, bool)                            { panic("stub") }
func (s *Stream) ReadCursorEvents(from uint64, max int) ([]CursorEvent, error) { panic("stub") }
func (s *Stream) Snapshot() error                                              { panic("stub") }
func (s *Stream) AdvanceEpoch(epoch uint64) error                              { panic("stub") }
func (s *Stream) Seal(epoch uint64, transition string) (State, error)          { panic("stub") }
func (s *Stream) SetConfirmWatermark(w uint64)                                 { panic("stub") }
func (s *Stream) ApplyRetention(r Retention, now time.Time) (uint64, error)    { panic("stub") }
func (s *Stream) WaitTail(after uint64) <-chan struct{}                        { panic("stub") }
func (s *Stream) Cut(recordTail, cursorEventTail uint64) error                 { panic("stub") }
