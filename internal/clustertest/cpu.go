package clustertest

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// CPUPerOp starts counting the CPU time the process spends (user and
// system, every goroutine, an embedded etcd's too); the function it
// returns, called after a benchmark's loop, reports it per iteration as
// cpu-ns/op. On a machine shared with other work the wall-clock ns/op
// measures the wait for a core as much as the work; the CPU time does not
// (docs/limits.md, "Operations").
func CPUPerOp(b *testing.B) (stop func()) {
	b.Helper()
	start := ProcessCPU(b)
	return func() {
		b.ReportMetric(float64(ProcessCPU(b)-start)/float64(b.N), "cpu-ns/op")
	}
}

// ProcessCPU is the CPU time the process has spent so far, user and
// system, for a benchmark that reports it per unit of its own.
func ProcessCPU(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ReadEach is a benchmark's loop over reads of many keys from concurrent
// callers, as a mass failover's reads come: each iteration calls read once
// for every name, at most callers at once, and fails the benchmark on an
// error. It reports the wall time (ns/stream) and the process's CPU time
// (cpu-ns/stream) per name and, with calls, the requests the reads sent
// per name (txns/stream: the caller counts them).
func ReadEach(b *testing.B, names []string, callers int, calls *atomic.Int64, read func(ctx context.Context, name string) error) {
	b.Helper()
	cpu0 := ProcessCPU(b)
	b.ResetTimer()
	for range b.N {
		sem := make(chan struct{}, callers)
		var wg sync.WaitGroup
		for _, name := range names {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := read(context.Background(), name); err != nil {
					b.Errorf("%s: %v", name, err)
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	n := float64(b.N * len(names))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/stream")
	b.ReportMetric(float64((ProcessCPU(b)-cpu0).Nanoseconds())/n, "cpu-ns/stream")
	if calls != nil {
		b.ReportMetric(float64(calls.Load())/n, "txns/stream")
	}
}
