package auth

import (
	"context"
	"crypto/subtle"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/gather"
)

// Cache holds every token and grant of the cluster, read once and kept up
// to date by an etcd watch of cluster.Schema.AuthDir, so a call is checked
// without a read of etcd and a revoke or grant takes effect as soon as the
// watch delivers it (well within a second on a healthy etcd).
//
// It fails closed: until the first read, and while the watch is broken and
// the cache reads etcd again, calls wait (Wait) rather than be judged by
// credentials that may have been revoked since.
type Cache struct {
	cli    *clientv3.Client
	schema cluster.Schema
	log    zerolog.Logger

	mu sync.RWMutex
	// tokens by id; grants by principal, then by key.
	tokens map[string]TokenRecord
	grants map[string]map[string]GrantRecord
	rev    int64
	// readRev is the revision of the last whole read (load, Sync): the
	// watch skips the events it already holds.
	readRev int64
	// loaded is closed while the cache is current; replaced by an open
	// channel while it reads etcd again.
	loaded chan struct{}
	fresh  bool
	// changed is closed and replaced at every applied revision (tests wait
	// on it through Until).
	changed chan struct{}

	// known memoises Authenticate: secret to principal, for secrets that
	// matched a token. Every call of a client carries its secret, and the
	// broker checks it twice per call (Guard.Precheck, then the
	// interceptor); the memo spares both the SHA-256. It is emptied under
	// mu whenever any token is put or deleted (applyLocked, load), so a
	// revoked token stops authenticating as soon as the watch delivers the
	// revoke, exactly as without it. Only hits are kept, at most
	// knownMax, so unknown secrets sent by anyone cannot grow it.
	knownMu sync.Mutex
	known   map[string]string

	// syncs gathers Sync's calls into shared reads, one at a time;
	// lastSync is when the last began (unix nanoseconds), syncEvery
	// before the next.
	syncs    *gather.Gatherer[struct{}, struct{}]
	lastSync atomic.Int64
}

// syncEvery spaces Sync's reads of etcd: calls with secrets nobody holds,
// however many, cost etcd at most one read of the credentials per
// syncEvery on each node, and a call with a token made a moment ago waits
// at most about that long for it. syncTimeout bounds one read.
const (
	syncEvery   = 25 * time.Millisecond
	syncTimeout = 2 * time.Second
	// syncBatch is how many waiting calls one read answers at most.
	syncBatch = 4096
)

// knownMax bounds Cache.known: far more live secrets than a broker's
// clients hold; reaching it empties the memo, which costs one hash each.
const knownMax = 1024

// NewCache returns a cache of schema's credentials; Run fills it.
func NewCache(cli *clientv3.Client, schema cluster.Schema, log zerolog.Logger) *Cache {
	c := &Cache{cli: cli, schema: schema, log: log, tokens: map[string]TokenRecord{}, grants: map[string]map[string]GrantRecord{},
		loaded: make(chan struct{}), changed: make(chan struct{})}
	c.syncs = gather.New(syncBatch, 1, c.syncRead)
	return c
}

// Run reads the credentials and watches them until ctx ends, reading them
// again whenever the watch breaks or its revision was compacted.
func (c *Cache) Run(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		rev, err := c.load(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn().Err(err).Msg("auth: reading tokens and grants failed; calls wait until it succeeds")
			}
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		c.watch(ctx, rev+1)
		c.stale()
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// load reads every credential at one revision and marks the cache current.
func (c *Cache) load(ctx context.Context) (int64, error) {
	return c.read(ctx, true)
}

// read reads every credential at one revision and replaces what the cache
// holds with it, unless the cache already applied a later revision. With
// markFresh it marks the cache current; Sync's reads do not, so a cache
// whose watch is down stays stale (calls wait) until Run has a watch
// again: a current cache is one a watch keeps current.
func (c *Cache) read(ctx context.Context, markFresh bool) (int64, error) {
	resp, err := c.cli.Get(ctx, c.schema.AuthDir(), clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp.Header.Revision > c.rev {
		c.tokens = map[string]TokenRecord{}
		c.grants = map[string]map[string]GrantRecord{}
		c.forgetLocked()
		for _, kv := range resp.Kvs {
			c.applyLocked(string(kv.Key), kv)
		}
		c.rev = resp.Header.Revision
		c.readRev = resp.Header.Revision
	}
	if markFresh && !c.fresh {
		c.fresh = true
		close(c.loaded)
	}
	c.notifyLocked()
	return resp.Header.Revision, nil
}

// Sync brings the cache up to a read of etcd made after Sync was called,
// so what it then says of a secret or a grant holds of etcd at that
// moment or later. The guard asks it before refusing a call the cache
// alone would refuse: a token or grant made a moment ago (strandctl token
// create, then a call to another node) may not have reached this node's
// watch yet, and Unauthenticated or PermissionDenied promise that the
// credential does not exist (docs/operating.md, "Permissions").
//
// Calls share reads (internal/gather: a call is answered by a read sent
// after it began, never by one already in flight): one read at a time,
// at most one per syncEvery. A read lasts while any of its callers waits,
// at most syncTimeout.
func (c *Cache) Sync(ctx context.Context) error {
	_, err := c.syncs.Do(ctx, struct{}{})
	return err
}

// syncRead is the read of one batch of Sync calls, once syncEvery has
// passed since the read before.
func (c *Cache) syncRead(ctx context.Context, batch []struct{}) []gather.Result[struct{}] {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	var err error
	if wait := syncEvery - time.Since(time.Unix(0, c.lastSync.Load())); wait > 0 && !sleep(ctx, wait) {
		err = ctx.Err()
	} else {
		c.lastSync.Store(time.Now().UnixNano())
		_, err = c.read(ctx, false)
	}
	out := make([]gather.Result[struct{}], len(batch))
	for i := range out {
		out[i].Err = err
	}
	return out
}

// stale marks the cache as not current: calls wait for the next load.
func (c *Cache) stale() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fresh {
		c.fresh = false
		c.loaded = make(chan struct{})
	}
}

// watch applies changes from rev until the watch ends. WithRequireLeader
// ends it when the etcd member loses its leader, so a node cut off from
// the cluster stops trusting what it holds instead of admitting a token
// revoked on the other side.
func (c *Cache) watch(ctx context.Context, rev int64) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.cli.Watch(wctx, c.schema.AuthDir(), clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if resp.CompactRevision != 0 || resp.Err() != nil || resp.Canceled {
			if ctx.Err() == nil {
				c.log.Info().Err(resp.Err()).Msg("auth: credential watch ended; reading tokens and grants again")
			}
			return
		}
		c.mu.Lock()
		for _, ev := range resp.Events {
			// A read of Sync's may have taken the cache past this event
			// already: applied now, an old put could bring back a token
			// revoked since (until the revoke's own event came). Only a
			// read's revision says so: the events of one transaction
			// share theirs, and each must be applied.
			if ev.Kv.ModRevision <= c.readRev {
				continue
			}
			var kv *mvccpb.KeyValue
			if ev.Type == clientv3.EventTypePut {
				kv = ev.Kv
			}
			c.applyLocked(string(ev.Kv.Key), kv)
			c.rev = ev.Kv.ModRevision
		}
		c.notifyLocked()
		c.mu.Unlock()
	}
}

// applyLocked puts (kv non-nil) or deletes one key. A value that does not
// decode counts as absent: it admits no one.
func (c *Cache) applyLocked(key string, kv *mvccpb.KeyValue) {
	if id, ok := strings.CutPrefix(key, c.schema.TokensDir()); ok {
		c.forgetLocked()
		delete(c.tokens, id)
		if kv == nil {
			return
		}
		rec, err := cluster.Decode[TokenRecord](kv.Value)
		if err != nil || rec.ID != id || len(rec.SHA256) != 64 {
			c.log.Warn().Str("key", key).Msg("auth: unreadable token left out")
			return
		}
		c.tokens[id] = rec
		return
	}
	rest, ok := strings.CutPrefix(key, c.schema.GrantsDir())
	if !ok {
		return
	}
	principal, _, _ := strings.Cut(rest, "/")
	if m := c.grants[principal]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(c.grants, principal)
		}
	}
	if kv == nil {
		return
	}
	g, err := cluster.Decode[GrantRecord](kv.Value)
	if err != nil || g.Principal != principal || validateGrant(g.Principal, g.Permission, g.Streams) != nil {
		c.log.Warn().Str("key", key).Msg("auth: unreadable grant left out")
		return
	}
	if c.grants[principal] == nil {
		c.grants[principal] = map[string]GrantRecord{}
	}
	c.grants[principal][key] = g
}

// forgetLocked empties the Authenticate memo; c.mu is held for writing,
// so no Authenticate can be between its token lookup and its memo store
// with a token this change removes.
func (c *Cache) forgetLocked() {
	c.knownMu.Lock()
	c.known = nil
	c.knownMu.Unlock()
}

func (c *Cache) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Current reports whether the cache is current now (Wait would return
// at once).
func (c *Cache) Current() bool {
	c.mu.RLock()
	ch := c.loaded
	c.mu.RUnlock()
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Wait returns once the cache is current, or ctx's error.
func (c *Cache) Wait(ctx context.Context) error {
	c.mu.RLock()
	ch := c.loaded
	c.mu.RUnlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Authenticate returns the principal of a token secret.
func (c *Cache) Authenticate(secret string) (string, bool) {
	if !strings.HasPrefix(secret, TokenPrefix) {
		return "", false
	}
	// Read locked: a token change (which empties the memo) waits for this
	// call to finish, and this call's memo store cannot outlive it.
	c.mu.RLock()
	defer c.mu.RUnlock()
	c.knownMu.Lock()
	p, ok := c.known[secret]
	c.knownMu.Unlock()
	if ok {
		return p, true
	}
	hash := HashSecret(secret)
	rec, ok := c.tokens[TokenID(hash)]
	// The id is 64 bits of the hash; the rest must match as well. Compared
	// in constant time, though what it hides is a hash of a secret.
	if !ok || subtle.ConstantTimeCompare([]byte(rec.SHA256), []byte(hash)) != 1 {
		return "", false
	}
	c.knownMu.Lock()
	if c.known == nil || len(c.known) >= knownMax {
		c.known = make(map[string]string)
	}
	c.known[secret] = rec.Principal
	c.knownMu.Unlock()
	return rec.Principal, true
}

// Allowed reports whether principal holds perm on stream: a grant of perm
// (or of admin) whose pattern matches it. A stream of All asks for a grant
// on "*" itself: the cluster-wide calls.
func (c *Cache) Allowed(principal string, perm Permission, stream string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, g := range c.grants[principal] {
		if !g.Permission.implies(perm) {
			continue
		}
		if stream == All {
			if g.Streams == All {
				return true
			}
			continue
		}
		if Match(g.Streams, stream) {
			return true
		}
	}
	return false
}

// Until waits until cond holds of the cache, checking it at every change,
// or ctx ends; it is for tests and tools that wait for a change to arrive.
func (c *Cache) Until(ctx context.Context, cond func(*Cache) bool) error {
	for {
		c.mu.RLock()
		ch := c.changed
		c.mu.RUnlock()
		if cond(c) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
