// Package etcdcfg is how Strand configures an etcd it starts itself: the
// embedded etcd of `strandctl dev` (and so of the bench), the tests'
// (internal/etcdtest), and the flags of the compose and e2e containers.
// Each keeps its history compacted and its backend quota explicit
// (docs/etcd.md).
//
// Compaction is what keeps etcd's database bounded: every write is a new
// revision, and etcd keeps every revision until it is compacted away, so
// without it the database grows with every write until the quota stops
// all writes (the NOSPACE alarm), failover included. Strand reads only at
// the current revision and watches from a revision it has just read, and
// every watcher lists again when its revision was compacted, so a short
// history is all it needs.
package etcdcfg

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Auto-compaction modes, as etcd names them.
const (
	ModePeriodic = "periodic"
	ModeRevision = "revision"
)

// Defaults. Periodic, 1 minute: etcd's periodic compactor compacts once a
// period to the revision it had one period before, so it keeps between one
// and two minutes of history. That is long enough for a watch that
// reconnects after a short break (an etcd leader change, a restarted
// client, a few seconds of partition) to resume where it was instead of
// listing everything again, and short enough that the history of a
// cluster's start (thousands of streams created in a minute) is compacted
// within two minutes, so the database file reaches its working size early
// and then stays there (docs/etcd.md, "Compaction"). A watch away for
// longer lists and watches again, which every Strand watcher does. History
// is bounded by time whatever the write rate: at Strand's rates (a few
// revisions a second in a busy cluster, none in an idle one) a minute of
// history is well under a MB. Revision mode bounds the count of revisions
// instead, which under a burst of writes (a mass failover) shortens the
// window a watch can resume in to seconds.
//
// The quota is etcd's own default, 2 GiB, set explicitly so it is the one
// docs/etcd.md describes: Strand's keys take a few KB per stream, far
// below it, and compaction keeps history small.
const (
	DefaultMode       = ModePeriodic
	DefaultRetention  = "1m"
	DefaultQuotaBytes = int64(2) << 30
)

// Options are the compaction and quota settings of an etcd Strand starts.
type Options struct {
	// Mode is ModePeriodic or ModeRevision.
	Mode string
	// Retention is a duration for ModePeriodic ("5m", "1h"), a count of
	// revisions for ModeRevision ("10000"); "0" turns auto-compaction off.
	Retention string
	// QuotaBytes is the backend quota; past it etcd raises the NOSPACE
	// alarm and refuses writes.
	QuotaBytes int64
}

// Defaults returns the default options.
func Defaults() Options {
	return Options{Mode: DefaultMode, Retention: DefaultRetention, QuotaBytes: DefaultQuotaBytes}
}

// ErrInvalid is returned for options etcd would refuse or misread.
var ErrInvalid = errors.New("etcdcfg: invalid option")

// WithDefaults fills the zero fields of o with the defaults.
func (o Options) WithDefaults() Options {
	d := Defaults()
	if o.Mode == "" {
		o.Mode = d.Mode
	}
	if o.Retention == "" {
		o.Retention = d.Retention
	}
	if o.QuotaBytes == 0 {
		o.QuotaBytes = d.QuotaBytes
	}
	return o
}

// Validate checks o (after WithDefaults), naming the flag at fault by the
// names flagPrefix+"auto-compaction-mode", flagPrefix+"auto-compaction-retention"
// and flagPrefix+"quota-backend-bytes".
func (o Options) Validate(flagPrefix string) error {
	switch o.Mode {
	case ModePeriodic:
		if o.Retention == "0" {
			return nil
		}
		d, err := time.ParseDuration(o.Retention)
		if err != nil || d <= 0 {
			return fmt.Errorf("%w: --%sauto-compaction-retention %q must be a positive duration such as 5m in periodic mode (0 turns compaction off)", ErrInvalid, flagPrefix, o.Retention)
		}
	case ModeRevision:
		n, err := strconv.ParseInt(o.Retention, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: --%sauto-compaction-retention %q must be a count of revisions such as 10000 in revision mode (0 turns compaction off)", ErrInvalid, flagPrefix, o.Retention)
		}
	default:
		return fmt.Errorf("%w: --%sauto-compaction-mode %q must be %s or %s", ErrInvalid, flagPrefix, o.Mode, ModePeriodic, ModeRevision)
	}
	if o.QuotaBytes < 0 {
		return fmt.Errorf("%w: --%squota-backend-bytes %d must not be negative", ErrInvalid, flagPrefix, o.QuotaBytes)
	}
	return nil
}

// Apply sets o on the config of an embedded etcd.
func (o Options) Apply(cfg *embed.Config) {
	cfg.AutoCompactionMode = o.Mode
	cfg.AutoCompactionRetention = o.Retention
	cfg.QuotaBackendBytes = o.QuotaBytes
}

// Flags are o as etcd's command-line flags, for an etcd in a container.
func (o Options) Flags() []string {
	return []string{
		"--auto-compaction-mode=" + o.Mode,
		"--auto-compaction-retention=" + o.Retention,
		"--quota-backend-bytes=" + strconv.FormatInt(o.QuotaBytes, 10),
	}
}
