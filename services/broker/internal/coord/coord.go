// Package coord is the broker's side of coordination through etcd: it
// registers the broker on a lease, publishes its copies' statuses in
// heartbeat shards when they change (heartbeat.go), and watches
// assignments and brokers, handing what it sees to the replica manager.
package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/gather"
	"github.com/strandhq/strand/internal/lease"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/replica"
)

// Config configures coordination.
type Config struct {
	Client    *clientv3.Client
	Schema    cluster.Schema
	Node      string
	Zone      string
	Address   string
	Heartbeat time.Duration
	LeaseTTL  time.Duration
	Logger    zerolog.Logger
	Manager   *replica.Manager
}

// Coord runs registration, heartbeats and watches.
type Coord struct {
	cfg   Config
	log   zerolog.Logger
	start time.Time

	// mu orders a new lease against Revoke: a lease granted after Revoke
	// has read the current one is revoked by its granter (runSession), so
	// a broker that is closing never leaves a registration behind to wait
	// out its TTL. held is the lease the broker is registered under, nil
	// for none; it outlives a session that ended on an error while etcd
	// still held it, so that the next session registers under it again.
	mu      sync.Mutex
	held    *lease.Held
	closing bool
	ready   chan struct{}
	errc    chan error

	// leases counts the lease's sessions that lapsed, and those resumed
	// because etcd still held the lease (package lease).
	leases lease.Counters

	hb      *heartbeats
	history *gather.Gatherer[historyRead, cluster.HistoryStarts]
	// historyWatch answers History at a revision from the watch of the
	// history directory (historywatch.go).
	historyWatch *historyWatch
}

// New returns a Coord; Run starts it.
func New(cfg Config) *Coord {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 3 * time.Second
	}
	c := &Coord{cfg: cfg, log: cfg.Logger, start: time.Now(), ready: make(chan struct{}), errc: make(chan error, 1)}
	c.hb = newHeartbeats(cfg.Client, cfg.Schema, cfg.Node, cfg.Logger, cfg.Manager.AllTails, cfg.Manager.StatusGeneration)
	c.history = newHistoryReader(cfg.Client, cfg.Schema)
	c.historyWatch = newHistoryWatch()
	return c
}

// HeartbeatTicks counts the heartbeat intervals this broker has gone
// through while registered, whether or not it wrote anything in them.
func (c *Coord) HeartbeatTicks() int64 { return c.hb.ticks.Load() }

// HeartbeatTxns counts the heartbeat transactions this broker wrote: each
// one etcd revision.
func (c *Coord) HeartbeatTxns() int64 { return c.hb.txns.Load() }

// HeartbeatTailsSkipped counts the tails passes that read no copy's status
// because none changed since everything was published.
func (c *Coord) HeartbeatTailsSkipped() int64 { return c.hb.skips.Load() }

// HeartbeatOmitted is how many copies the broker's heartbeat shards leave
// out for want of room (cluster.BoundHeartbeat).
func (c *Coord) HeartbeatOmitted() int64 { return c.hb.omittedTotal.Load() }

// Ready is closed once the broker is registered and has applied the initial
// assignment listing.
func (c *Coord) Ready() <-chan struct{} { return c.ready }

// History reads a stream's history starts, at or past etcd revision
// atLeast: an assignment's mod revision, written in one transaction with
// its epoch's history start, so the answer holds that start; 0 reads
// linearizably, after the call began. A missing key is an empty list; an
// unreadable one is an error, so the caller withholds the assignment
// (docs/protocol.md, "Copies with a longer tail"). A read at a revision is
// answered from the watch of the history directory once it has reached
// that revision (historyWatch); otherwise, and for a linearizable read,
// etcd is read, and reads asked for together share a transaction
// (newHistoryReader).
func (c *Coord) History(ctx context.Context, stream string, atLeast int64) (cluster.HistoryStarts, error) {
	if atLeast > 0 {
		progress := func() { c.historyWatch.askProgress(c.cfg.Client) }
		h, ok, err := c.historyWatch.at(ctx, stream, atLeast, historyWatchWait, progress)
		if ok || err != nil {
			return h, err
		}
	}
	return c.history.Do(ctx, historyRead{stream: stream, atLeast: atLeast})
}

// ReadStream reads a stream's assignment and pending recovery in one
// read-only transaction, so both are of one revision: the orphan check
// decides on what etcd holds, not on the watch's view alone
// (replica.Copy.dropIfOrphan). A value that cannot be decoded is an error,
// which keeps the copy.
func (c *Coord) ReadStream(ctx context.Context, stream string) (replica.StreamKeys, error) {
	resp, err := c.cfg.Client.Txn(ctx).Then(
		clientv3.OpGet(c.cfg.Schema.AssignmentKey(stream)),
		clientv3.OpGet(c.cfg.Schema.RecoveryKey(stream)),
	).Commit()
	if err != nil {
		return replica.StreamKeys{}, err
	}
	var out replica.StreamKeys
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		a, err := cluster.Decode[cluster.Assignment](kvs[0].Value)
		if err != nil {
			return replica.StreamKeys{}, err
		}
		out.Assignment = &a
	}
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		r, err := cluster.Decode[cluster.Recovery](kvs[0].Value)
		if err != nil {
			return replica.StreamKeys{}, err
		}
		out.Recovery = &r
	}
	return out, nil
}

// Run registers and serves until ctx ends. A lost lease (partition,
// expiry) is replaced by a new one: the broker's copies are fenced by
// seals, not by this process's belief about its lease.
//
// A lease is lost only when etcd no longer holds it. A session whose
// keep-alive answers came late while etcd held the lease goes on under it
// (package lease): giving it up would remove the broker's registration and
// fail over every stream it owns although the broker never stopped
// (docs/architecture.md, "Coordination only through etcd").
func (c *Coord) Run(ctx context.Context) error {
	readyOnce := false
	var held *lease.Held
	for {
		var err error
		held, err = c.runSession(ctx, &readyOnce, held)
		if ctx.Err() != nil || c.isClosing() {
			// A lease kept for the next session when Run ends between
			// sessions is revoked too: eager failover, as at a session's
			// end.
			c.revokeHeld()
			return nil
		}
		c.log.Warn().Err(err).Bool("same_lease", held != nil && held.Err() == nil).Msg("etcd session lost; registering again")
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			c.revokeHeld()
			return nil
		case <-t.C:
		}
	}
}

// SessionsLapsed counts the broker's etcd sessions that lapsed while it
// ran: no keep-alive answer within the lease TTL (etcd unreachable, or its
// answers late).
func (c *Coord) SessionsLapsed() int64 { return c.leases.Lapsed.Load() }

// LeasesResumed counts lapsed sessions whose lease etcd still held: kept
// alive again, the registration untouched.
func (c *Coord) LeasesResumed() int64 { return c.leases.Resumed.Load() }

// errClosing ends a session that starts while the broker closes.
var errClosing = errors.New("coord: closing")

// leaseFor returns held while it is kept alive, else a new lease.
func (c *Coord) leaseFor(ctx context.Context, held *lease.Held) (*lease.Held, error) {
	if held != nil {
		select {
		case <-held.Done():
			// Lost: its keys are gone with it, and the controller has
			// seen the broker go. A new lease registers it again.
			c.revoke(held)
		default:
			return held, nil
		}
	}
	return lease.Grant(ctx, c.cfg.Client, c.cfg.LeaseTTL, &c.leases)
}

// runSession registers under a lease (held if it is still kept alive, else
// a new one) and serves until the lease is lost, an etcd write fails, or
// ctx ends. It returns the lease for the next session: nil when it was
// lost, or revoked because the broker is stopping.
func (c *Coord) runSession(ctx context.Context, readyOnce *bool, held *lease.Held) (*lease.Held, error) {
	if c.isClosing() {
		// No lease to grant only to revoke it.
		return nil, errClosing
	}
	held, err := c.leaseFor(ctx, held)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	closing := c.closing
	if !closing {
		c.held = held
	}
	c.mu.Unlock()
	if closing {
		// Revoke ran while this lease was being granted: it is not to
		// register.
		c.revoke(held)
		return nil, errClosing
	}
	// The lease is revoked when the broker stops, so the controller sees
	// this broker gone at once (eager failover) instead of after the TTL;
	// a lost lease is revoked too (etcd has let it go; the revoke only
	// tidies). Otherwise it stays, for the next session to register under.
	defer func() {
		if ctx.Err() != nil || c.isClosing() || held.Err() != nil {
			c.revoke(held)
		}
	}()
	id := held.ID()
	info := cluster.BrokerInfo{Node: c.cfg.Node, Address: c.cfg.Address, StartTime: c.start, Zone: c.cfg.Zone}
	if _, err := c.cfg.Client.Put(ctx, c.cfg.Schema.BrokerKey(c.cfg.Node), cluster.Encode(info), clientv3.WithLease(id)); err != nil {
		return held, fmt.Errorf("coord: register: %w", err)
	}
	// Every shard again under a new lease, since the old lease's keys went
	// with it (heartbeats.publish starts afresh on a lease it has not
	// written under); under the same lease (kept after a failed write),
	// what the last session did not write.
	c.hb.tookIn(c.cfg.Manager.TakeTakenIn())
	c.hb.signal(c.cfg.Manager.TakeSignalled())
	if _, err := c.hb.publish(ctx, id, publishTails); err != nil {
		return held, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchErr := make(chan error, 3)
	synced := make(chan struct{}, 2)
	go func() { watchErr <- c.keepWatching(wctx, "brokers", synced, c.watchBrokers) }()
	go func() { watchErr <- c.keepWatching(wctx, "assignments", synced, c.watchAssignments) }()
	// Not awaited: until it has listed, History reads etcd.
	go func() { watchErr <- c.keepWatching(wctx, "history", nil, c.watchHistory) }()
	for range 2 {
		select {
		case <-synced:
		case err := <-watchErr:
			return held, err
		case <-held.Done():
			return nil, fmt.Errorf("coord: %w", held.Err())
		case <-ctx.Done():
			return held, ctx.Err()
		}
	}
	if !*readyOnce {
		*readyOnce = true
		close(c.ready)
	}
	c.log.Info().Str(logging.Node, c.cfg.Node).Str(logging.Addr, c.cfg.Address).Int64("lease", int64(id)).Msg("broker registered")
	// Tails alone are written at most once per heartbeat interval (t);
	// a change the controller acts on goes out promptDelay after it is
	// signalled (prompt), gathered with the others of its burst.
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	prompt := time.NewTimer(promptDelay)
	prompt.Stop()
	urgent := c.cfg.Manager.Urgent()
	publish := func(mode publishMode) {
		c.hb.tookIn(c.cfg.Manager.TakeTakenIn())
		c.hb.signal(c.cfg.Manager.TakeSignalled())
		pctx, cancel := context.WithTimeout(ctx, c.cfg.Heartbeat+time.Second)
		defer cancel()
		if _, err := c.hb.publish(pctx, id, mode); err != nil && ctx.Err() == nil {
			c.log.Warn().Err(err).Msg("heartbeat failed; what it did not write goes out with the next one")
		}
	}
	for {
		select {
		case <-ctx.Done():
			return held, ctx.Err()
		case <-held.Done():
			return nil, fmt.Errorf("coord: %w", held.Err())
		case err := <-watchErr:
			return held, err
		case <-urgent:
			// Until the gathered pass has run, further signals wait in
			// the channel (its buffer of one) for the pass after it.
			urgent = nil
			prompt.Reset(promptDelay)
		case <-prompt.C:
			urgent = c.cfg.Manager.Urgent()
			publish(publishPrompt)
		case <-t.C:
			publish(publishTails)
			c.hb.ticks.Add(1)
		}
	}
}

// Revoke ends the lease at once and stops registering again: clean
// shutdown is eager failover, the controller sees the broker gone without
// waiting for the TTL. The revoke is bounded by a timeout of its own
// (package lease).
func (c *Coord) Revoke() error {
	c.mu.Lock()
	c.closing = true
	held := c.held
	c.mu.Unlock()
	if held == nil {
		return nil
	}
	// A lease that expired meanwhile is not an error: its registration is
	// already gone.
	return held.Revoke()
}

func (c *Coord) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// revokeHeld revokes the lease the broker is registered under, if any:
// Run ending between two sessions.
func (c *Coord) revokeHeld() {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if held != nil {
		c.revoke(held)
	}
}

// revoke revokes held and forgets it, so a Revoke after it does not
// revoke a lease that is over.
func (c *Coord) revoke(held *lease.Held) {
	c.mu.Lock()
	if c.held == held {
		c.held = nil
	}
	c.mu.Unlock()
	_ = held.Revoke()
}

// keepWatching runs watch (a listing, then a watch from it) until ctx
// ends, signalling synced after its first listing (nil: nobody waits). A
// watch that fails (its revision compacted while the connection was down,
// or etcd without a leader for a moment) lists and watches again in the
// same session: a broken watch says nothing about this broker's lease,
// and closing the session would revoke it, failing over every stream the
// broker owns (docs/protocol.md, "Stream failover": a lease that expires
// or is revoked).
func (c *Coord) keepWatching(ctx context.Context, what string, synced chan<- struct{}, watch func(context.Context, func()) error) error {
	first := true
	onSynced := func() {
		if first && synced != nil {
			first = false
			synced <- struct{}{}
		}
	}
	backoff := 50 * time.Millisecond
	for {
		err := watch(ctx, onSynced)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.log.Warn().Err(err).Str("watch", what).Msg("etcd watch failed; listing and watching again")
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Coord) watchBrokers(ctx context.Context, synced func()) error {
	dir := c.cfg.Schema.BrokersDir()
	resp, err := c.cfg.Client.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	all := make([]cluster.BrokerInfo, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if info, err := cluster.Decode[cluster.BrokerInfo](kv.Value); err == nil {
			all = append(all, info)
		}
	}
	c.cfg.Manager.SyncBrokers(all)
	synced()
	wch := c.cfg.Client.Watch(clientv3.WithRequireLeader(ctx), dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("coord: watch brokers: %w", err)
		}
		for _, ev := range wr.Events {
			node, err := cluster.NameIn(dir, string(ev.Kv.Key))
			if err != nil {
				continue
			}
			if ev.Type == clientv3.EventTypeDelete {
				c.cfg.Manager.DeleteBroker(node)
				continue
			}
			if info, err := cluster.Decode[cluster.BrokerInfo](ev.Kv.Value); err == nil {
				c.cfg.Manager.SetBroker(info)
			}
		}
	}
	return ctx.Err()
}

func (c *Coord) watchAssignments(ctx context.Context, synced func()) error {
	// Once the watch ends the manager's assignments may fall behind etcd,
	// so a stream missing from them is no longer known not to exist.
	defer c.cfg.Manager.AssignmentsStale()
	dir := c.cfg.Schema.AssignmentsDir()
	resp, err := c.cfg.Client.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	all := make(map[string]cluster.Assignment, len(resp.Kvs))
	var unreadable []string
	for _, kv := range resp.Kvs {
		a, err := cluster.Decode[cluster.Assignment](kv.Value)
		if err != nil {
			// Withheld, never taken for a deletion: the copy stays as it is.
			c.log.Error().Err(err).Str("key", string(kv.Key)).Msg("unreadable assignment withheld; copy left as it is")
			if name, nerr := cluster.NameIn(dir, string(kv.Key)); nerr == nil {
				unreadable = append(unreadable, name)
			}
			continue
		}
		all[a.Stream] = a
	}
	c.cfg.Manager.SyncAssignmentsAt(all, unreadable, resp.Header.Revision)
	synced()
	wch := c.cfg.Client.Watch(clientv3.WithRequireLeader(ctx), dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("coord: watch assignments: %w", err)
		}
		for _, ev := range wr.Events {
			stream, err := cluster.NameIn(dir, string(ev.Kv.Key))
			if err != nil {
				continue
			}
			if ev.Type == clientv3.EventTypeDelete {
				c.cfg.Manager.DeleteAssignment(stream)
				continue
			}
			a, err := cluster.Decode[cluster.Assignment](ev.Kv.Value)
			if err != nil {
				c.log.Error().Err(err).Str(logging.Stream, stream).Msg("unreadable assignment skipped")
				continue
			}
			c.cfg.Manager.SetAssignmentAt(a, ev.Kv.ModRevision)
		}
	}
	return ctx.Err()
}

// watchHistory lists the history directory and watches it from the
// listing, keeping historyWatch; the values are stale from the moment the
// watch ends until the next listing, and nothing is answered from them.
func (c *Coord) watchHistory(ctx context.Context, synced func()) error {
	defer c.historyWatch.stop()
	dir := c.cfg.Schema.HistoryDir()
	resp, err := c.cfg.Client.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	values := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if stream, err := cluster.NameIn(dir, string(kv.Key)); err == nil {
			values[stream] = kv.Value
		}
	}
	wctx := clientv3.WithRequireLeader(ctx)
	c.historyWatch.list(wctx, values, resp.Header.Revision)
	synced()
	wch := c.cfg.Client.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("coord: watch history: %w", err)
		}
		c.historyWatch.apply(dir, wr)
	}
	return ctx.Err()
}
