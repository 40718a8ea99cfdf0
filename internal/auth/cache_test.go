package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
)

// runCache starts etcd and a cache of prefix's credentials, run until the
// test ends; ctx bounds the test.
func runCache(t *testing.T, prefix string) (context.Context, *clientv3.Client, cluster.Schema, *Cache, *Store) {
	t.Helper()
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cache := NewCache(cli, schema, zerolog.Nop())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cache.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ctx, cli, schema, cache, &Store{KV: cli, Schema: schema, Txn: PlainTxn(cli)}
}

// The cache follows etcd: a token made is admitted and one revoked is not,
// a grant made or revoked changes what is allowed, and a value that does
// not decode admits no one. Each change is waited for on the cache's own
// change signal, with a deadline.
func TestCacheFollowsEtcd(t *testing.T) {
	ctx, cli, schema, cache, st := runCache(t, "/cachetest")

	rec, secret, err := st.CreateToken(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	authenticated := func(secret string) func(*Cache) bool {
		return func(c *Cache) bool { p, ok := c.Authenticate(secret); return ok && p == "alice" }
	}
	if err := cache.Until(ctx, authenticated(secret)); err != nil {
		t.Fatalf("token never admitted: %v", err)
	}
	// A secret differing from a known one in one digit is unknown.
	changed := secret[:len(secret)-1] + "0"
	if secret[len(secret)-1] == '0' {
		changed = secret[:len(secret)-1] + "1"
	}
	if _, ok := cache.Authenticate(changed); ok {
		t.Error("a changed secret is admitted")
	}
	if _, ok := cache.Authenticate("Bearer " + secret); ok {
		t.Error("a secret with a prefix is admitted")
	}

	if cache.Allowed("alice", Read, "orders.eu") {
		t.Fatal("alice reads without a grant")
	}
	if _, err := st.Grant(ctx, "alice", Read, "orders.*"); err != nil {
		t.Fatal(err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return c.Allowed("alice", Read, "orders.eu") }); err != nil {
		t.Fatalf("grant never took effect: %v", err)
	}
	for _, tc := range []struct {
		perm   Permission
		stream string
	}{{Publish, "orders.eu"}, {Admin, "orders.eu"}, {Read, "payments"}, {Read, All}} {
		if cache.Allowed("alice", tc.perm, tc.stream) {
			t.Errorf("read on orders.* allows %s on %s", tc.perm, tc.stream)
		}
	}
	if _, err := st.Grant(ctx, "alice", Admin, All); err != nil {
		t.Fatal(err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return c.Allowed("alice", Publish, "payments") && c.Allowed("alice", Read, All) }); err != nil {
		t.Fatalf("admin on * never implied publish and read: %v", err)
	}
	if ok, err := st.Revoke(ctx, "alice", Admin, All); err != nil || !ok {
		t.Fatalf("revoke: %v, %v", ok, err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return !c.Allowed("alice", Publish, "payments") }); err != nil {
		t.Fatalf("revoke never took effect: %v", err)
	}

	// A grant that does not decode counts as absent.
	if _, err := cli.Put(ctx, schema.GrantKey("alice", "publish", "orders.*"), "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Grant(ctx, "alice", Publish, "marker"); err != nil {
		t.Fatal(err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return c.Allowed("alice", Publish, "marker") }); err != nil {
		t.Fatal(err)
	}
	if cache.Allowed("alice", Publish, "orders.eu") {
		t.Error("an unreadable grant allows publish")
	}

	gone, err := st.RevokeTokens(ctx, rec.ID, "")
	if err != nil || len(gone) != 1 {
		t.Fatalf("revoke token: %v, %v", gone, err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return !authenticated(secret)(c) }); err != nil {
		t.Fatalf("revoked token still admitted: %v", err)
	}
}

// The first admin is bootstrapped once: a second bootstrap is refused while
// a principal holds admin on "*".
func TestBootstrapOnce(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &Store{KV: cli, Schema: cluster.NewSchema(""), Txn: PlainTxn(cli)}
	rec, secret, err := st.Bootstrap(ctx, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if rec.SHA256 != HashSecret(secret) || rec.ID != TokenID(rec.SHA256) {
		t.Fatalf("record %+v does not hash the secret", rec)
	}
	grants, err := st.Grants(ctx, "ops")
	if err != nil || len(grants) != 1 || grants[0].Permission != Admin || grants[0].Streams != All {
		t.Fatalf("grants of ops: %v, %v", grants, err)
	}
	if _, _, err := st.Bootstrap(ctx, "other"); !errors.Is(err, ErrBootstrapped) {
		t.Fatalf("second bootstrap: %v, want ErrBootstrapped", err)
	}
	toks, err := st.Tokens(ctx, "")
	if err != nil || len(toks) != 1 {
		t.Fatalf("tokens after a refused bootstrap: %v, %v", toks, err)
	}
}

// BootstrapPrincipal grants a certificate principal admin on "*" and no
// token; again for the same principal it keeps the grant, and for another
// it refuses.
func TestBootstrapPrincipal(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &Store{KV: cli, Schema: cluster.NewSchema(""), Txn: PlainTxn(cli)}
	first, err := st.BootstrapPrincipal(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	again, err := st.BootstrapPrincipal(ctx, "admin")
	if err != nil || again != first {
		t.Fatalf("second bootstrap of the same principal: %+v, %v; want %+v", again, err, first)
	}
	if _, err := st.BootstrapPrincipal(ctx, "other"); !errors.Is(err, ErrBootstrapped) {
		t.Fatalf("bootstrap of another principal: %v, want ErrBootstrapped", err)
	}
	if _, _, err := st.Bootstrap(ctx, "other"); !errors.Is(err, ErrBootstrapped) {
		t.Fatalf("token bootstrap after a certificate one: %v, want ErrBootstrapped", err)
	}
	grants, err := st.Grants(ctx, "")
	if err != nil || len(grants) != 1 || grants[0].Principal != "admin" || grants[0].Permission != Admin || grants[0].Streams != All {
		t.Fatalf("grants: %v, %v", grants, err)
	}
	if toks, err := st.Tokens(ctx, ""); err != nil || len(toks) != 0 {
		t.Fatalf("tokens: %v, %v", toks, err)
	}
	if _, err := st.BootstrapPrincipal(ctx, "bad/name"); err == nil {
		t.Fatal("a bad principal was granted")
	}
}

// BenchmarkAuthenticate is the per-call cost of a bearer token on a
// broker: the guard's Precheck and its interceptor each authenticate the
// same secret, as every call of a client does.
func BenchmarkAuthenticate(b *testing.B) {
	e := etcdtest.Start(b)
	cli := e.Client(b)
	schema := cluster.NewSchema("/cachebench")
	ctx, cancel := context.WithCancel(context.Background())
	cache := NewCache(cli, schema, zerolog.Nop())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cache.Run(ctx)
	}()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	st := &Store{KV: cli, Schema: schema, Txn: PlainTxn(cli)}
	_, secret, err := st.CreateToken(ctx, "alice")
	if err != nil {
		b.Fatal(err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { _, ok := c.Authenticate(secret); return ok }); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for range 2 {
			if p, ok := cache.Authenticate(secret); !ok || p != "alice" {
				b.Fatalf("Authenticate = %q, %v", p, ok)
			}
		}
	}
}

// A token or grant made in etcd that this node's watch has not delivered is
// not refused: the guard reads etcd (Cache.Sync) before it answers
// Unauthenticated or PermissionDenied, which promise the credential does
// not exist. The cache here is loaded once and runs no watch, so only that
// read can show it the new credentials. A secret etcd does not hold is
// still refused, after the read; and a read that cannot be made is
// Unavailable, not a refusal.
func TestGuardReadsEtcdBeforeRefusing(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("/synctest")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cache := NewCache(cli, schema, zerolog.Nop())
	if _, err := cache.load(ctx); err != nil {
		t.Fatal(err)
	}
	g := NewGuard(cache, Options{})
	st := &Store{KV: cli, Schema: schema, Txn: PlainTxn(cli)}
	_, secret, err := st.CreateToken(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cache.Authenticate(secret); ok {
		t.Fatal("the cache knows the new token without a read: the test shows nothing")
	}
	p, err := g.bearer(ctx, "Bearer "+secret)
	if err != nil || p != "bob" {
		t.Fatalf("a token made before the call: got %q, %v; want bob", p, err)
	}
	if _, err := st.Grant(ctx, "bob", Read, "orders.*"); err != nil {
		t.Fatal(err)
	}
	if err := g.authorize(ctx, Rule{Scope: OnStream, Perms: []Permission{Read}, Field: "stream"}, "bob", &strandv1.ReadRequest{Stream: "orders.eu"}); err != nil {
		t.Fatalf("a grant made before the call: %v", err)
	}
	err = g.authorize(ctx, Rule{Scope: OnCluster, Perms: []Permission{Admin}}, "bob", nil)
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("admin without a grant: %v, want PermissionDenied", err)
	}
	unknown := TokenPrefix + strings.Repeat("0", len(secret)-len(TokenPrefix))
	if _, err := g.bearer(ctx, "Bearer "+unknown); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a secret etcd does not hold: %v, want Unauthenticated", err)
	}

	// Calls at once share reads, and each sees what was made before it.
	_, late, err := st.CreateToken(ctx, "carol")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 32)
	for range cap(errs) {
		go func() {
			p, err := g.bearer(ctx, "Bearer "+late)
			if err == nil && p != "carol" {
				err = fmt.Errorf("principal %q", p)
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("a call at once with others: %v", err)
		}
	}

	e.Close()
	_, err = g.bearer(ctx, "Bearer "+unknown)
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a refusal etcd could not confirm: %v, want Unavailable", err)
	}
}

// The watch skips only what a read of Sync's already holds: the deletes of
// one transaction (all of a principal's tokens revoked at once) share a
// revision, and every one of them is applied.
func TestCacheAppliesEveryEventOfATransactionAfterASync(t *testing.T) {
	ctx, _, _, cache, st := runCache(t, "/synctxn")
	var secrets []string
	for range 3 {
		_, s, err := st.CreateToken(ctx, "dave")
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, s)
	}
	admitted := func(c *Cache) int {
		n := 0
		for _, s := range secrets {
			if _, ok := c.Authenticate(s); ok {
				n++
			}
		}
		return n
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return admitted(c) == len(secrets) }); err != nil {
		t.Fatalf("tokens never admitted: %v", err)
	}
	if err := cache.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	gone, err := st.RevokeTokens(ctx, "", "dave")
	if err != nil || len(gone) != len(secrets) {
		t.Fatalf("revoke dave's tokens: %v, %v", gone, err)
	}
	if err := cache.Until(ctx, func(c *Cache) bool { return admitted(c) == 0 }); err != nil {
		t.Fatalf("%d of dave's %d revoked tokens still admitted: %v", admitted(cache), len(secrets), err)
	}
}
