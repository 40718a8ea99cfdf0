package clustertest

import (
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
