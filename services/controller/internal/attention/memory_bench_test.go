package attention

import (
	"fmt"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// BenchmarkObserve is the cost a liveness pass adds to keep the memory and
// count under-replicated streams: 10,000 streams of three copies on ten
// brokers, one of them down.
func BenchmarkObserve(b *testing.B) {
	snaps := observeSnapshots()
	m := NewMemory()
	now := time.Now()
	b.ReportAllocs()
	stop := clustertest.CPUPerOp(b)
	i := 0
	for b.Loop() {
		i++
		if sum := m.Observe(snaps[i%2], now); sum.UnderReplicated != 3000 {
			b.Fatalf("%d under-replicated, want 3000", sum.UnderReplicated)
		}
	}
	stop()
}

// BenchmarkObserveChanged is the same with the pass told the one stream
// that changed, as the liveness loop tells it while streams are created
// or heartbeats arrive one shard at a time.
func BenchmarkObserveChanged(b *testing.B) {
	snaps := observeSnapshots()
	m := NewMemory()
	now := time.Now()
	m.Observe(snaps[1], now)
	changed := []string{"s00042"}
	b.ReportAllocs()
	stop := clustertest.CPUPerOp(b)
	i := 0
	for b.Loop() {
		i++
		if sum := m.ObserveChanged(snaps[i%2], changed, false, now); sum.UnderReplicated != 3000 {
			b.Fatalf("%d under-replicated, want 3000", sum.UnderReplicated)
		}
	}
	stop()
}

// observeSnapshots is 10,000 streams of three copies on ten brokers, one of
// them down, in two snapshots taken in turn, as after every change: the
// same one again is not judged again.
func observeSnapshots() [2]*state.Snapshot {
	nodes := make([]string, 10)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("b%d", i)
	}
	bld := state.Build().Live(nodes[1:]...)
	for i := range 10_000 {
		a := cluster.Assignment{Stream: fmt.Sprintf("s%05d", i), Epoch: 1, Owner: nodes[i%10], Followers: []string{nodes[(i+1)%10], nodes[(i+2)%10]}}
		for j, m := range a.Members() {
			role := cluster.RoleFollower
			if j == 0 {
				role = cluster.RoleOwner
			}
			bld.Tails(m, a.Stream, cluster.CopyTails{Epoch: 1, Role: role, RecordTail: 100, ConfirmWatermark: 100})
		}
		bld.Stream(a)
	}
	s := bld.Snapshot()
	delete(s.Heartbeats, nodes[0])
	other := *s
	return [2]*state.Snapshot{s, &other}
}
