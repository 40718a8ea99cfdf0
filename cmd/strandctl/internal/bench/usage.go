package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/procfs"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
)

// What the cluster costs at rest and under load: the services' CPU and the
// brokers' memory from /proc of the processes the bench started, and the
// rate at which etcd's revision moves (every put, delete and transaction
// that writes moves it: heartbeats, leases, assignments), over an idle
// window before publishing and over the measured window.

// procTime is one process's CPU time at one instant; pid tells a restarted
// process (the killed owner) from the one sampled before.
type procTime struct {
	pid int
	cpu time.Duration
}

// cpuSample is the CPU time of the cluster's processes, by process name
// (controller, recoverer, broker node), at one instant.
type cpuSample struct {
	at    time.Time
	procs map[string]procTime
}

// processes lists the bench's own cluster's processes by name with their
// current pids; nil for a cluster the bench did not start.
func (r *runner) processes() map[string]int {
	if r.cl == nil {
		return nil
	}
	info := r.cl.Info()
	out := map[string]int{devcluster.Controller: info.ControllerPID, devcluster.Recoverer: info.RecovererPID}
	for _, b := range info.Brokers {
		out[b.Node] = b.PID
	}
	return out
}

// sampleCPU reads every process's CPU time; a process that cannot be read
// (not running) is left out. ok is false without a cluster of the bench's
// own.
func (r *runner) sampleCPU() (cpuSample, bool) {
	procs := r.processes()
	if procs == nil {
		return cpuSample{}, false
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return cpuSample{}, false
	}
	s := cpuSample{at: time.Now(), procs: map[string]procTime{}}
	for name, pid := range procs {
		if cpu, ok := procCPU(fs, pid); ok {
			s.procs[name] = procTime{pid: pid, cpu: cpu}
		}
	}
	return s, true
}

// CPUPercent is each process's CPU use between two samples, in percent of
// one core. A process missing from either sample, or with another pid in
// the second (it was restarted), is left out: its CPU time did not run the
// whole window.
func CPUPercent(before, after cpuSample) map[string]float64 {
	wall := after.at.Sub(before.at)
	if wall <= 0 {
		return nil
	}
	out := map[string]float64{}
	for name, a := range after.procs {
		b, ok := before.procs[name]
		if !ok || b.pid != a.pid || a.cpu < b.cpu {
			continue
		}
		out[name] = round(float64(a.cpu-b.cpu) / float64(wall) * 100)
	}
	return out
}

// ServiceCPU is the CPU figures the result reports: the controller's, the
// recoverer's, and the mean over the brokers that ran the whole window
// (the killed owner does not).
type ServiceCPU struct {
	Controller, Recoverer, Broker *float64
}

// SummarizeCPU picks the services' figures out of CPUPercent's, leaving out
// the brokers in skip.
func SummarizeCPU(pct map[string]float64, brokers []string, skip string) ServiceCPU {
	var s ServiceCPU
	if v, ok := pct[devcluster.Controller]; ok {
		s.Controller = &v
	}
	if v, ok := pct[devcluster.Recoverer]; ok {
		s.Recoverer = &v
	}
	var sum float64
	n := 0
	for _, b := range brokers {
		if v, ok := pct[b]; ok && b != skip {
			sum += v
			n++
		}
	}
	if n > 0 {
		mean := round(sum / float64(n))
		s.Broker = &mean
	}
	return s
}

// brokerNodes lists the bench's own cluster's broker nodes.
func (r *runner) brokerNodes() []string {
	if r.cl == nil {
		return nil
	}
	var out []string
	for _, b := range r.cl.Info().Brokers {
		out = append(out, b.Node)
	}
	return out
}

// memWatch samples the brokers' resident anonymous memory (heap and
// stacks, samplePeakRSS's figure) until stopped, keeping the largest.
type memWatch struct {
	peak   atomic.Int64 // kB
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// memSampleEvery is how often memWatch samples: RssAnon is the memory now,
// not a high-water mark, so the peak is only as fine as the sampling.
const memSampleEvery = 250 * time.Millisecond

// watchMemory starts a memWatch; nil without a cluster of the bench's own.
func (r *runner) watchMemory(ctx context.Context) *memWatch {
	if r.cl == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &memWatch{cancel: cancel}
	w.wg.Go(func() {
		t := time.NewTicker(memSampleEvery)
		defer t.Stop()
		for {
			if fs, err := procfs.NewDefaultFS(); err == nil {
				for _, b := range r.cl.Info().Brokers {
					if _, anon, ok := procMemoryKB(fs, b.PID); ok {
						storeMax(&w.peak, anon)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return w
}

// stop ends the sampling and returns the peak in MiB; nil for a nil watch
// or when no broker could be read.
func (w *memWatch) stop() *float64 {
	if w == nil {
		return nil
	}
	w.cancel()
	w.wg.Wait()
	kb := w.peak.Load()
	if kb == 0 {
		return nil
	}
	mb := round(float64(kb) / 1024)
	return &mb
}

// etcdMark is etcd's revision and database size at one instant.
type etcdMark struct {
	at  time.Time
	rev int64
	db  int64
}

// errNoEtcd is returned when the bench has no etcd to read.
var errNoEtcd = errors.New("bench: no etcd endpoint")

// etcdStatus reads etcd's status from its first endpoint.
func etcdStatus(ctx context.Context, cli *clientv3.Client) (etcdMark, error) {
	if cli == nil || len(cli.Endpoints()) == 0 {
		return etcdMark{}, errNoEtcd
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		return etcdMark{}, fmt.Errorf("bench: etcd status: %w", err)
	}
	return etcdMark{at: time.Now(), rev: st.Header.Revision, db: st.DbSize}, nil
}

// RevisionsPerS is how fast etcd's revision moved between two marks.
func RevisionsPerS(before, after etcdMark) (float64, bool) {
	wall := after.at.Sub(before.at).Seconds()
	if wall <= 0 || after.rev < before.rev {
		return 0, false
	}
	return round(float64(after.rev-before.rev) / wall), true
}

// usageWindow measures one window: CPU, broker memory and etcd revisions
// from its start to its end.
type usageWindow struct {
	cpu    cpuSample
	cpuOK  bool
	etcd   etcdMark
	etcdOK bool
	mem    *memWatch
}

// usage is what a window measured.
type usage struct {
	cpu         ServiceCPU
	peakAnonMB  *float64
	revisionsPS *float64
}

// startUsage starts measuring a window.
func (r *runner) startUsage(ctx context.Context) *usageWindow {
	w := &usageWindow{mem: r.watchMemory(ctx)}
	w.cpu, w.cpuOK = r.sampleCPU()
	m, err := etcdStatus(ctx, r.etcd)
	w.etcd, w.etcdOK = m, err == nil
	return w
}

// end ends the window; skip is a broker left out of the brokers' CPU mean
// (the killed owner, or "").
func (w *usageWindow) end(ctx context.Context, r *runner, skip string) usage {
	var u usage
	u.peakAnonMB = w.mem.stop()
	if after, ok := r.sampleCPU(); ok && w.cpuOK {
		u.cpu = SummarizeCPU(CPUPercent(w.cpu, after), r.brokerNodes(), skip)
	}
	if w.etcdOK {
		if after, err := etcdStatus(ctx, r.etcd); err == nil {
			if v, ok := RevisionsPerS(w.etcd, after); ok {
				u.revisionsPS = &v
			}
		}
	}
	return u
}
