package app_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/recoverer/app"
)

// putRecoveries stores n streams owned by b1 and followed by b2 and b3,
// each with a pending recovery from epoch 3, and returns their names.
func putRecoveries(t *testing.T, e *env, n int) []string {
	t.Helper()
	var streams []string
	for i := range n {
		s := fmt.Sprintf("orders-%02d", i)
		e.put(t, e.schema.AssignmentKey(s), cluster.Assignment{Stream: s, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority})
		e.put(t, e.schema.RecoveryKey(s), cluster.Recovery{
			Stream: s, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t-" + s,
			OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2", Reason: "owner lease expired", Created: time.Now(),
		})
		streams = append(streams, s)
	}
	return streams
}

// startThree starts and registers fake brokers b1 (in b1Mode), b2 and b3
// (answering with record tail 10), each serving SealMany when many is set.
func startThree(t *testing.T, e *env, b1Mode sealMode, many bool) (b1, b2, b3 *fakeBroker) {
	t.Helper()
	b1 = startFakeBroker(t, "b1", b1Mode, 0, 0)
	if b1Mode == answer {
		b1.set(answer, 10, 0)
	}
	b2 = startFakeBroker(t, "b2", answer, 10, 0)
	b3 = startFakeBroker(t, "b3", answer, 10, 0)
	for _, b := range []*fakeBroker{b1, b2, b3} {
		b.setMany(many)
		b.register(t, e)
	}
	return b1, b2, b3
}

// allCommitted waits until no recovery is pending, then checks each
// stream moved to epoch 4.
func allCommitted(t *testing.T, e *env, streams []string, within time.Duration) {
	t.Helper()
	clustertest.Eventually(t, within, "every recovery is committed", func() bool {
		resp, err := e.cli.Get(context.Background(), e.schema.RecoveriesDir(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	for _, s := range streams {
		if got, _ := get[cluster.Assignment](t, e, e.schema.AssignmentKey(s)); got.Epoch != 4 {
			t.Errorf("%s after its recovery: %+v", s, got)
		}
	}
}

// The seals of many rounds in flight to one broker go together in SealMany
// calls (docs/protocol.md, "Stream failover"), each answered per entry;
// a broker that dies with a call in flight fails that call's seals only
// as a Seal to it would have failed, and every round still resolves and
// commits on the copies that answered.
func TestSealManyGathersRoundsAndSurvivesABrokerDying(t *testing.T) {
	e := newEnv(t)
	const n = 40
	_, b2, b3 := startThree(t, e, answer, true)
	// b2 and b3 hold every seal until the gate opens, so the rounds'
	// seals queue behind the calls in flight.
	gate := make(chan struct{})
	var mu sync.Mutex
	held := map[string]int{}
	hold := func(node string) func(int) {
		return func(int) {
			mu.Lock()
			held[node]++
			mu.Unlock()
			<-gate
		}
	}
	b2.setHook(hold("b2"))
	b3.setHook(hold("b3"))
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	streams := putRecoveries(t, e, n)
	// A seal timeout no round reaches while the test runs: a round that
	// resolves does so on its answers, not on the clock.
	e.startRecoverer(t, "r1", func(c *app.Config) { c.SealTimeout = time.Minute })

	clustertest.Eventually(t, 10*time.Second, "seals held at b2 and b3", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return held["b2"] > 0 && held["b3"] > 0
	})
	// b3 dies with its calls in flight; then b2 answers.
	_ = b3.srv.Close()
	close(gate)
	allCommitted(t, e, streams, 30*time.Second)

	calls, _ := b2.manyCounts()
	total := 0
	for _, c := range calls {
		total += c
	}
	if total < n || len(calls) >= n || slices.Max(calls) < 2 {
		t.Fatalf("b2 served %d seals in %d SealMany calls (entries %v): want %d seals gathered into fewer calls", total, len(calls), calls, n)
	}
}

// A broker that answers SealMany Unimplemented (older than it) is sent a
// Seal per copy from then on, and every recovery commits.
func TestSealManyUnimplementedFallsBackToSeal(t *testing.T) {
	e := newEnv(t)
	const n = 20
	_, b2, b3 := startThree(t, e, fail, false)
	streams := putRecoveries(t, e, n)
	e.startRecoverer(t, "r1", nil)
	allCommitted(t, e, streams, 30*time.Second)
	for _, b := range []*fakeBroker{b2, b3} {
		served, refused := b.manyCounts()
		if len(served) != 0 || refused == 0 {
			t.Fatalf("%s: %d SealMany served, %d refused; want none served and the first refused", b.node, len(served), refused)
		}
		// Refused once per call in flight before the first refusal came
		// back, then never asked again.
		if refused > 4 {
			t.Errorf("%s: SealMany asked %d times after it was refused", b.node, refused)
		}
		sealed := map[string]bool{}
		for _, c := range b.sealCalls() {
			sealed[c.GetStream()] = true
		}
		if len(sealed) != n {
			t.Errorf("%s: Seal reached %d streams, want %d", b.node, len(sealed), n)
		}
	}
}

// A seal that hangs at a broker holds up no other round whose seal went in
// the same SealMany call: each entry's answer goes back as it comes
// (docs/protocol.md, "Stream failover"). The seal timeout is far beyond
// the test's wait, so a round answered only with the whole call would not
// commit in time.
func TestSealManyAnswersEachSealAsItComes(t *testing.T) {
	e := newEnv(t)
	const n = 20
	_, b2, _ := startThree(t, e, fail, true)
	streams := putRecoveries(t, e, n)
	// orders-00's seal at b2 hangs: with b1 down it cannot reach R = 2
	// answers and waits; every other stream needs b2's answer too.
	b2.mu.Lock()
	b2.hangStream = streams[0]
	b2.mu.Unlock()
	e.startRecoverer(t, "r1", func(c *app.Config) { c.SealTimeout = time.Minute })
	clustertest.Eventually(t, 20*time.Second, "every recovery but the hanging one's is committed", func() bool {
		resp, err := e.cli.Get(context.Background(), e.schema.RecoveriesDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		return err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Key) == e.schema.RecoveryKey(streams[0])
	})
	if calls, _ := b2.manyCounts(); len(calls) == 0 {
		t.Fatal("b2 served no SealMany")
	}
}
