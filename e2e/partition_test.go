package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestPartitionedOwner cuts the owner off the cluster network while it keeps
// running. Publishes sent straight to it confirm nothing, the stream fails
// over, and when the old owner returns its unconfirmed suffix is cut and it
// follows the new owner: its records equal the new owner's at every offset.
func TestPartitionedOwner(t *testing.T) {
	h := startCluster(t, 3)
	ctx := t.Context()
	const stream = "partition"
	a0 := h.createStream(ctx, stream, 3, cluster.MajorityDurable)

	cl := h.client()
	l := ledger.New()
	pub := startPublishing(t, cl, stream, "p", 4, l)
	clustertest.Eventually(t, 30*time.Second, "200 confirmed records before the partition", func() (bool, string) {
		return l.Count() >= 200, pub.LastError()
	})

	owner := a0.Owner
	cut := time.Now()
	h.partition(owner)
	// The host still reaches the isolated owner through the client network.
	// Everything sent to it from now on was never seen by a follower, so
	// none of it may be confirmed: W = 2 needs a follower's copy.
	iso := startIsolatedPublishing(h.broker(owner), stream, "iso")
	t.Cleanup(iso.stop)

	a1 := h.waitNewOwner(ctx, stream, a0.Epoch, owner, 30*time.Second)
	fenced := time.Now()
	t.Logf("failover: epoch %d -> %d, owner %s -> %s, %s after the partition",
		a0.Epoch, a1.Epoch, owner, a1.Owner, fenced.Sub(cut).Round(10*time.Millisecond))
	clustertest.Eventually(t, 30*time.Second, "publishes confirm at the new epoch", func() (bool, string) {
		return l.AtEpoch(a1.Epoch) >= 100, pub.LastError()
	})
	// At least a few publishes to the isolated owner that started after the
	// fence have been answered.
	clustertest.Eventually(t, 30*time.Second, "publishes to the isolated owner answered after the fence", func() (bool, string) {
		n := iso.answeredAfter(fenced)
		return n >= 3, fmt.Sprintf("%d answered, last error %s", n, iso.lastError())
	})
	iso.stop()
	pub.Stop()
	t.Logf("isolated owner: %d publishes sent, %d confirmed, last error: %s", iso.sent.Load(), len(iso.confirmed()), iso.lastError())
	for _, c := range iso.confirmed() {
		t.Errorf("the isolated owner %s confirmed %s", owner, c)
	}
	hist1 := h.history(ctx, stream)
	if s, ok := hist1.Latest(); ok {
		t.Logf("history start of epoch %d: record tail %d at %s", s.Epoch, s.RecordTail, s.Node)
	}

	// The old owner returns: cut back to the new history, then a follower.
	h.heal(owner)
	h.waitRejoined(ctx, stream, owner, a1.Epoch, 60*time.Second)
	if a2, _ := h.assignment(ctx, stream); a2.Epoch != a1.Epoch || a2.Owner != a1.Owner {
		t.Errorf("assignment after the return is epoch %d owner %s, want epoch %d owner %s", a2.Epoch, a2.Owner, a1.Epoch, a1.Owner)
	}
	if hist2 := h.history(ctx, stream); len(hist2) != len(hist1) {
		t.Errorf("the return changed the history: %+v, was %+v", hist2, hist1)
	}

	st, err := h.getStream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	tail := copyOf(st, a1.Owner).GetRecordTail()
	if l.End() > tail {
		t.Fatalf("the owner's record tail %d is below the last confirmed offset %d", tail, l.End()-1)
	}
	recs := readAll(ctx, t, "the new owner "+a1.Owner, tail, readFromCopy(h.broker(a1.Owner), stream))
	returned := readAll(ctx, t, "the returned copy at "+owner, tail, readFromCopy(h.broker(owner), stream))
	sameRecords(t, a1.Owner, recs, owner, returned)
	for _, r := range returned {
		if strings.HasPrefix(string(r.GetPayload()), "iso-") {
			t.Errorf("offset %d of the returned copy holds %q, which only the isolated owner took", r.GetOffset(), r.GetPayload())
		}
	}
	n := verifyLedger(t, l, recs)
	t.Logf("%d confirmed records verified at their offsets; the returned copy equals the owner on [0, %d)", n, tail)
}

// isolatedPublisher sends publishes straight to one broker, without the
// client's redirects and retries, and records every answer.
type isolatedPublisher struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sent   atomic.Int64

	mu       sync.Mutex
	answered []time.Time // when each answered attempt had started
	ok       []string
	lastErr  string
}

func startIsolatedPublishing(b strandv1connect.StreamServiceClient, stream, prefix string) *isolatedPublisher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &isolatedPublisher{cancel: cancel}
	p.wg.Go(func() {
		for i := 1; ctx.Err() == nil; i++ {
			payload := fmt.Sprintf("%s-%06d", prefix, i)
			started := time.Now()
			pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
			res, err := b.Publish(pctx, connect.NewRequest(&strandv1.PublishRequest{
				Stream: stream, Records: []*strandv1.Record{{Payload: []byte(payload)}},
			}))
			pcancel()
			p.sent.Add(1)
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.answered = append(p.answered, started)
			if err == nil {
				p.ok = append(p.ok, fmt.Sprintf("%s at offset %d epoch %d", payload, res.Msg.GetOffsets()[0], res.Msg.GetEpoch()))
			} else {
				p.lastErr = err.Error()
			}
			p.mu.Unlock()
			if err != nil && !isCode(err, connect.CodeDeadlineExceeded) {
				// A fast refusal (fenced, not the owner): do not spin.
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	})
	return p
}

func (p *isolatedPublisher) stop() {
	p.cancel()
	p.wg.Wait()
}

func (p *isolatedPublisher) answeredAfter(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.answered {
		if s.After(t) {
			n++
		}
	}
	return n
}

func (p *isolatedPublisher) confirmed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.ok...)
}

func (p *isolatedPublisher) lastError() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}
