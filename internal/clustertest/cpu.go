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
	start := processCPU(b)
	return func() {
		b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
