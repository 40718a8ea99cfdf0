package onebox

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
)

// metric scrapes one counter or gauge without labels from node's /metrics.
func metric(c *Cluster, node, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(c.Ctx(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rpcserver.BaseURL(c.Addr(node))+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := rpcserver.HTTPClient().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s in /metrics (%v)", node, name, sc.Err())
}

func (c *Cluster) etcdRev() int64 {
	c.t.Helper()
	resp, err := c.Cli.Get(c.Ctx(), "/nothing", clientv3.WithCountOnly())
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestIdleClusterWritesNoRevisions: liveness is the lease, and brokers
// write their heartbeats when a copy's status changes, so an idle cluster
// leaves etcd's revision where it is however many heartbeat intervals pass
// (with a heartbeat written every interval, etcd's history grows without
// end and its quota fills: docs/etcd.md). The window is counted in the
// brokers' own heartbeat ticks, not in time.
func TestIdleClusterWritesNoRevisions(t *testing.T) {
	c := three(t)
	brokers := []string{"b1", "b2", "b3"}
	const records = 5
	var streams []cluster.Assignment
	for i := range 4 {
		streams = append(streams, c.CreateStream(fmt.Sprintf("idle-%d", i), 3, majority))
	}
	c.Publish(streams[0].Owner, streams[0].Stream, Numbered("r", records)...)
	// Settled: every copy of the stream published to has published its
	// tails and the confirm watermark past the records.
	for _, n := range brokers {
		clustertest.Eventually(t, 15*time.Second, "tails published on "+n, func() error {
			tt, ok := c.Tails(n, streams[0].Stream)
			if !ok || tt.RecordTail != records || tt.ConfirmWatermark != records {
				return fmt.Errorf("%s publishes %+v", n, tt)
			}
			return nil
		})
	}
	const window = 10
	start, skipped := map[string]float64{}, map[string]float64{}
	for _, n := range brokers {
		v, err := metric(c, n, "strand_broker_heartbeat_ticks_total")
		if err != nil {
			t.Fatal(err)
		}
		start[n] = v
		if skipped[n], err = metric(c, n, "strand_broker_heartbeat_tails_skipped_total"); err != nil {
			t.Fatal(err)
		}
	}
	r0 := c.etcdRev()
	for _, n := range brokers {
		clustertest.Eventually(t, 30*time.Second, fmt.Sprintf("%s through %d heartbeat intervals", n, window), func() error {
			v, err := metric(c, n, "strand_broker_heartbeat_ticks_total")
			if err != nil {
				return err
			}
			if v < start[n]+window {
				return fmt.Errorf("%s at tick %v, from %v", n, v, start[n])
			}
			return nil
		})
	}
	// One write per broker is allowed for a tail still settling (a
	// follower's confirm watermark arrives with the owner's next
	// message); a heartbeat per interval would be 3 × 10.
	if moved := c.etcdRev() - r0; moved > int64(len(brokers)) {
		t.Fatalf("etcd revision moved %d over %d heartbeat intervals of an idle cluster of %d brokers; want at most %d", moved, window, len(brokers), len(brokers))
	}
	for _, n := range brokers {
		if v, err := metric(c, n, "strand_broker_heartbeat_omitted_copies"); err != nil || v != 0 {
			t.Errorf("%s omits %v copies (%v)", n, v, err)
		}
		// Idle, most tails passes read no status (docs/etcd-schema.md,
		// "Heartbeat shards"): nine in ten once settled, and a settling
		// tail costs a pass or two.
		v, err := metric(c, n, "strand_broker_heartbeat_tails_skipped_total")
		if err != nil {
			t.Fatal(err)
		}
		if v-skipped[n] < window/2 {
			t.Errorf("%s skipped %v of %d idle tails passes; want at least %d", n, v-skipped[n], window, window/2)
		}
	}
}

// TestRestartedBrokerIsSeenAgain: a broker stopped (its lease revoked, and
// with it every heartbeat shard) and started again writes every shard
// holding a copy under its new lease at once, so the controller sees its copies again
// without any of them having changed.
func TestRestartedBrokerIsSeenAgain(t *testing.T) {
	c := three(t)
	var streams []string
	for i := range 3 {
		a := c.CreateStream(fmt.Sprintf("back-%d", i), 3, majority)
		streams = append(streams, a.Stream)
	}
	shards := func(node string) (int, error) {
		resp, err := c.Cli.Get(c.Ctx(), c.Schema.HeartbeatDir(node), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return int(resp.Count), nil
	}
	c.StopBroker("b3")
	clustertest.Eventually(t, 15*time.Second, "b3's heartbeat gone with its lease", func() error {
		if n, err := shards("b3"); err != nil || n != 0 {
			return fmt.Errorf("%d shards (%v)", n, err)
		}
		return nil
	})
	c.StartBroker("b3")
	// The shards holding b3's copies, and shard 0, which a broker always
	// writes; an absent shard reads as an empty one.
	want := map[int]bool{0: true}
	for _, s := range streams {
		want[cluster.HeartbeatShard(s)] = true
	}
	if n, err := shards("b3"); err != nil || n != len(want) {
		t.Fatalf("b3 registered with %d heartbeat shards (%v), want %d (its copies' and shard 0)", n, err, len(want))
	}
	for _, s := range streams {
		a := c.WaitAssignment(s, 20*time.Second, "b3 back in "+s, func(a cluster.Assignment) error {
			if !a.Includes("b3") {
				return fmt.Errorf("assignment %+v", a)
			}
			return nil
		})
		c.WaitApplied(a)
	}
}
