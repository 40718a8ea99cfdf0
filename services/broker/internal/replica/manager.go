package replica

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/metrics"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Config configures a Manager.
type Config struct {
	Node    string
	Storage *storage.DB
	Logger  zerolog.Logger
	// ConfirmTimeout bounds how long Publish waits for W copies.
	ConfirmTimeout time.Duration
	// PublishApplyWait bounds how long Publish holds a publish to a copy
	// sealed for a recovery, waiting for it to take the recovery's
	// assignment in (0: DefaultPublishApplyWait; publish.go).
	PublishApplyWait time.Duration
	// MaxInflightBytes bounds record bytes sent to one follower on one
	// stream and not yet acknowledged (each stream's follow has its own
	// flow control on the shared Follow call).
	MaxInflightBytes int
	// MaxConcurrentSeals bounds seals served at once (0: 512). A seal
	// mostly waits, for its metadata's group commit and for the copy's
	// role to end, so many share each commit: at 64, the seals of a mass
	// failover queued for slots and were most of a recovery round.
	MaxConcurrentSeals int
	// RetentionInterval is how often retention runs on every copy.
	RetentionInterval time.Duration
	// History reads a stream's history starts from etcd at or past
	// revision atLeast (that of the assignment applied, SetAssignmentAt),
	// linearizably when atLeast is 0.
	History func(ctx context.Context, stream string, atLeast int64) (cluster.HistoryStarts, error)
	// Dial returns a replication client for a peer address.
	Dial func(addr string) strandv1connect.ReplicationServiceClient
	// Metrics records where publishes and follow batches wait; nil
	// records nothing.
	Metrics *metrics.Broker
	// OrphanGrace is how long a copy its stream's assignment leaves out
	// is kept before it is deleted (orphan.go; 0: DefaultOrphanGrace).
	OrphanGrace time.Duration
	// ReadStream reads a stream's assignment and pending recovery from
	// etcd: for the orphan check, and to confirm that a stream with no
	// assignment here does not exist before answering NotFound (unknown).
	// nil deletes no orphan and answers NotFound from the view alone.
	ReadStream func(ctx context.Context, stream string) (StreamKeys, error)
}

// Manager holds every copy on this broker and what the broker knows of the
// cluster (assignments, broker addresses) to answer Locate and follow owners.
type Manager struct {
	cfg Config
	log zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	stopping atomic.Bool
	seals    chan struct{}
	// statusGen moves after every change of a copy's status that storage's
	// StatusGeneration does not count: a copy opened or dropped, a role,
	// suspect or chain mismatch (heartbeatNow), a follower's or owner's
	// confirm watermark (StatusGeneration).
	statusGen atomic.Uint64
	// urgent asks coordination for a heartbeat now: a copy changed in
	// what the controller acts on (a role, an epoch, a seal; a follower
	// that lost its owner reports the suspect at once, so the controller
	// can fail over eagerly instead of a heartbeat interval later).
	urgent chan struct{}
	// takenInMu guards takenIn: streams whose copies took in an
	// assignment since coordination last asked (TakeTakenIn).
	takenInMu sync.Mutex
	takenIn   map[string]struct{}
	// signalled (under takenInMu): streams whose copies signalled a
	// change since coordination last asked (TakeSignalled).
	signalled map[string]struct{}

	// followMu guards sessions: this broker's Follow calls, one per owner
	// broker it follows streams on (followSession).
	followMu sync.Mutex
	sessions map[string]*followSession

	mu          sync.RWMutex
	copies      map[string]*Copy
	assignments map[string]cluster.Assignment
	brokers     map[string]cluster.BrokerInfo
	// assignmentsCurrent is set while assignments mirror etcd: from a
	// full listing (SyncAssignments) until the watch that follows it ends
	// (AssignmentsStale). Only then does a stream missing from them not
	// exist; before (a broker just started, or reconnecting to etcd) it may
	// exist all the same, and a client must be told to retry, not that it
	// does not exist (unknown).
	assignmentsCurrent bool
	orphans            orphans
	// publishesAwaitingRecovery counts the publishes held for their sealed
	// copy's recovery to commit (Config.PublishApplyWait).
	publishesAwaitingRecovery atomic.Int64
}

// NewManager opens every stream storage already holds, so a restarted broker
// reports its copies' tails before any assignment arrives.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 5 * time.Second
	}
	if cfg.PublishApplyWait <= 0 {
		cfg.PublishApplyWait = DefaultPublishApplyWait
	}
	if cfg.MaxInflightBytes <= 0 {
		cfg.MaxInflightBytes = 8 << 20
	}
	if cfg.MaxConcurrentSeals <= 0 {
		cfg.MaxConcurrentSeals = 512
	}
	if cfg.RetentionInterval <= 0 {
		cfg.RetentionInterval = 2 * time.Second
	}
	if cfg.OrphanGrace <= 0 {
		cfg.OrphanGrace = DefaultOrphanGrace
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		cfg:         cfg,
		log:         cfg.Logger,
		ctx:         ctx,
		cancel:      cancel,
		seals:       make(chan struct{}, cfg.MaxConcurrentSeals),
		urgent:      make(chan struct{}, 1),
		takenIn:     make(map[string]struct{}),
		signalled:   make(map[string]struct{}),
		copies:      make(map[string]*Copy),
		sessions:    make(map[string]*followSession),
		assignments: make(map[string]cluster.Assignment),
		brokers:     make(map[string]cluster.BrokerInfo),
		orphans:     orphans{since: make(map[string]time.Time)},
	}
	names, err := cfg.Storage.Streams()
	if err != nil {
		cancel()
		return nil, err
	}
	for _, name := range names {
		c, err := m.openCopy(name)
		if err != nil {
			cancel()
			return nil, err
		}
		// Before any assignment reaches the copy (withholdOwner). The store
		// keeps it in the copy's metadata, so a restart on the same boot
		// after a machine crash still knows (storage.State.UnsureEpoch).
		if ep := c.st.State().UnsureEpoch; ep != 0 {
			c.mu.Lock()
			c.unsureEpoch = ep
			c.mu.Unlock()
		}
	}
	m.wg.Add(1)
	go m.retentionLoop()
	if cfg.ReadStream != nil {
		m.wg.Add(1)
		go m.orphanLoop()
	}
	cfg.Metrics.Orphans(func() int64 { return m.orphans.waiting.Load() }, func() int64 { return m.orphans.held.Load() })
	cfg.Metrics.PublishesAwaitingRecovery(m.publishesAwaitingRecovery.Load)
	return m, nil
}

// Node is this broker's node id.
func (m *Manager) Node() string { return m.cfg.Node }

// StopPublishes makes every copy refuse new publishes: the first step of a
// clean shutdown, before the lease is revoked (eager failover).
func (m *Manager) StopPublishes() { m.stopping.Store(true) }

// Close stops every copy's workers.
func (m *Manager) Close() {
	m.stopping.Store(true)
	m.cancel()
	m.mu.RLock()
	copies := slices.Collect(maps.Values(m.copies))
	m.mu.RUnlock()
	for _, c := range copies {
		c.stop()
	}
	m.wg.Wait()
}

func (m *Manager) openCopy(name string) (*Copy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.copies[name]; ok {
		return c, nil
	}
	st, err := m.cfg.Storage.Open(name)
	if err != nil {
		return nil, err
	}
	c := newCopy(m, name, st)
	m.copies[name] = c
	m.statusChanged()
	return c, nil
}

func (m *Manager) copy(name string) *Copy {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.copies[name]
}

// SetBroker records a live broker's address.
func (m *Manager) SetBroker(info cluster.BrokerInfo) {
	m.mu.Lock()
	m.brokers[info.Node] = info
	m.mu.Unlock()
}

// SyncBrokers replaces the known brokers with a full listing: brokers
// whose lease ended while no watch was running are forgotten too.
func (m *Manager) SyncBrokers(all []cluster.BrokerInfo) {
	brokers := make(map[string]cluster.BrokerInfo, len(all))
	for _, info := range all {
		brokers[info.Node] = info
	}
	m.mu.Lock()
	m.brokers = brokers
	m.mu.Unlock()
}

// DeleteBroker forgets a broker whose lease is gone.
func (m *Manager) DeleteBroker(node string) {
	m.mu.Lock()
	delete(m.brokers, node)
	m.mu.Unlock()
}

// BrokerAddr returns a live broker's address, or "".
func (m *Manager) BrokerAddr(node string) string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.brokers[node].Address
}

// SetAssignment records an assignment and, when it names this broker or this
// broker holds a copy, hands it to the copy to apply.
func (m *Manager) SetAssignment(a cluster.Assignment) { m.SetAssignmentAt(a, 0) }

// SetAssignmentAt is SetAssignment of an assignment read at etcd revision
// rev (its mod revision, or a listing's): the copy reads its history
// starts at or past rev (Config.History).
func (m *Manager) SetAssignmentAt(a cluster.Assignment, rev int64) {
	m.mu.Lock()
	m.assignments[a.Stream] = a
	c := m.copies[a.Stream]
	m.mu.Unlock()
	if c == nil && a.Includes(m.cfg.Node) {
		var err error
		if c, err = m.openCopy(a.Stream); err != nil {
			m.log.Error().Err(err).Str(logging.Stream, a.Stream).Msg("open copy failed; assignment not applied")
			return
		}
	}
	if c != nil {
		c.setDesired(&a, rev)
	}
}

// DeleteAssignment handles a deleted stream: its copy's data is dropped.
func (m *Manager) DeleteAssignment(stream string) {
	m.mu.Lock()
	delete(m.assignments, stream)
	c := m.copies[stream]
	m.mu.Unlock()
	if c != nil {
		c.setDesired(nil, 0)
	}
}

// SyncAssignments replaces what the broker knows with a full listing (after
// a watch restart). Copies whose stream no longer has an assignment are
// dropped: the stream was deleted while this broker was away. Streams whose
// assignment could not be decoded (unreadable) are left exactly as they
// are: an unreadable value withholds action, it never deletes a copy.
func (m *Manager) SyncAssignments(all map[string]cluster.Assignment, unreadable []string) {
	m.SyncAssignmentsAt(all, unreadable, 0)
}

// SyncAssignmentsAt is SyncAssignments of a listing read at etcd revision
// rev (SetAssignmentAt).
func (m *Manager) SyncAssignmentsAt(all map[string]cluster.Assignment, unreadable []string, rev int64) {
	m.mu.Lock()
	kept := make(map[string]cluster.Assignment, len(all)+len(unreadable))
	for _, name := range unreadable {
		if a, ok := m.assignments[name]; ok {
			kept[name] = a
		}
	}
	maps.Copy(kept, all)
	m.assignments = kept
	m.assignmentsCurrent = true
	var gone []*Copy
	for name, c := range m.copies {
		if _, ok := all[name]; !ok && !slices.Contains(unreadable, name) {
			gone = append(gone, c)
		}
	}
	m.mu.Unlock()
	for _, c := range gone {
		c.setDesired(nil, 0)
	}
	for _, a := range all {
		m.SetAssignmentAt(a, rev)
	}
}

// AssignmentsStale says the assignments watch ended: until the next full
// listing (SyncAssignments) a stream the broker has no assignment for is not
// known not to exist (unknown).
func (m *Manager) AssignmentsStale() {
	m.mu.Lock()
	m.assignmentsCurrent = false
	// What is assigned while the view is stale is not known: an orphan's
	// grace starts again once it mirrors etcd.
	clear(m.orphans.since)
	m.mu.Unlock()
}

// dropCopy drops c's data, forgets c, and then applies the stream's latest
// assignment if there is one: the stream was deleted (or c holds another
// incarnation of it) and may have been created again meanwhile. An
// assignment that arrived while c was on its way out reached c, whose loop
// is ending, and would otherwise be lost with it until the next change to
// the stream; m.assignments always holds the latest. The data goes first,
// while c is still the stream's copy, so no new copy opens the stream's
// storage before its drop is done. c's role has ended.
//
// A drop that fails (the store refuses writes after a failed fsync, or is
// closing) leaves the data on disk and applies nothing: the assignment
// would open the same stale data and drop it again, in a loop. The stream
// is applied again with its next change, a full resync (SyncAssignments),
// or the broker's restart, which finds the stale copy on disk and drops it
// again (replaceWithEmpty).
func (m *Manager) dropCopy(c *Copy) error {
	err := m.cfg.Storage.Drop(c.name)
	m.mu.Lock()
	if m.copies[c.name] == c {
		delete(m.copies, c.name)
		m.statusChanged()
	}
	a, ok := m.assignments[c.name]
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if ok && m.ctx.Err() == nil {
		m.SetAssignment(a)
	}
	return nil
}

// hintLocked says who owns a stream, as its assignment a names it. m.mu
// must be held.
func (m *Manager) hintLocked(a cluster.Assignment) *strandv1.OwnerHint {
	return &strandv1.OwnerHint{Stream: a.Stream, Node: a.Owner, Address: m.brokers[a.Owner].Address, Epoch: a.Epoch}
}

// Locate answers who owns a stream.
func (m *Manager) Locate(ctx context.Context, stream string) (*strandv1.LocateResponse, error) {
	m.mu.RLock()
	a, ok := m.assignments[stream]
	current := m.assignmentsCurrent
	var resp *strandv1.LocateResponse
	if ok {
		resp = &strandv1.LocateResponse{
			Owner:     m.hintLocked(a),
			Followers: slices.Clone(a.Followers),
			Policy:    &strandv1.ConfirmPolicy{Name: a.Policy.Name, Nodes: uint32(a.Policy.Nodes)},
		}
	}
	m.mu.RUnlock()
	if !ok {
		return nil, m.unknown(ctx, stream, current)
	}
	return resp, nil
}

// notHere is the error for a call about a stream this broker does not
// serve: the owner's hint when the stream is assigned, else unknown's
// answer, its etcd read bounded by ctx (the caller's call).
func (m *Manager) notHere(ctx context.Context, stream string) error {
	m.mu.RLock()
	a, ok := m.assignments[stream]
	current := m.assignmentsCurrent
	var err error
	if ok {
		err = &NotOwnerError{Hint: m.hintLocked(a)}
	}
	m.mu.RUnlock()
	if !ok {
		return m.unknown(ctx, stream, current)
	}
	return err
}

// unknownReadTimeout bounds the etcd read that confirms a stream unknown
// here does not exist.
const unknownReadTimeout = 2 * time.Second

// unknown is the error for a stream with no assignment here; current is
// whether the assignments mirrored etcd when the stream was looked up.
// NotFound (ErrUnknownStream) is a promise that the stream does not
// exist, and a watch that mirrors etcd can still lag it: a stream created
// a moment ago may not have reached this broker yet. So absence here is
// confirmed by a linearizable read of the stream's assignment, and a
// stream that exists, or a read that fails, is ErrUnavailable: a retry,
// here once the watch brings it or at another broker, finds it
// (docs/errors.md). The read is bounded by ctx, the call it answers (a
// caller that gave up has no use for it), by unknownReadTimeout, and by
// the manager's life. m.mu must not be held.
func (m *Manager) unknown(ctx context.Context, stream string, current bool) error {
	if !current {
		return fmt.Errorf("%w: stream %q: this broker's view of the assignments is not current (starting, or reconnecting to etcd)", ErrUnavailable, stream)
	}
	if m.cfg.ReadStream == nil {
		return fmt.Errorf("%w: no stream %q", ErrUnknownStream, stream)
	}
	ctx, cancel := context.WithTimeout(ctx, unknownReadTimeout)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()
	keys, err := m.cfg.ReadStream(ctx, stream)
	switch {
	case err != nil:
		return fmt.Errorf("%w: stream %q is not known here and etcd cannot be read to confirm it does not exist: %v", ErrUnavailable, stream, err)
	case keys.Assignment != nil:
		return fmt.Errorf("%w: stream %q exists (epoch %d) but this broker's watch has not brought its assignment yet", ErrUnavailable, stream, keys.Assignment.Epoch)
	}
	return fmt.Errorf("%w: no stream %q", ErrUnknownStream, stream)
}

// Urgent delivers a value when a heartbeat should go out now: a copy's
// status changed in what the controller acts on, or a copy took in an
// assignment (TakeTakenIn).
func (m *Manager) Urgent() <-chan struct{} { return m.urgent }

// TakeTakenIn returns the streams whose copies took in an assignment
// (applied it, or found themselves left out of it) since the last call,
// and forgets them. Their heartbeat shards are written even when their
// statuses read the same as before (a follower added on the fast path
// leaves the owner's unchanged): the write is how the controller learns
// that this broker, running, has seen the assignment
// (state.Snapshot.HeardSince).
func (m *Manager) TakeTakenIn() []string {
	m.takenInMu.Lock()
	defer m.takenInMu.Unlock()
	out := slices.Collect(maps.Keys(m.takenIn))
	clear(m.takenIn)
	return out
}

// TakeSignalled returns the streams whose copies signalled a change the
// controller acts on (heartbeatNow) since the last call, and forgets
// them: a prompt heartbeat reads only their shards.
func (m *Manager) TakeSignalled() []string {
	m.takenInMu.Lock()
	defer m.takenInMu.Unlock()
	out := slices.Collect(maps.Keys(m.signalled))
	clear(m.signalled)
	return out
}

// heartbeatNow asks for a heartbeat now for stream's copy; takenIn says
// the copy took in an assignment.
func (m *Manager) heartbeatNow(stream string, takenIn bool) {
	m.statusChanged()
	m.takenInMu.Lock()
	m.signalled[stream] = struct{}{}
	if takenIn {
		m.takenIn[stream] = struct{}{}
	}
	m.takenInMu.Unlock()
	select {
	case m.urgent <- struct{}{}:
	default:
	}
}

// statusChanged says a copy's status may read differently: called after
// the change is made (under the lock the status is read under, or after
// it is released), never before, so a StatusGeneration read before a
// status read that missed the change differs from one read after it.
func (m *Manager) statusChanged() { m.statusGen.Add(1) }

// StatusGeneration moves after every change of what AllTails yields: a
// copy's status (storage's Status, role, suspect, chain mismatch, confirm
// watermark) or the set of copies. Read before AllTails and again later
// unchanged, nothing AllTails yielded has changed since: the heartbeat's
// tails pass on an idle broker reads nothing (docs/etcd-schema.md,
// "Heartbeat shards").
func (m *Manager) StatusGeneration() uint64 {
	return m.statusGen.Load() + m.cfg.Storage.StatusGeneration()
}

// Tails reports every copy's status, by stream.
func (m *Manager) Tails() map[string]cluster.CopyTails {
	return maps.Collect(m.AllTails(nil))
}

// AllTails yields the status of every copy whose stream want accepts (nil:
// every copy) for the heartbeat, which files each in its shard as it
// comes: no map of every copy is built per interval, and a prompt pass
// reads only the shards it needs.
func (m *Manager) AllTails(want func(stream string) bool) iter.Seq2[string, cluster.CopyTails] {
	return func(yield func(string, cluster.CopyTails) bool) {
		m.mu.RLock()
		copies := slices.Collect(maps.Values(m.copies))
		m.mu.RUnlock()
		for _, c := range copies {
			if want != nil && !want(c.name) {
				continue
			}
			if t, ok := c.tails(); ok && !yield(c.name, t) {
				return
			}
		}
	}
}

func (m *Manager) retentionLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		m.mu.RLock()
		copies := slices.Collect(maps.Values(m.copies))
		m.mu.RUnlock()
		for _, c := range copies {
			c.applyRetention(m.ctx, time.Now())
		}
	}
}

// errorsIsAny reports whether err matches any target.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
