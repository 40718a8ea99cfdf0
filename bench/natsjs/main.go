// Command natsjs is the publisher of the NATS JetStream comparison bench
// (run.sh): a JetStream publish benchmark client.
//
// It (re)creates a file-storage R3 stream "BENCH" on subjects "bench.>",
// publishes 1 KiB messages for -warmup + -duration with at most -window
// messages in flight, and prints one JSON line with throughput and latency
// percentiles computed only over messages acked inside the measured window
// (i.e. after the warmup, before the end of the run).
//
// Modes:
//
//	acb  - jetstream.PublishMsgAsync, WithPublishAsyncMaxPending(window), and a
//	       WithPublishAsyncAckHandler callback that computes latency from a
//	       sync.Map of send times keyed by a message header id.
//	sync - window goroutines, each calling js.PublishMsg in a loop.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	streamName = "BENCH"
	idHeader   = "Bench-Id"
)

type result struct {
	Mode      string  `json:"mode"`
	MsgsPerS  float64 `json:"msgs_per_s"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	Count     int     `json:"count"`
	Errors    int64   `json:"errors"`
	Window    int     `json:"window"`
	SizeBytes int     `json:"size_bytes"`
	DurationS float64 `json:"duration_s"`
	WarmupS   float64 `json:"warmup_s"`
}

// recorder collects latencies of acks that land inside [start, end).
type recorder struct {
	mu    sync.Mutex
	start time.Time
	end   time.Time
	lats  []time.Duration
}

func (r *recorder) add(ackAt time.Time, lat time.Duration) {
	if ackAt.Before(r.start) || !ackAt.Before(r.end) {
		return
	}
	r.mu.Lock()
	r.lats = append(r.lats, lat)
	r.mu.Unlock()
}

func (r *recorder) addBatch(ls []time.Duration) {
	r.mu.Lock()
	r.lats = append(r.lats, ls...)
	r.mu.Unlock()
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "pub: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	var (
		urls     = flag.String("urls", "nats://127.0.0.1:14222,nats://127.0.0.1:14223,nats://127.0.0.1:14224", "comma-separated server URLs")
		mode     = flag.String("mode", "acb", "acb | sync")
		duration = flag.Duration("duration", 10*time.Second, "measured window")
		warmup   = flag.Duration("warmup", 2*time.Second, "warmup before the measured window")
		window   = flag.Int("window", 256, "max messages in flight")
		size     = flag.Int("size", 1024, "payload bytes")
		setupTO  = flag.Duration("setup-timeout", 30*time.Second, "deadline for connecting and creating the stream")
		drainTO  = flag.Duration("drain-timeout", 10*time.Second, "deadline for outstanding acks after the window")
		pubTO    = flag.Duration("pub-timeout", 10*time.Second, "per-message ack timeout")
		replicas = flag.Int("replicas", 3, "stream replicas")
		subject  = flag.String("subject", "bench.x", "publish subject (must match bench.>)")
	)
	flag.Parse()
	if *mode != "acb" && *mode != "sync" {
		fatalf("unknown mode %q (want acb or sync)", *mode)
	}
	if *window < 1 {
		fatalf("window must be >= 1")
	}

	nc, err := connect(*urls, *setupTO)
	if err != nil {
		fatalf("connect: %v", err)
	}
	defer nc.Close()

	// The JetStream context for stream management. The acb mode builds its
	// own context with the async publish options.
	js, err := jetstream.New(nc)
	if err != nil {
		fatalf("jetstream: %v", err)
	}
	if err := setupStream(js, *replicas, *setupTO); err != nil {
		fatalf("stream setup: %v", err)
	}

	payload := make([]byte, *size)
	rand.New(rand.NewSource(1)).Read(payload)

	var res result
	switch *mode {
	case "acb":
		res = runACB(nc, payload, *subject, *window, *warmup, *duration, *drainTO, *pubTO)
	case "sync":
		res = runSync(js, payload, *subject, *window, *warmup, *duration, *pubTO)
	}
	res.Window = *window
	res.SizeBytes = *size
	res.DurationS = duration.Seconds()
	res.WarmupS = warmup.Seconds()
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}

func connect(urls string, timeout time.Duration) (*nats.Conn, error) {
	deadline := time.Now().Add(timeout)
	for {
		nc, err := nats.Connect(urls,
			nats.Name("natsbench-pub"),
			nats.Timeout(2*time.Second),
			nats.MaxReconnects(-1),
			nats.ReconnectBufSize(64*1024*1024),
		)
		if err == nil {
			return nc, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// setupStream deletes any existing BENCH stream and creates a fresh one,
// retrying until the deadline (a young cluster may still be settling), then
// waits until the stream has a leader and all replicas are current.
func setupStream(js jetstream.JetStream, replicas int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cfg := jetstream.StreamConfig{
		Name:      streamName,
		Subjects:  []string{"bench.>"},
		Storage:   jetstream.FileStorage,
		Replicas:  replicas,
		Retention: jetstream.LimitsPolicy,
		Discard:   jetstream.DiscardOld,
	}
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := js.DeleteStream(ctx, streamName)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			cancel()
			lastErr = fmt.Errorf("delete: %w", err)
			time.Sleep(250 * time.Millisecond)
			continue
		}
		_, err = js.CreateStream(ctx, cfg)
		cancel()
		if err != nil {
			lastErr = fmt.Errorf("create: %w", err)
			time.Sleep(250 * time.Millisecond)
			continue
		}
		lastErr = nil
		break
	}
	if lastErr != nil {
		return lastErr
	}
	// Wait for a stream leader with all followers current.
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := js.Stream(ctx, streamName)
		if err == nil {
			var info *jetstream.StreamInfo
			info, err = s.Info(ctx)
			if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
				cur := 0
				for _, p := range info.Cluster.Replicas {
					if p.Current {
						cur++
					}
				}
				if cur >= replicas-1 {
					cancel()
					return nil
				}
			}
		}
		cancel()
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	if lastErr == nil {
		lastErr = errors.New("stream leader/replicas not ready")
	}
	return fmt.Errorf("waiting for stream leader: %w", lastErr)
}

// runACB: async publish with an ack callback. A semaphore of `window` slots
// is taken before the send time is stamped, so the measured latency is
// send->ack and does not include time spent waiting for a free slot. The
// library's own max-pending is set to the same window; since the library
// removes a future from its pending set before invoking the ack callback
// (which is where our slot is released), the library never stalls us.
func runACB(nc *nats.Conn, payload []byte, subj string, window int,
	warmup, duration, drainTO, pubTO time.Duration) result {

	var (
		sendTimes sync.Map // id string -> time.Time
		sem       = make(chan struct{}, window)
		errCount  atomic.Int64
		rec       = &recorder{}
	)

	ackCB := func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
		now := time.Now()
		id := m.Header.Get(idHeader)
		if v, ok := sendTimes.LoadAndDelete(id); ok {
			rec.add(now, now.Sub(v.(time.Time)))
		}
		<-sem
	}
	errCB := func(_ jetstream.JetStream, m *nats.Msg, err error) {
		errCount.Add(1)
		sendTimes.Delete(m.Header.Get(idHeader))
		<-sem
	}

	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(window),
		jetstream.WithPublishAsyncAckHandler(ackCB),
		jetstream.WithPublishAsyncErrHandler(errCB),
		jetstream.WithPublishAsyncTimeout(pubTO),
	)
	if err != nil {
		fatalf("jetstream (async): %v", err)
	}

	begin := time.Now()
	rec.start = begin.Add(warmup)
	rec.end = rec.start.Add(duration)
	stop := rec.end

	stopT := time.NewTimer(time.Until(stop))
	defer stopT.Stop()
	var seq uint64
	for time.Now().Before(stop) {
		select {
		case sem <- struct{}{}:
		case <-stopT.C:
			goto done
		}
		seq++
		id := strconv.FormatUint(seq, 10)
		m := &nats.Msg{Subject: subj, Data: payload, Header: nats.Header{idHeader: []string{id}}}
		sendTimes.Store(id, time.Now())
		// Stall wait well above any plausible ack latency: we never expect
		// to stall (see above), but if we do, don't fail spuriously.
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(pubTO)); err != nil {
			errCount.Add(1)
			sendTimes.Delete(id)
			<-sem
		}
	}
done:
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(drainTO):
		fmt.Fprintf(os.Stderr, "pub: %d acks still outstanding after %v\n", js.PublishAsyncPending(), drainTO)
	}
	return finish("acb", rec, duration, errCount.Load())
}

// runSync: `window` goroutines each doing a synchronous publish in a loop.
func runSync(js jetstream.JetStream, payload []byte, subj string, window int,
	warmup, duration, pubTO time.Duration) result {

	var (
		errCount atomic.Int64
		rec      = &recorder{}
		wg       sync.WaitGroup
		seq      atomic.Uint64
	)
	begin := time.Now()
	rec.start = begin.Add(warmup)
	rec.end = rec.start.Add(duration)
	stop := rec.end

	for w := 0; w < window; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(stop) {
				id := strconv.FormatUint(seq.Add(1), 10)
				m := &nats.Msg{Subject: subj, Data: payload, Header: nats.Header{idHeader: []string{id}}}
				ctx, cancel := context.WithTimeout(context.Background(), pubTO)
				t0 := time.Now()
				_, err := js.PublishMsg(ctx, m)
				t1 := time.Now()
				cancel()
				if err != nil {
					errCount.Add(1)
					continue
				}
				if !t1.Before(rec.start) && t1.Before(rec.end) {
					local = append(local, t1.Sub(t0))
				}
			}
			rec.addBatch(local)
		}()
	}
	wg.Wait()
	return finish("sync", rec, duration, errCount.Load())
}

func finish(mode string, rec *recorder, duration time.Duration, errs int64) result {
	rec.mu.Lock()
	lats := rec.lats
	rec.mu.Unlock()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	return result{
		Mode:     mode,
		MsgsPerS: round(float64(len(lats))/duration.Seconds(), 1),
		P50Ms:    round(pct(lats, 0.50), 3),
		P99Ms:    round(pct(lats, 0.99), 3),
		Count:    len(lats),
		Errors:   errs,
	}
}

// pct returns the nearest-rank percentile in milliseconds.
func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	idx := int(math.Ceil(p*float64(len(sorted)))) - 1
	if idx < 0 {
		idx = 0
	}
	if idx >= len(sorted) {
		idx = len(sorted) - 1
	}
	return float64(sorted[idx]) / float64(time.Millisecond)
}

func round(v float64, places int) float64 {
	f := math.Pow(10, float64(places))
	return math.Round(v*f) / f
}
