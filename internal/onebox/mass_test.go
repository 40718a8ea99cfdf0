package onebox

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// massStreams is how many streams BenchmarkMassFailover fails over.
var massStreams = flag.Int("mass-streams", 1000, "streams of BenchmarkMassFailover")

// Bounds of the mass failover scenario: every wait ends by its deadline and
// every stream takes a bounded number of records.
const (
	// massBefore records per stream are confirmed before the publisher
	// that runs across the kill starts.
	massBefore = 1
	// massDuring records per stream are published across the kill.
	massDuring = 3
	// massWorkers publish at once, across all streams.
	massWorkers = 16
	// massWithin bounds each phase (creating, publishing, every stream
	// serving again, the ledger check).
	massWithin = 3 * time.Minute
)

// massResult is what one mass failover measured, for the affected streams
// (those the killed broker owned): from the kill to the pending recovery
// recorded and the new assignment committed, both as seen by an etcd watch,
// and to the first publish a stream confirms again.
type massResult struct {
	killed   string
	affected int
	// movedBefore and othersMoved count streams that failed over other
	// than by the kill (before it, or not owned by the killed broker):
	// a lease that ran out on a loaded machine. They blur the figures.
	movedBefore, othersMoved int
	recorded                 []time.Duration
	committed                []time.Duration
	serving                  []time.Duration
}

// TestMassFailover: the broker owning the most of 500 three-copy
// majority_durable streams is killed (no lease revoke) while a publisher
// runs on all of them. Every stream serves again, each confirming a new
// publish (the killed broker's at a new epoch), and every record confirmed
// on any stream, before or across the kill, is at its confirmed offset on
// the stream's owner afterwards.
func TestMassFailover(t *testing.T) {
	r := massFailover(t, 500, false)
	t.Logf("killed %s owning %d of 500 streams: recoveries recorded within %s (median %s), committed within %s (median %s), all serving within %s (median %s)",
		r.killed, r.affected, slices.Max(r.recorded), median(r.recorded), slices.Max(r.committed), median(r.committed), slices.Max(r.serving), median(r.serving))
}

// BenchmarkMassFailover measures one mass failover of -mass-streams streams
// (1000 by default; run with -benchtime=1x): the time from the kill until
// the killed broker's streams all have a new owner committed and all
// confirm a publish again, max and median.
func BenchmarkMassFailover(b *testing.B) {
	for range b.N {
		r := massFailover(b, *massStreams, false)
		b.ReportMetric(float64(r.affected), "affected")
		b.ReportMetric(float64(r.movedBefore), "moved-before-kill")
		b.ReportMetric(float64(r.othersMoved), "others-moved")
		b.ReportMetric(ms(slices.Max(r.recorded)), "record-max-ms")
		b.ReportMetric(ms(median(r.recorded)), "record-median-ms")
		b.ReportMetric(ms(slices.Max(r.committed)), "commit-max-ms")
		b.ReportMetric(ms(median(r.committed)), "commit-median-ms")
		b.ReportMetric(ms(slices.Max(r.serving)), "serve-max-ms")
		b.ReportMetric(ms(median(r.serving)), "serve-median-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// massFailover runs the scenario on n streams, on a cluster with TLS when
// secure, and checks it; the timer of a benchmark runs only from the kill
// to every stream serving again.
func massFailover(tb testing.TB, n int, secure bool) massResult {
	b, _ := tb.(*testing.B)
	if b != nil {
		b.StopTimer()
	}
	c := Start(tb, Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1, Recoverers: 1, Secure: secure})
	streams := make([]string, n)
	for i := range streams {
		streams[i] = fmt.Sprintf("mass-%05d", i)
	}
	phase := time.Now()
	createAll(tb, c, streams)
	tb.Logf("%d streams created in %s", n, time.Since(phase).Round(time.Millisecond))
	phase = time.Now()
	cl := c.Client()
	ledgers := make(map[string]*ledger.Ledger, n)
	for _, s := range streams {
		ledgers[s] = ledger.New()
	}

	// Every stream confirms before the kill: its owner owns and a
	// follower follows.
	var items []massItem
	for _, s := range streams {
		for i := range massBefore {
			items = append(items, massItem{s, fmt.Sprintf("%s-before-%d", s, i)})
		}
	}
	if err := publishItems(c.Ctx(), cl, items, ledgers, massWorkers, nil); err != nil {
		tb.Fatalf("before the kill: %v", err)
	}
	tb.Logf("every stream published to in %s", time.Since(phase).Round(time.Millisecond))
	before := assignments(tb, c)
	owned := map[string][]string{}
	for _, s := range streams {
		owned[before[s].Owner] = append(owned[before[s].Owner], s)
	}
	killed := ""
	for _, node := range []string{"b1", "b2", "b3"} {
		if killed == "" || len(owned[node]) > len(owned[killed]) {
			killed = node
		}
	}
	affected := owned[killed]

	// The publisher runs across the kill: massDuring records per stream in
	// a random order, each publish retried by the client through the
	// failover. Errors are allowed (recorded as failures, whose records may
	// or may not be stored); a confirm is a promise the check keeps.
	items = items[:0]
	for _, s := range streams {
		for i := range massDuring {
			items = append(items, massItem{s, fmt.Sprintf("%s-during-%d", s, i)})
		}
	}
	rand.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	var confirmedDuring atomic.Int64
	during := make(chan error, 1)
	go func() { during <- publishItems(c.Ctx(), cl, items, ledgers, massWorkers, &confirmedDuring) }()
	clustertest.Eventually(tb, massWithin, "the publisher confirms across the streams before the kill", func() error {
		if got := confirmedDuring.Load(); got < int64(len(items)/4) {
			return fmt.Errorf("%d of %d confirmed", got, len(items))
		}
		return nil
	})

	// Commits are timed from an etcd watch opened before the kill.
	wctx, wcancel := context.WithCancel(c.Ctx())
	defer wcancel()
	head, err := c.Cli.Get(wctx, c.Schema.AssignmentsDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		tb.Fatalf("read etcd revision: %v", err)
	}
	wch := c.Cli.Watch(wctx, c.Schema.AssignmentsDir(), clientv3.WithPrefix(), clientv3.WithRev(head.Header.Revision+1))
	rch := c.Cli.Watch(wctx, c.Schema.RecoveriesDir(), clientv3.WithPrefix(), clientv3.WithRev(head.Header.Revision+1))

	// The watches' events are timed from here, by goroutines running
	// before the kill.
	var killedAt time.Time
	killing := make(chan struct{})
	committed, recorded := map[string]time.Duration{}, map[string]time.Duration{}
	var cmu sync.Mutex
	recordsDone := make(chan struct{})
	go func() {
		defer close(recordsDone)
		<-killing
		for resp := range rch {
			now := time.Since(killedAt)
			for _, ev := range resp.Events {
				stream, err := cluster.NameIn(c.Schema.RecoveriesDir(), string(ev.Kv.Key))
				if ev.Type != clientv3.EventTypePut || err != nil {
					continue
				}
				cmu.Lock()
				if _, ok := recorded[stream]; !ok {
					recorded[stream] = now
				}
				cmu.Unlock()
			}
		}
	}()
	commitsDone := make(chan struct{})
	go func() {
		defer close(commitsDone)
		<-killing
		for resp := range wch {
			now := time.Since(killedAt)
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				a, err := cluster.Decode[cluster.Assignment](ev.Kv.Value)
				if err != nil || a.Epoch <= before[a.Stream].Epoch || a.Owner == killed {
					continue
				}
				cmu.Lock()
				if _, ok := committed[a.Stream]; !ok {
					committed[a.Stream] = now
				}
				cmu.Unlock()
			}
		}
	}()

	if b != nil {
		b.StartTimer()
	}
	killedAt = time.Now()
	close(killing)
	kill := c.KillBroker(killed)

	// Every stream serves again: one publish each that must confirm, on a
	// stream of the killed broker at a later epoch than before the kill.
	serving := make([]time.Duration, len(affected))
	probes := make(chan error, n)
	for _, s := range streams {
		go func() {
			ctx, cancel := context.WithTimeout(c.Ctx(), massWithin)
			defer cancel()
			// Each attempt has its own payload: a failed one may be
			// stored, and the next is another record.
			for attempt := 0; ctx.Err() == nil; attempt++ {
				payload := fmt.Sprintf("%s-after-%d", s, attempt)
				res, err := cl.Publish(ctx, s, []*strandv1.Record{{Payload: []byte(payload)}})
				if err != nil {
					ledgers[s].Fail(payload, err)
					continue
				}
				ledgers[s].Confirm(payload, res.GetOffsets()[0], res.GetEpoch())
				if i := slices.Index(affected, s); i >= 0 {
					serving[i] = time.Since(killedAt)
					if res.GetEpoch() <= before[s].Epoch {
						probes <- fmt.Errorf("%s confirmed at epoch %d after its owner %s was killed at epoch %d", s, res.GetEpoch(), killed, before[s].Epoch)
						return
					}
				}
				probes <- nil
				return
			}
			probes <- fmt.Errorf("%s does not serve again: %w", s, ctx.Err())
		}()
	}
	for range n {
		if err := <-probes; err != nil {
			tb.Fatal(err)
		}
	}
	if b != nil {
		b.StopTimer()
	}
	clustertest.Eventually(tb, massWithin, "every new owner of the killed broker's streams seen committed", func() error {
		cmu.Lock()
		defer cmu.Unlock()
		if len(committed) < len(affected) {
			return fmt.Errorf("%d of %d", len(committed), len(affected))
		}
		return nil
	})
	wcancel()
	<-commitsDone
	<-recordsDone
	if err := <-during; err != nil {
		tb.Fatalf("publisher across the kill: %v", err)
	}
	if err := <-kill; err != nil {
		tb.Fatalf("kill %s: %v", killed, err)
	}

	// Nothing confirmed was lost or moved: each stream's owner shows every
	// confirmed record at its offset.
	after := assignments(tb, c)
	phase = time.Now()
	checkLedgers(tb, c, streams, after, ledgers)
	tb.Logf("every stream checked against its ledger in %s", time.Since(phase).Round(time.Millisecond))

	r := massResult{killed: killed, affected: len(affected), serving: serving}
	for _, s := range affected {
		r.committed = append(r.committed, committed[s])
		r.recorded = append(r.recorded, recorded[s])
	}
	return r
}

type massItem struct{ stream, payload string }

// createAll creates the streams through the AdminService, a few at once;
// massFailover's first publishes then wait until each serves.
func createAll(tb testing.TB, c *Cluster, streams []string) {
	tb.Helper()
	admin := c.Admin()
	work := make(chan string)
	errs := make(chan error, len(streams))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for s := range work {
				errs <- createOne(c, admin, s)
			}
		})
	}
	for _, s := range streams {
		work <- s
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// createOne creates a three-copy majority_durable stream, trying again
// (bounded) while fewer than three brokers are live: on a loaded machine a
// broker's short lease can run out and be renewed while the streams are
// being created.
func createOne(c *Cluster, admin strandv1connect.AdminServiceClient, stream string) error {
	deadline := time.Now().Add(massWithin)
	for {
		ctx, cancel := context.WithTimeout(c.Ctx(), massWithin)
		_, err := admin.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{
			Name: stream, Copies: 3, Policy: &strandv1.ConfirmPolicy{Name: majority.Name},
		}))
		cancel()
		if err == nil || connect.CodeOf(err) != connect.CodeFailedPrecondition || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("create %s: %w", stream, err)
			}
			return nil
		}
		select {
		case <-c.Ctx().Done():
			return c.Ctx().Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// publishItems publishes each item once through cl (the client retries
// within its budget) from workers goroutines, recording every answer in the
// stream's ledger. It returns an error only for a confirm that is not one
// offset; failed publishes are recorded, not errors.
func publishItems(ctx context.Context, cl *client.Client, items []massItem, ledgers map[string]*ledger.Ledger, workers int, confirmed *atomic.Int64) error {
	work := make(chan massItem)
	var bad atomic.Pointer[error]
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for it := range work {
				pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				res, err := cl.Publish(pctx, it.stream, []*strandv1.Record{{Payload: []byte(it.payload)}})
				cancel()
				l := ledgers[it.stream]
				switch {
				case err != nil:
					l.Fail(it.payload, err)
				case len(res.GetOffsets()) != 1:
					err := fmt.Errorf("publish of %s answered with %d offsets", it.payload, len(res.GetOffsets()))
					bad.Store(&err)
				default:
					l.Confirm(it.payload, res.GetOffsets()[0], res.GetEpoch())
					if confirmed != nil {
						confirmed.Add(1)
					}
				}
			}
		})
	}
	for _, it := range items {
		work <- it
	}
	close(work)
	wg.Wait()
	if err := bad.Load(); err != nil {
		return *err
	}
	return nil
}

// assignments reads every assignment from etcd in one listing.
func assignments(tb testing.TB, c *Cluster) map[string]cluster.Assignment {
	tb.Helper()
	resp, err := c.Cli.Get(c.Ctx(), c.Schema.AssignmentsDir(), clientv3.WithPrefix())
	if err != nil {
		tb.Fatalf("list assignments: %v", err)
	}
	out := make(map[string]cluster.Assignment, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		a, err := cluster.Decode[cluster.Assignment](kv.Value)
		if err != nil {
			tb.Fatalf("assignment %s: %v", kv.Key, err)
		}
		out[a.Stream] = a
	}
	return out
}

// checkLedgers reads every stream from its owner (a few at once) and checks
// it against the stream's ledger, waiting (bounded) for an owner that has
// not caught up with its confirms in its reads yet.
func checkLedgers(tb testing.TB, c *Cluster, streams []string, asg map[string]cluster.Assignment, ledgers map[string]*ledger.Ledger) {
	tb.Helper()
	work := make(chan string)
	errs := make(chan error, len(streams))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for s := range work {
				errs <- checkLedger(c, asg[s].Owner, s, ledgers[s])
			}
		})
	}
	for _, s := range streams {
		work <- s
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			tb.Error(err)
		}
	}
}

func checkLedger(c *Cluster, node, stream string, l *ledger.Ledger) error {
	deadline := time.Now().Add(massWithin)
	for {
		recs, err := c.ReadAll(node, stream)
		if err == nil {
			found, problems := l.Verify(recs)
			if found == l.Count() && len(problems) == 0 {
				return nil
			}
			err = fmt.Errorf("%d of %d confirmed records found; %v", found, l.Count(), problems)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s on %s: %w", stream, node, err)
		}
		select {
		case <-c.Ctx().Done():
			return c.Ctx().Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
