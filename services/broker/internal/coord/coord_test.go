package coord

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// newTestCoord is a Coord for node b1 on embedded etcd, with a replica
// manager on real Badger in a temp dir, and a lease TTL long enough that
// only a revoke removes its registration within a test.
func newTestCoord(t *testing.T) (*Coord, *etcdtest.Server) {
	t.Helper()
	e := etcdtest.Start(t)
	return newTestCoordOn(t, e.Client(t), time.Minute), e
}

// newTestCoordOn is newTestCoord's Coord on the given client and lease TTL.
func newTestCoordOn(t *testing.T, cli *clientv3.Client, ttl time.Duration) *Coord {
	t.Helper()
	db, err := storage.Open(storage.Options{Dir: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	schema := cluster.NewSchema("")
	var c *Coord
	// The manager reads a stream's keys through the Coord, as the broker
	// app wires it (unknown streams, orphans).
	m, err := replica.NewManager(replica.Config{Node: "b1", Storage: db, Logger: zerolog.Nop(),
		History:    func(context.Context, string, int64) (cluster.HistoryStarts, error) { return nil, nil },
		ReadStream: func(ctx context.Context, stream string) (replica.StreamKeys, error) { return c.ReadStream(ctx, stream) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		_ = db.Close()
	})
	c = New(Config{Client: cli, Schema: schema, Node: "b1", Address: "127.0.0.1:1",
		Heartbeat: 100 * time.Millisecond, LeaseTTL: ttl, Logger: zerolog.Nop(), Manager: m})
	return c
}

func registered(t *testing.T, c *Coord) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.cfg.Client.Get(ctx, c.cfg.Schema.BrokerKey(c.cfg.Node))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) > 0
}

func runCoord(c *Coord, ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return done
}

func waitRun(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
}

// A Revoke that runs before a session is made (while Run registers, or
// re-registers after a lost session) still ends it: Run does not stay
// registered on a lease no one revokes, which would delay failover of the
// broker's streams by the lease TTL.
func TestRevokeBeforeRegistrationLeavesNoRegistration(t *testing.T) {
	c, _ := newTestCoord(t)
	if err := c.Revoke(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waitRun(t, runCoord(c, ctx))
	if registered(t, c) {
		t.Fatal("the broker is registered after Revoke and Run returned")
	}
}

// Run ending with its context, without a Revoke, revokes its lease as it
// returns: the registration is gone at once, not after the lease TTL.
func TestRunEndingRevokesItsLease(t *testing.T) {
	c, _ := newTestCoord(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := runCoord(c, ctx)
	select {
	case <-c.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("not registered")
	}
	if !registered(t, c) {
		t.Fatal("ready but not registered")
	}
	cancel()
	waitRun(t, done)
	if registered(t, c) {
		t.Fatal("still registered after Run returned (the lease is left to its TTL)")
	}
}

// A session can end on the broker's side while etcd still holds its
// lease: no keep-alive answer came within the TTL, although the
// keep-alives themselves arrived (answers late on a saturated machine).
// The broker resumes that lease. Its registration is never deleted, so
// the controller never sees it go and none of its streams fail over;
// revoking it and registering anew, as it once did, failed over every
// stream the broker owned.
func TestLateKeepAliveAnswersResumeTheLease(t *testing.T) {
	e := etcdtest.Start(t)
	fwd := e.Forward(t)
	c := newTestCoordOn(t, fwd.Client(t), 5*time.Second)
	direct := e.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runCoord(c, ctx)
	select {
	case <-c.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("not registered")
	}
	brokerKey := func() *mvccpb.KeyValue {
		t.Helper()
		resp, err := direct.Get(ctx, c.cfg.Schema.BrokerKey("b1"))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("broker key: %v, %d keys", err, len(resp.Kvs))
		}
		return resp.Kvs[0]
	}
	before := brokerKey()

	// Keep-alives go on arriving (etcd renews the lease every half
	// second) while none of their answers reaches the broker, until its
	// client gives the lease up, a TTL after the last answer.
	fwd.HoldReplies()
	clustertest.Eventually(t, 30*time.Second, "the session lapsed", func() bool { return c.SessionsLapsed() >= 1 })
	fwd.ReleaseReplies()
	clustertest.Eventually(t, 15*time.Second, "the lease resumed", func() bool { return c.LeasesResumed() >= 1 })
	// A registration deleted and written again would have been created
	// anew: the controller would have seen the broker go.
	after := brokerKey()
	if after.Lease != before.Lease || after.CreateRevision != before.CreateRevision {
		t.Fatalf("registration: lease %x created at %d, was lease %x created at %d",
			after.Lease, after.CreateRevision, before.Lease, before.CreateRevision)
	}
	if n := c.LeasesResumed(); n != 1 {
		t.Fatalf("%d leases resumed, want 1", n)
	}
	// Stopping still revokes the resumed lease at once.
	cancel()
	waitRun(t, done)
	if registered(t, c) {
		t.Fatal("still registered after Run returned (the resumed lease is left to its TTL)")
	}
}
