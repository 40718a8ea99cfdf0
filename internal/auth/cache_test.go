package auth

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
)

// The cache follows etcd: a token made is admitted and one revoked is not,
// a grant made or revoked changes what is allowed, and a value that does
// not decode admits no one. Each change is waited for on the cache's own
// change signal, with a deadline.
func TestCacheFollowsEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("/cachetest")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cache := NewCache(cli, schema, zerolog.Nop())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cache.Run(runCtx)
	}()
	defer func() {
		stop()
		<-done
	}()
	st := &Store{KV: cli, Schema: schema, Txn: PlainTxn(cli)}

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
