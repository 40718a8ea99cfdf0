package storage

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Log reads that go to the engine run logReadSlots at a time, so the
// follows of a rejoin cannot begin thousands of read transactions at once;
// a read the tail cache answers takes no slot, so the follows a failover
// starts near the tail do not queue behind them (docs/limits.md, "A rejoin
// is paced").
func TestLogReadsAreBounded(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer func() { _ = db.Close() }()
	s := ownerStream(t, db, "s", 1)
	appended := mustAppend(t, s, 1, recs("a", 10))

	// Readers that take every slot and more, each holding its slot until
	// release.
	release := make(chan struct{})
	var running, most atomic.Int64
	var wg sync.WaitGroup
	for range 4 * logReadSlots {
		wg.Go(func() {
			err := db.readLog(func(*engine.Txn) error {
				n := running.Add(1)
				for was := most.Load(); n > was && !most.CompareAndSwap(was, n); was = most.Load() {
				}
				<-release
				running.Add(-1)
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	clustertest.Eventually(t, 10*time.Second, "every log read slot taken", func() bool { return running.Load() >= logReadSlots })

	// The tail cache answers without a slot.
	got := make(chan []Record, 1)
	go func() {
		rs, err := s.Read(5, 5, 0)
		if err != nil {
			t.Error(err)
		}
		got <- rs
	}()
	select {
	case rs := <-got:
		sameRecords(t, "read from the tail cache", rs, appended[5:])
	case <-time.After(10 * time.Second):
		t.Fatal("a read the tail cache answers waited for a log read slot")
	}

	// A record's chain is read from the engine: it waits for a slot.
	type chainRead struct {
		chain uint64
		err   error
	}
	chained := make(chan chainRead, 1)
	go func() {
		c, err := s.WrittenChainAt(5)
		chained <- chainRead{c, err}
	}()
	// Parked on the slots' channel (readLog, under the chain read): it
	// has not run, and must not until a slot frees.
	clustertest.WaitParked(t, "chan send", "storage.(*Stream).recordChain")
	select {
	case r := <-chained:
		t.Fatalf("a chain read ran with every log read slot taken: %+v", r)
	default:
	}
	if n := running.Load(); n != logReadSlots {
		t.Fatalf("%d log reads running with every slot taken, want %d", n, logReadSlots)
	}
	close(release)
	wg.Wait()
	select {
	case r := <-chained:
		if r.err != nil || r.chain != appended[4].Chain {
			t.Fatalf("chain at 5: %x, %v; want %x", r.chain, r.err, appended[4].Chain)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the chain read did not run once the slots were free")
	}
	if n := most.Load(); n != logReadSlots {
		t.Fatalf("at most %d log reads ran at once, want %d", n, logReadSlots)
	}
}
