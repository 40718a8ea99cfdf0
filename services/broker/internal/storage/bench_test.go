package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAppend measures durable publish on one stream: 1 KiB records,
// concurrent publishers, batches of 1 and 64. One op is one Append call.
func BenchmarkAppend(b *testing.B) {
	for _, publishers := range []int{1, 16, 256} {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("publishers=%d/batch=%d", publishers, batch), func(b *testing.B) {
				benchAppend(b, publishers, batch, noIDs)
			})
		}
	}
}

// BenchmarkAppendProducerIDs is BenchmarkAppend's 256-publisher shape with
// and without idempotent publish: with ids=true every publisher is a
// producer stamping sequences 1, 2, 3, ... as the Go client does, so each
// Append also checks and updates the producer table (and writes its
// checkpoints); ids=noseq stamps the producer id without a sequence, which
// stores the same bytes but skips the table. The cost of idempotent publish is the
// ratio of true to false; noseq tells the bigger records from the table.
func BenchmarkAppendProducerIDs(b *testing.B) {
	for _, batch := range []int{1, 64} {
		for _, ids := range []idMode{noIDs, sequencedIDs, unsequencedIDs} {
			b.Run(fmt.Sprintf("publishers=256/batch=%d/ids=%v", batch, ids), func(b *testing.B) {
				benchAppend(b, 256, batch, ids)
			})
		}
	}
}

// idMode is what benchAppend's records carry besides the payload.
type idMode int

const (
	noIDs idMode = iota
	sequencedIDs
	unsequencedIDs
)

func (m idMode) String() string { return [...]string{"false", "true", "noseq"}[m] }

func benchAppend(b *testing.B, publishers, batch int, ids idMode) {
	db, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := db.Open("bench")
	if err != nil {
		b.Fatal(err)
	}
	if err := s.AdvanceEpoch(context.Background(), 1); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	b.SetBytes(int64(batch * len(payload)))
	var (
		next      atomic.Int64
		mu        sync.Mutex
		latencies []time.Duration
		wg        sync.WaitGroup
		failed    atomic.Value
	)
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs := make([]Record, batch)
			for i := range rs {
				rs[i].Payload = payload
			}
			producer, seq := fmt.Sprintf("bench-producer-%d", p), uint64(0)
			var mine []time.Duration
			for next.Add(1) <= int64(b.N) {
				if ids != noIDs {
					for i := range rs {
						seq++
						rs[i].ProducerID = producer
						if ids == sequencedIDs {
							rs[i].Sequence = seq // 0 (noseq) means none
						}
					}
				}
				t0 := time.Now()
				if _, err := s.Append(context.Background(), 1, rs); err != nil {
					failed.Store(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "records/s")
	// CPU per record (user + system, the whole process: Badger's
	// compactions included) is steadier than throughput, which the disk's
	// fsync latency dominates.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*batch), "cpu-ns/record")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	if rss := peakRSSMiB(); rss > 0 {
		b.ReportMetric(rss, "peak-rss-MiB")
	}
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSSMiB is the process's peak resident set (VmHWM), 0 if unknown.
func peakRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err == nil {
				return kb / 1024
			}
		}
	}
	return 0
}

// BenchmarkFsyncFloor is the disk's physical limit for a durable write: a
// 4 KiB append plus fdatasync, in a loop.
func BenchmarkFsyncFloor(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "floor"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

// BenchmarkProducerTable is the CPU the producer table adds to an owner's
// append, without the I/O: classify and apply for 256 producers publishing
// in turn with the default limits. One op is one record.
func BenchmarkProducerTable(b *testing.B) {
	for _, batch := range []int{1, 64} {
		b.Run(fmt.Sprintf("producers=256/batch=%d", batch), func(b *testing.B) {
			t := newProducerTable(DefaultMaxProducers, DefaultProducerWindow, DefaultProducerBatches)
			rs := make([][]Record, 256)
			for p := range rs {
				rs[p] = make([]Record, batch)
				for i := range rs[p] {
					rs[p][i].ProducerID = fmt.Sprintf("bench-producer-%d", p)
				}
			}
			seqs := make([]uint64, 256)
			off := uint64(0)
			b.ResetTimer()
			for n := 0; n < b.N; n += batch {
				p := (n / batch) % 256
				batchRecs := rs[p]
				for i := range batchRecs {
					seqs[p]++
					batchRecs[i].Sequence, batchRecs[i].Offset = seqs[p], off
					off++
				}
				if dups, err := t.classify(batchRecs); err != nil || len(dups) != 0 {
					b.Fatalf("classify: %v, %d duplicates", err, len(dups))
				}
				for i := range batchRecs {
					t.apply(batchRecs[i].ProducerID, batchRecs[i].Sequence, batchRecs[i].Offset)
				}
			}
		})
	}
}

// BenchmarkChain measures the chain over a 1 KiB record, which every copy
// computes for every record it stores.
func BenchmarkChain(b *testing.B) {
	rec := Record{Offset: 7, Epoch: 2, PublishTime: time.Unix(1, 2), ProducerID: "p-1", Sequence: 9, Payload: make([]byte, 1024)}
	b.SetBytes(int64(len(rec.Payload)))
	var c uint64
	for b.Loop() {
		c = Chain(c, &rec)
	}
}
