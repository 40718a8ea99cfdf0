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
