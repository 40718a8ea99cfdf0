package admin_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// A flood of creations on a whole cluster leaves no stream whose copies
// never open: every stream created is placed on live brokers, and each of
// them opens its copy at epoch 1 and reports it in its heartbeat.
func TestCreateFloodOpensEveryCopy(t *testing.T) {
	const n, workers = 300, 32
	c := onebox.Start(t, onebox.Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1})
	adm := c.Admin()
	ctx, cancel := context.WithTimeout(c.Ctx(), 2*time.Minute)
	defer cancel()
	names := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	for range workers {
		wg.Go(func() {
			for name := range names {
				_, err := adm.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: 3}))
				if err != nil {
					mu.Lock()
					failed = append(failed, fmt.Errorf("create %s: %w", name, err))
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		names <- fmt.Sprintf("open-%03d", i)
	}
	close(names)
	wg.Wait()
	for _, err := range failed {
		t.Error(err)
	}
	clustertest.Eventually(t, time.Minute, "every copy of every stream open at epoch 1", func() error {
		snap, err := state.Load(ctx, c.Cli, c.Schema)
		if err != nil {
			return err
		}
		if len(snap.Assignments) != n || len(snap.Streams) != n {
			return fmt.Errorf("%d assignments and %d specs stored, want %d", len(snap.Assignments), len(snap.Streams), n)
		}
		closed := 0
		var first string
		for name, a := range snap.Assignments {
			for _, m := range a.Value.Members() {
				if t, ok := snap.Tails(m, name); !ok || t.Epoch != 1 {
					if closed == 0 {
						first = fmt.Sprintf("%s on %s (reported %v: %+v)", name, m, ok, t)
					}
					closed++
				}
			}
		}
		if closed > 0 {
			return fmt.Errorf("%d copies not open yet, the first %s", closed, first)
		}
		return nil
	})
}

// BenchmarkCreateFloodCluster creates streams of 3 copies on a whole
// in-process cluster (3 brokers, the controller with its liveness loop),
// 64 calls in flight through the Go client, and reports the rate:
//
//	go test -run '^$' -bench CreateFloodCluster -benchtime 1x ./services/controller/internal/admin/
func BenchmarkCreateFloodCluster(b *testing.B) {
	const n, workers = 3000, 64
	for i := range b.N {
		b.StopTimer()
		c := onebox.Start(b, onebox.Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1})
		adm := c.Admin()
		b.StartTimer()
		start := time.Now()
		names := make(chan string)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for name := range names {
					if _, err := adm.CreateStream(c.Ctx(), connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: 3})); err != nil {
						b.Errorf("create %s: %v", name, err)
					}
				}
			})
		}
		for j := range n {
			names <- fmt.Sprintf("bench-%d-%05d", i, j)
		}
		close(names)
		wg.Wait()
		b.ReportMetric(float64(n)/time.Since(start).Seconds(), "streams/s")
	}
}
