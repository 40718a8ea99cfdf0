package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/lease"
)

const ttl = 2 * time.Second

// keyUnder puts key under the held lease and returns its create revision.
func keyUnder(t *testing.T, cli *clientv3.Client, key string, id clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := cli.Put(context.Background(), key, "x", clientv3.WithLease(id))
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

// createdAt is key's create revision, 0 when it does not exist.
func createdAt(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].CreateRevision
}

// grant grants a held lease through cli, failing the test on error.
func grant(t *testing.T, ctx context.Context, cli *clientv3.Client, ttl time.Duration) (*lease.Held, *lease.Counters) {
	t.Helper()
	counters := new(lease.Counters)
	h, err := lease.Grant(ctx, cli, ttl, counters)
	if err != nil {
		t.Fatal(err)
	}
	return h, counters
}

func isDone(h *lease.Held) bool {
	select {
	case <-h.Done():
		return true
	default:
		return false
	}
}

// Keep-alives that arrive while their answers are late lapse the client's
// session; the lease lives on in etcd and is resumed, so the key under it
// is never deleted. Revoking it then deletes the key at once.
func TestLateAnswersResumeTheLease(t *testing.T) {
	e := etcdtest.Start(t)
	fwd := e.Forward(t)
	direct := e.Client(t)
	// etcd reports a lease's time to live in whole seconds, rounded down:
	// with 5 s, kept alive every 5/3 s, it reads 4 after a renewal and 3
	// before the next, so a renewal shows as a rise.
	const longTTL = 5 * time.Second
	h, counters := grant(t, context.Background(), fwd.Client(t), longTTL)
	created := keyUnder(t, direct, "k", h.ID())

	fwd.HoldReplies()
	clustertest.Eventually(t, 30*time.Second, "the session lapsed", func() bool { return counters.Lapsed.Load() >= 1 })
	fwd.ReleaseReplies()
	clustertest.Eventually(t, 15*time.Second, "the lease resumed", func() bool { return counters.Resumed.Load() >= 1 })
	if isDone(h) {
		t.Fatalf("the lease was given up: %v", h.Err())
	}
	if got := createdAt(t, direct, "k"); got != created {
		t.Fatalf("key under the lease created at %d, want %d (it was deleted)", got, created)
	}
	// The new session keeps it alive: etcd sees it renewed, its time to
	// live rising again, while the key under it stays.
	lowest := int64(-1)
	clustertest.Eventually(t, 3*longTTL, "etcd renewed the resumed lease", func() bool {
		resp, err := direct.TimeToLive(context.Background(), h.ID())
		if err != nil {
			t.Fatal(err)
		}
		if got := createdAt(t, direct, "k"); got != created || resp.TTL <= 0 {
			t.Fatalf("the resumed lease was not kept alive: key created at %d (want %d), time to live %d", got, created, resp.TTL)
		}
		if lowest >= 0 && resp.TTL > lowest {
			return true
		}
		if lowest < 0 || resp.TTL < lowest {
			lowest = resp.TTL
		}
		return false
	})
	if isDone(h) {
		t.Fatalf("the resumed lease was given up: %v", h.Err())
	}

	if err := h.Revoke(); err != nil {
		t.Fatal(err)
	}
	if got := createdAt(t, direct, "k"); got != 0 {
		t.Fatal("the key outlived the revoke")
	}
	if err := h.Revoke(); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
}

// A lease etcd no longer holds is lost, not resumed: its keys are gone.
func TestExpiredLeaseIsLost(t *testing.T) {
	e := etcdtest.Start(t)
	direct := e.Client(t)
	h, counters := grant(t, context.Background(), e.Client(t), ttl)
	if _, err := direct.Revoke(context.Background(), h.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
	case <-time.After(10 * ttl):
		t.Fatal("a lease etcd revoked is still held")
	}
	if !errors.Is(h.Err(), lease.ErrLost) {
		t.Fatalf("err %v, want ErrLost", h.Err())
	}
	if n := counters.Resumed.Load(); n != 0 {
		t.Fatalf("%d resumed, want 0", n)
	}
	if err := h.Revoke(); err != nil {
		t.Fatalf("revoking a lost lease: %v", err)
	}
}

// A lease whose time to live etcd does not answer within a TTL of the
// lapse is given up: nothing kept it alive since, so it has expired.
func TestUnconfirmedLeaseIsGivenUp(t *testing.T) {
	e := etcdtest.Start(t)
	fwd := e.Forward(t)
	direct := e.Client(t)
	h, counters := grant(t, context.Background(), fwd.Client(t), ttl)
	keyUnder(t, direct, "k", h.ID())
	fwd.HoldReplies()
	defer fwd.ReleaseReplies()
	select {
	case <-h.Done():
	case <-time.After(10 * ttl):
		t.Fatal("a lease etcd never confirmed is still held")
	}
	if !errors.Is(h.Err(), lease.ErrLost) || counters.Lapsed.Load() != 1 || counters.Resumed.Load() != 0 {
		t.Fatalf("err %v, %d lapsed, %d resumed; want ErrLost, 1, 0", h.Err(), counters.Lapsed.Load(), counters.Resumed.Load())
	}
	// What Done promised holds in etcd: the key under the lease is gone.
	clustertest.Eventually(t, 2*ttl, "the lease expired in etcd", func() bool { return createdAt(t, direct, "k") == 0 })
}

// Ending the holder's context stops keeping the lease alive; it is no
// lapse.
func TestContextEndStops(t *testing.T) {
	e := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	h, counters := grant(t, ctx, e.Client(t), ttl)
	cancel()
	select {
	case <-h.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("still kept alive after its context ended")
	}
	if !errors.Is(h.Err(), context.Canceled) || counters.Lapsed.Load() != 0 {
		t.Fatalf("err %v, %d lapsed; want context.Canceled, 0", h.Err(), counters.Lapsed.Load())
	}
	if err := h.Revoke(); err != nil {
		t.Fatal(err)
	}
}
