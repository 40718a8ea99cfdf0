// Package worker is Strand's recovery worker (docs/protocol.md, "Stream failover"): on
// the coordination leader it finishes every pending recovery by sealing the
// copies of the old assignment, picking the furthest one and committing the
// new assignment with one guarded etcd transaction.
//
// One recoverer leads at a time, through a concurrency.Election on the
// recoverer election prefix. Leadership scopes all work: losing it (the
// session's lease lost, or the leader key gone) cancels every seal and read
// in flight, and every commit also compares the leader key's create
// revision, so a deposed leader can never commit even if it has not noticed
// yet. The worker then campaigns again.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/lease"
	"github.com/strandhq/strand/internal/rpcserver"
)

// Defaults for Config's zero fields.
const (
	DefaultSealTimeout = 2 * time.Second
	DefaultQuorumGrace = 200 * time.Millisecond
	DefaultSessionTTL  = 3 * time.Second
	DefaultBackoffMin  = 100 * time.Millisecond
	DefaultBackoffMax  = 2 * time.Second
	// DefaultMaxInFlight: a round seals every copy of the old assignment
	// (three for a three-copy stream) and a broker serves 512 seals at once
	// (its replica.Config.MaxConcurrentSeals); the seals past those slots
	// wait for one within the round's seal timeout. A round spends most of
	// its time waiting (for its seals' group commits, its gathered read
	// and commit), not working, so every stream of a lost owner is best in
	// flight at once: at 128 the 3,334 streams of a killed broker of
	// 10,000 were assigned over 8-9 s, at 1,024 (in about three waves)
	// over 4.6-7.6 s, at 4,096 (one) over 4.2-4.8 s, in four alternated
	// pairs in which 4,096 was ahead each time (docs/limits.md). It bounds
	// what a mass failover asks of the recoverer at once: goroutines in a
	// round (a few KiB each), seals in SealMany calls (1,024 at most a
	// call, 4 calls at once per broker), reads and commits in etcd
	// (gathered, 31 streams a transaction).
	DefaultMaxInFlight = 4096
)

// Config configures a Worker.
type Config struct {
	// Client is the etcd client; the caller owns and closes it.
	Client *clientv3.Client
	Schema cluster.Schema
	// Name is the election value, so operators can see who leads.
	Name string
	// SealTimeout bounds one round of seals; copies that have not answered
	// by then are left out (docs/protocol.md, "Stream failover").
	SealTimeout time.Duration
	// QuorumGrace is how long a seal round still waits for stragglers once
	// the answers in hand already decide a promotion. Sealing more than R
	// copies only adds followers (docs/protocol.md, "Stream failover"), so this trades
	// a few followers for failover time; slower copies are added back later.
	QuorumGrace time.Duration
	// SessionTTL is the election session's lease TTL (whole seconds): how
	// long a crashed leader blocks its successor.
	SessionTTL time.Duration
	// BackoffMin and BackoffMax bound the jittered, doubling wait between
	// attempts of a recovery that cannot commit yet.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// MaxInFlight bounds the recoveries worked on at once: a stream's
	// attempt (read, seal round, commit) waits for a slot; a recovery
	// waiting between attempts holds none.
	MaxInFlight int
	// Dialer says how brokers are reached: h2c, or TLS with the
	// recoverer's node certificate.
	Dialer rpcserver.Dialer
	// HTTPClient reaches the brokers' ReplicationService (default:
	// Dialer's).
	HTTPClient connect.HTTPClient
	// PeerToken goes with every Seal (rpcserver.PeerTokenEnv): brokers
	// with a token refuse a Seal without it.
	PeerToken string
	Logger    zerolog.Logger
}

func (c *Config) fill() {
	if c.SealTimeout <= 0 {
		c.SealTimeout = DefaultSealTimeout
	}
	if c.QuorumGrace < 0 {
		c.QuorumGrace = 0
	} else if c.QuorumGrace == 0 {
		c.QuorumGrace = DefaultQuorumGrace
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = DefaultBackoffMin
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffMin)
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.HTTPClient == nil {
		c.HTTPClient = c.Dialer.HTTPClient()
	}
}

// Worker campaigns for recoverer leadership and, while it leads, finishes
// pending recoveries.
type Worker struct {
	cfg         Config
	campaigning chan struct{}
	once        sync.Once
	leading     atomic.Bool
	// leases counts the election leases' lapsed and resumed sessions.
	leases lease.Counters
}

// New returns a worker; Run starts it.
func New(cfg Config) (*Worker, error) {
	if cfg.Client == nil {
		return nil, errors.New("worker: no etcd client")
	}
	cfg.fill()
	return &Worker{cfg: cfg, campaigning: make(chan struct{})}, nil
}

// Campaigning is closed once the worker has joined the election for the
// first time.
func (w *Worker) Campaigning() <-chan struct{} { return w.campaigning }

// SessionsLapsed counts the election sessions that lapsed: no keep-alive
// answer within the lease TTL.
func (w *Worker) SessionsLapsed() int64 { return w.leases.Lapsed.Load() }

// LeasesResumed counts the lapsed election sessions whose lease etcd still
// held: kept alive again, a term it held went on.
func (w *Worker) LeasesResumed() int64 { return w.leases.Resumed.Load() }

// Leading reports whether the worker currently leads.
func (w *Worker) Leading() bool { return w.leading.Load() }

// Run campaigns, leads while elected and campaigns again after losing, until
// ctx ends. Failures to reach etcd are retried with backoff; Run returns nil
// once ctx ends, after its session's lease is revoked so a successor can
// take over at once.
func (w *Worker) Run(ctx context.Context) error {
	log := w.cfg.Logger
	bo := newBackoff(w.cfg.BackoffMin, w.cfg.BackoffMax)
	for ctx.Err() == nil {
		err := w.campaignAndLead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			bo.reset()
			continue
		}
		d := bo.next()
		log.Warn().Err(err).Dur(fieldRetryIn, d).Msg("recoverer leadership lost or not won; campaigning again")
		if !sleepCtx(ctx, d) {
			return nil
		}
	}
	return nil
}

// sleepCtx waits d and reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// campaignAndLead is one election session: campaign, then lead until
// leadership or ctx is lost. It returns nil when the session ended in the
// ordinary way (its lease lost, or ctx).
func (w *Worker) campaignAndLead(ctx context.Context) error {
	// The election lease outlives a session whose keep-alive answers came
	// late while etcd still held it (package lease): ending the term then
	// would stop every recovery in flight on a machine already short of
	// time. Every commit compares the election key's create revision
	// (Leader.guard), so a term that goes on under a lease since expired
	// commits nothing.
	held, err := lease.Grant(ctx, w.cfg.Client, w.cfg.SessionTTL, &w.leases)
	if err != nil {
		return fmt.Errorf("worker: election lease: %w", err)
	}
	// Revoking the lease deletes the leader key, so a successor takes over
	// without waiting for the TTL.
	defer func() { _ = held.Revoke() }()

	// Everything below ends when the lease does: a campaign or a term
	// outliving its lease would act for a leadership it no longer holds.
	sctx, cancel := held.Context(ctx)
	defer cancel()

	election := concurrency.NewElection(held.Session(), w.cfg.Schema.RecovererElection())
	w.once.Do(func() { close(w.campaigning) })
	if err := election.Campaign(sctx, w.cfg.Name); err != nil {
		if sctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("worker: campaign: %w", err)
	}
	leader := Leader{Key: election.Key(), Rev: election.Rev()}
	log := w.cfg.Logger.With().Str(fieldLeaderKey, leader.Key).Logger()
	log.Info().Msg("recoverer leading")
	w.leading.Store(true)
	defer w.leading.Store(false)

	err = w.lead(sctx, leader)
	cancel()
	log.Info().Msg("recoverer no longer leading; recovery work stopped")
	return err
}

// Leader identifies one term of leadership: the election's leader key and
// its create revision. A commit that compares both cannot succeed once the
// key was deleted, even if it was re-created by a later campaign.
type Leader struct {
	Key string
	Rev int64
}

// guard is the leader compare every commit carries.
func (l Leader) guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.Key), "=", l.Rev)
}

// backoff is a doubling, jittered delay.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(minD, maxD time.Duration) *backoff {
	return &backoff{min: minD, max: maxD}
}

func (b *backoff) reset() { b.cur = 0 }

// next returns the next delay: the current step with up to a quarter of
// jitter either way, so recoverers retrying together spread out.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	j := int64(b.cur / 4)
	if j <= 0 {
		return b.cur
	}
	return b.cur - time.Duration(j) + time.Duration(rand.Int64N(2*j+1))
}

// Log field keys of this package that internal/logging does not name.
const (
	fieldR              = "r"
	fieldSealed         = "sealed"
	fieldMissing        = "missing"
	fieldSealErrors     = "seal_errors"
	fieldRefused        = "refused"
	fieldVerdict        = "verdict"
	fieldPick           = "pick"
	fieldPickRecordTail = "pick_record_tail"
	fieldProposedOwner  = "proposed_owner"
	fieldLeaderKey      = "leader_key"
	fieldRetryIn        = "retry_in"
)
