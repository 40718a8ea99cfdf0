package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/cluster"
)

// keyWatch records the changes of a stream's recovery and assignment keys
// with the time the bench received each, for the detect and commit phases.
type keyWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	events []watchEvent
	err    error
}

// watchEvent is a KeyEvent before the start of publishing is known.
type watchEvent struct {
	at time.Time
	ev KeyEvent
}

// watchKeys starts watching the stream's recovery and assignment keys from
// the current revision, and returns once etcd has created both watches, so
// nothing after the return is missed.
func watchKeys(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, stream string) (*keyWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &keyWatch{cancel: cancel}
	get, err := cli.Get(ctx, schema.AssignmentKey(stream))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("bench: read the assignment before the watch: %w", err)
	}
	from := get.Header.Revision + 1
	keys := []string{schema.RecoveryKey(stream), schema.AssignmentKey(stream)}
	created := make(chan error, len(keys))
	for i, key := range keys {
		wch := cli.Watch(ctx, key, clientv3.WithRev(from), clientv3.WithCreatedNotify())
		w.wg.Go(func() { w.consume(wch, i == 0, created) })
	}
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for range keys {
		select {
		case err := <-created:
			if err != nil {
				w.stop()
				return nil, err
			}
		case <-timer.C:
			w.stop()
			return nil, fmt.Errorf("bench: etcd watch on %v not created within 10s", keys)
		}
	}
	return w, nil
}

func (w *keyWatch) consume(wch clientv3.WatchChan, recovery bool, created chan<- error) {
	first := true
	for resp := range wch {
		now := time.Now()
		if first {
			first = false
			if err := resp.Err(); err != nil {
				created <- fmt.Errorf("bench: etcd watch: %w", err)
				return
			}
			created <- nil
			if resp.Created {
				continue
			}
		}
		if err := resp.Err(); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		for _, e := range resp.Events {
			ev := KeyEvent{Rev: e.Kv.ModRevision}
			if e.Type == clientv3.EventTypePut {
				if recovery {
					if v, err := cluster.Decode[cluster.Recovery](e.Kv.Value); err == nil {
						ev.Recovery = &v
					}
				} else if v, err := cluster.Decode[cluster.Assignment](e.Kv.Value); err == nil {
					ev.Assignment = &v
				}
			}
			w.mu.Lock()
			w.events = append(w.events, watchEvent{at: now, ev: ev})
			w.mu.Unlock()
		}
	}
}

// stop ends the watch and waits for its goroutines.
func (w *keyWatch) stop() {
	w.cancel()
	w.wg.Wait()
}

// Events returns the events received so far, timed from start, and the
// error that broke the watch, if one did.
func (w *keyWatch) Events(start time.Time) ([]KeyEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]KeyEvent, len(w.events))
	for i, e := range w.events {
		out[i] = e.ev
		out[i].At = e.at.Sub(start)
	}
	return out, w.err
}

// readPhaseLogs reads the phase lines of the controller's, the recoverer's
// and every broker's log in the cluster's log dir.
func readPhaseLogs(cl *devcluster.Cluster) (map[string][]LogLine, []string) {
	procs := []string{devcluster.Controller, devcluster.Recoverer}
	for _, b := range cl.Info().Brokers {
		procs = append(procs, b.Node)
	}
	out := make(map[string][]LogLine, len(procs))
	var notes []string
	for _, p := range procs {
		path := filepath.Join(cl.Dir(), "logs", p+".log")
		f, err := os.Open(path)
		if err != nil {
			notes = append(notes, fmt.Sprintf("log of %s: %v", p, err))
			continue
		}
		lines, err := ReadLogLines(f, PhaseMessages)
		_ = f.Close()
		if err != nil {
			notes = append(notes, fmt.Sprintf("log of %s: %v", p, err))
		}
		out[p] = lines
	}
	return out, notes
}

// streamsWatch records, for every stream the killed broker owned, when the
// bench first saw its pending recovery recorded and its new assignment (an
// epoch above the one at the kill) committed: the failover of all of them
// split where the phase stream's is split by keyWatch, so a mass failover
// shows whether the recoveries or the clients finding the new owners take
// the time (MassFailover).
type streamsWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	recorded map[int]time.Time
	assigned map[int]time.Time
	err      error
}

// watchStreams watches the recoveries and the assignments dirs from the
// current revision for the streams in epochs (index → epoch at the kill),
// named by index, and returns once etcd has created both watches.
func watchStreams(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, index map[string]int, epochs map[int]uint64) (*streamsWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &streamsWatch{cancel: cancel, recorded: map[int]time.Time{}, assigned: map[int]time.Time{}}
	get, err := cli.Get(ctx, schema.AssignmentsDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		cancel()
		return nil, fmt.Errorf("bench: read the revision before the streams' watch: %w", err)
	}
	from := get.Header.Revision + 1
	dirs := []string{schema.RecoveriesDir(), schema.AssignmentsDir()}
	created := make(chan error, len(dirs))
	for i, dir := range dirs {
		wch := cli.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithCreatedNotify())
		w.wg.Go(func() { w.consume(wch, dir, i == 0, index, epochs, created) })
	}
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for range dirs {
		select {
		case err := <-created:
			if err != nil {
				w.stop()
				return nil, err
			}
		case <-timer.C:
			w.stop()
			return nil, fmt.Errorf("bench: etcd watch on %v not created within 10s", dirs)
		}
	}
	return w, nil
}

func (w *streamsWatch) consume(wch clientv3.WatchChan, dir string, recovery bool, index map[string]int, epochs map[int]uint64, created chan<- error) {
	first := true
	for resp := range wch {
		now := time.Now()
		if first {
			first = false
			if err := resp.Err(); err != nil {
				created <- fmt.Errorf("bench: etcd watch: %w", err)
				return
			}
			created <- nil
			if resp.Created {
				continue
			}
		}
		if err := resp.Err(); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		for _, e := range resp.Events {
			if e.Type != clientv3.EventTypePut {
				continue
			}
			name, err := cluster.NameIn(dir, string(e.Kv.Key))
			if err != nil {
				continue
			}
			i, ok := index[name]
			if !ok {
				continue
			}
			epoch, killed := epochs[i]
			if !killed {
				continue
			}
			seen := w.recorded
			if !recovery {
				// Only an epoch above the one at the kill is the new
				// assignment (a follower list change keeps the epoch).
				a, err := cluster.Decode[cluster.Assignment](e.Kv.Value)
				if err != nil || a.Epoch <= epoch {
					continue
				}
				seen = w.assigned
			}
			w.mu.Lock()
			if _, dup := seen[i]; !dup {
				seen[i] = now
			}
			w.mu.Unlock()
		}
	}
}

// splitAssigned splits streams into those whose new assignment the watch
// has seen and the rest, each in the order given.
func (w *streamsWatch) splitAssigned(streams []int) (assigned, rest []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, i := range streams {
		if _, ok := w.assigned[i]; ok {
			assigned = append(assigned, i)
		} else {
			rest = append(rest, i)
		}
	}
	return assigned, rest
}

// stop ends the watch and waits for its goroutines.
func (w *streamsWatch) stop() {
	w.cancel()
	w.wg.Wait()
}

// Seen returns, timed from start, when each stream's pending recovery was
// recorded and its new assignment committed (as the bench received them),
// and the error that broke the watch, if one did.
func (w *streamsWatch) Seen(start time.Time) (recorded, assigned map[int]time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	since := func(m map[int]time.Time) map[int]time.Duration {
		out := make(map[int]time.Duration, len(m))
		for i, at := range m {
			out[i] = at.Sub(start)
		}
		return out
	}
	return since(w.recorded), since(w.assigned), w.err
}
