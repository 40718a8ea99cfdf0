package coord

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
)

// awaitHistoryListed waits until the Coord's history watch has listed.
func awaitHistoryListed(t *testing.T, c *Coord) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.historyWatch.mu.Lock()
		listed := c.historyWatch.values != nil
		moved := c.historyWatch.moved
		c.historyWatch.mu.Unlock()
		if listed {
			return
		}
		select {
		case <-moved:
		case <-time.After(time.Until(deadline)):
			t.Fatal("the history watch did not list")
		}
	}
}

// History at a revision is answered from the broker's watch of the history
// directory, with no read of etcd: after a write of the stream's starts
// (the event brings the watch there), after a write elsewhere (a progress
// notification does), for a deleted key (an empty list), and for an
// unreadable value (an error for that stream). Once the watch has stopped
// it reads etcd again. Each answer holds every write made before its
// revision (writeThenRead).
func TestHistoryAtAnsweredFromTheWatch(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	kinds := &clustertest.TxnKinds{KV: cli.KV}
	cli.KV = kinds
	c := newTestCoordOn(t, cli, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := runCoord(c, ctx)
	defer func() {
		cancel()
		<-done
	}()
	awaitHistoryListed(t, c)
	schema := c.cfg.Schema
	reads := func() int { return strings.Count(kinds.Kinds(), "serializable") }
	reads()

	writeThenRead(t, cli, schema, func(ctx context.Context, s string, rev int64) (cluster.HistoryStarts, error) {
		return c.History(ctx, s, rev)
	})
	if n := reads(); n != 0 {
		t.Fatalf("%d reads of etcd for History after writes of the starts; want all from the watch", n)
	}

	put := func(key, val string) int64 {
		t.Helper()
		resp, err := cli.Put(context.Background(), key, val)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	want := cluster.HistoryStarts{{Epoch: 3, RecordTail: 7, Node: "b2"}}
	put(schema.HistoryKey("s"), cluster.Encode(want))
	rev := put("/elsewhere", "x")
	got, err := c.History(context.Background(), "s", rev)
	if err != nil || len(got) != 1 || got[0] != want[0] {
		t.Fatalf("History at a write elsewhere: %v, %v; want %v", got, err, want)
	}
	if n := reads(); n != 0 {
		t.Fatalf("%d reads of etcd for History at a revision that wrote no starts; want a progress notification to answer it", n)
	}

	del, err := cli.Delete(context.Background(), schema.HistoryKey("s"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.History(context.Background(), "s", del.Header.Revision); err != nil || len(got) != 0 {
		t.Fatalf("History of a deleted key: %v, %v; want an empty list", got, err)
	}
	rev = put(schema.HistoryKey("bad"), "{not json")
	if _, err := c.History(context.Background(), "bad", rev); !errors.Is(err, cluster.ErrCorrupt) || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("History of an unreadable value: %v; want ErrCorrupt naming the stream", err)
	}
	if n := reads(); n != 0 {
		t.Fatalf("%d reads of etcd for a deleted and an unreadable key; want none", n)
	}

	c.historyWatch.stop()
	if got, err := c.History(context.Background(), "s", rev); err != nil || len(got) != 0 {
		t.Fatalf("History after the watch stopped: %v, %v", got, err)
	}
	if n := reads(); n == 0 {
		t.Fatal("History after the watch stopped read nothing from etcd")
	}
}

// A watch response's header revision says nothing of events still to come
// when the watch is catching up: only its events' revisions, and a progress
// notification's header, move the revision the values are complete at.
func TestHistoryWatchAdvancesOnEventsAndProgressOnly(t *testing.T) {
	const dir = "/strand/history/"
	h := newHistoryWatch()
	h.list(context.Background(), map[string][]byte{}, 10)
	starts := cluster.Encode(cluster.HistoryStarts{{Epoch: 2, Node: "b1"}})
	h.apply(dir, clientv3.WatchResponse{
		Header: &etcdserverpb.ResponseHeader{Revision: 100},
		Events: []*clientv3.Event{{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(dir + "s"), Value: []byte(starts), ModRevision: 50}}},
	})
	if got, ok, err := h.at(context.Background(), "s", 50, time.Second, nil); !ok || err != nil || len(got) != 1 || got[0].Epoch != 2 {
		t.Fatalf("at 50 after an event at 50: %v, %v, %v", got, ok, err)
	}
	if _, ok, _ := h.at(context.Background(), "s", 51, 10*time.Millisecond, nil); ok {
		t.Fatal("answered at 51 from a response whose events end at 50 (its header said 100)")
	}
	asked := make(chan struct{}, 1)
	go func() {
		<-asked
		h.apply(dir, clientv3.WatchResponse{Header: &etcdserverpb.ResponseHeader{Revision: 100}})
	}()
	progress := func() {
		select {
		case asked <- struct{}{}:
		default:
		}
	}
	if got, ok, err := h.at(context.Background(), "s", 100, 10*time.Second, progress); !ok || err != nil || len(got) != 1 {
		t.Fatalf("at 100 after a progress notification at 100: %v, %v, %v", got, ok, err)
	}
	h.stop()
	if _, ok, _ := h.at(context.Background(), "s", 1, time.Second, nil); ok {
		t.Fatal("answered after the watch stopped")
	}

	// A call waiting when the watch stops is woken to read etcd, not left
	// to the end of its wait (30 s here). Its progress request, made a
	// tenth into the wait, shows it is waiting.
	h.list(context.Background(), map[string][]byte{}, 10)
	waiting := make(chan struct{}, 1)
	woken := make(chan bool, 1)
	go func() {
		_, ok, _ := h.at(context.Background(), "s", 20, 30*time.Second, func() { waiting <- struct{}{} })
		woken <- ok
	}()
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting call asked for no progress within 10 s (its ask is due after 3 s)")
	}
	h.stop()
	select {
	case ok := <-woken:
		if ok {
			t.Fatal("answered from a stopped watch")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call waiting for the watch was not woken when it stopped")
	}
}
