// Package logging builds the zerolog loggers every Strand service uses and
// names the field keys, so logs stay greppable across services.
package logging

import (
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"
)

// Field keys used across services.
const (
	Service         = "service"
	Node            = "node"
	Stream          = "stream"
	Epoch           = "epoch"
	FenceEpoch      = "fence_epoch"
	Transition      = "transition_id"
	RecordTail      = "record_tail"
	CursorEventTail = "cursor_event_tail"
	Owner           = "owner"
	Followers       = "followers"
	Policy          = "policy"
	Addr            = "addr"
	Reason          = "reason"
	Who             = "who"
	Why             = "why"
)

// Field keys of a broker's store (services/broker/internal/storage), for
// what it reports about its disk.
const (
	// Detail is a library's own message (Badger's).
	Detail = "detail"
	// CutTo is the record tail a copy is cut back to.
	CutTo = "cut_to"
	// Torn, Repaired and Lost count values an interrupted write or value
	// log GC left unreadable, read back, and lost.
	Torn     = "torn"
	Repaired = "repaired"
	Lost     = "lost"
	// FromVersion is the Badger version a rollback returned to.
	FromVersion = "from_version"
	// Keys counts the keys a recovery pass looked at.
	Keys = "keys"
	// WritesHeld is how long writes waited on a value log GC rewrite.
	WritesHeld = "writes_held"
	// Files names the files a repair before Badger's open removed.
	Files = "files"
)

// Millisecond timestamps: failover phases are measured from these logs. Set
// once, before any goroutine logs, since it is a zerolog global.
func init() { zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00" }

// New returns a logger for service writing JSON to w at level ("debug",
// "info", "warn", "error"; info when empty or unknown). STRAND_LOG_FORMAT=console
// switches to human-readable output.
func New(w io.Writer, service, level string) zerolog.Logger {
	if w == nil {
		w = os.Stderr
	}
	if strings.EqualFold(os.Getenv("STRAND_LOG_FORMAT"), "console") {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str(Service, service).Logger()
}
