package app

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	recovererapp "github.com/strandhq/strand/services/recoverer/app"
)

// sealPeer serves ReplicationService.Seal for one broker's copies over real
// loopback h2c, answering every seal with fixed tails, or refusing it with
// FailedPrecondition as a broker does for a seal of another incarnation.
type sealPeer struct {
	strandv1connect.UnimplementedReplicationServiceHandler
	node string
	srv  *rpcserver.Server

	mu     sync.Mutex
	refuse bool
	seals  int
}

func startSealPeer(t *testing.T, node string) *sealPeer {
	t.Helper()
	p := &sealPeer{node: node}
	path, handler := strandv1connect.NewReplicationServiceHandler(p)
	p.srv = clustertest.Serve(t, path, handler)
	return p
}

func (p *sealPeer) Seal(_ context.Context, req *connect.Request[strandv1.SealRequest]) (*connect.Response[strandv1.SealResponse], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seals++
	if p.refuse {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("replica: seal of another incarnation: seal of incarnation %q, copy of %q", req.Msg.GetIncarnation(), "older"))
	}
	return connect.NewResponse(&strandv1.SealResponse{Node: p.node, FenceEpoch: req.Msg.GetFenceEpoch(), RecordTail: 10, CursorEventTail: 1}), nil
}

func (p *sealPeer) setRefuse(refuse bool) (seals int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
	return p.seals
}

func (p *sealPeer) sealCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seals
}

// recoverer starts a real recoverer app against the harness's etcd, with
// short timings, and closes it at cleanup.
func (h *harness) recoverer() {
	h.t.Helper()
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := zerolog.New(&lockedWriter{mu: &mu, w: &logs}).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	a, err := recovererapp.Start(ctxT(h.t), recovererapp.Config{
		Name: "recoverer-1", Listen: "127.0.0.1:0", Etcd: h.etcd.Endpoints, Logger: &logger,
		SealTimeout: time.Second, SessionTTL: 2 * time.Second, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		TLS: tlsconfig.Settings{Insecure: true},
	})
	if err != nil {
		h.t.Fatalf("start recoverer: %v", err)
	}
	h.t.Cleanup(func() {
		_ = a.Close()
		if h.t.Failed() {
			mu.Lock()
			h.t.Logf("recoverer log:\n%s", logs.String())
			mu.Unlock()
		}
	})
	select {
	case <-a.Ready():
	case err := <-a.Err():
		h.t.Fatalf("recoverer failed: %v", err)
	case <-time.After(10 * time.Second):
		h.t.Fatal("recoverer not ready")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// attentionOf lists the attention entries of stream.
func attentionOf(t *testing.T, c strandv1connect.AdminServiceClient, stream string) []*strandv1.AttentionEntry {
	t.Helper()
	resp, err := c.ListAttention(ctxT(t), connect.NewRequest(&strandv1.ListAttentionRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var out []*strandv1.AttentionEntry
	for _, e := range resp.Msg.GetEntries() {
		if e.GetStream() == stream {
			out = append(out, e)
		}
	}
	return out
}

func describeAttention(es []*strandv1.AttentionEntry) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, fmt.Sprintf("%s/%s(%s)", e.GetKind(), e.GetNode(), e.GetReason()))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// TestRecoveryWaitingOnRefusedSealShownUnderAttention runs the controller
// and the recoverer against brokers' Seal over real loopback. The owner of a
// 3-copy majority_durable stream (R = 2) is lost; one follower seals, the
// other is live but refuses its seal with FailedPrecondition. The recovery
// waits rather than guess (docs/protocol.md, "Safety argument"), and since both followers heartbeat the
// heartbeats alone show no reason: attention must name the stream, the
// refusing copy and what it answered. Once the copy stops refusing, the
// recovery commits and the entry and the recorded refusals go away.
func TestRecoveryWaitingOnRefusedSealShownUnderAttention(t *testing.T) {
	h := newHarness(t)
	peers := map[string]*sealPeer{}
	for _, n := range []string{"b1", "b2", "b3"} {
		peers[n] = startSealPeer(t, n)
		h.brokerAt(n, peers[n].srv.Addr())
		h.heartbeat(n, map[string]cluster.CopyTails{})
	}
	_, c := h.leader(Config{})
	h.recoverer()
	create(t, c, "s", 3, nil)
	a, _ := get[cluster.Assignment](h, schema.AssignmentKey("s"))
	sealer, refuser := a.Followers[0], a.Followers[1]
	peers[refuser].setRefuse(true)

	h.kill(a.Owner)
	rec := h.recovery("s", "")
	clustertest.Eventually(t, 15*time.Second, "attention lists the refused seal", func() error {
		es := attentionOf(t, c, "s")
		for _, e := range es {
			if e.GetKind() != "recovery_seal_refused" {
				continue
			}
			if r := e.GetReason(); e.GetNode() != refuser || !strings.Contains(r, "live copy "+refuser+" refused its seal") ||
				!strings.Contains(r, "failed_precondition") || !strings.Contains(r, "another incarnation") ||
				!strings.Contains(r, fmt.Sprintf("epoch %d", rec.FenceEpoch)) || !strings.Contains(r, "sealed: "+sealer) {
				return fmt.Errorf("entry %s/%s: %q", e.GetKind(), e.GetNode(), r)
			}
			return nil
		}
		return fmt.Errorf("attention %s", describeAttention(es))
	})
	t.Logf("attention while the seal is refused: %s", describeAttention(attentionOf(t, c, "s")))
	// The recovery really waits, and the copy was asked: the entry is not
	// a guess from heartbeats.
	if now, _ := get[cluster.Assignment](h, schema.AssignmentKey("s")); now.Epoch != a.Epoch {
		t.Fatalf("assignment moved to %+v while a seal was refused", now)
	}
	if peers[refuser].sealCount() == 0 {
		t.Fatalf("%s was never asked to seal", refuser)
	}
	stored, ok := get[cluster.SealRefusals](h, schema.RefusalsKey("s"))
	if !ok || stored.TransitionID != rec.TransitionID || len(stored.Refusals) != 1 || stored.Refusals[0].Node != refuser ||
		stored.Refusals[0].Code != "failed_precondition" || len(stored.Refusals[0].Error) > cluster.MaxRefusalError {
		t.Fatalf("stored refusals %+v (present %v)", stored, ok)
	}
	// GetStream shows the same entry for the stream.
	got, err := c.GetStream(ctxT(t), connect.NewRequest(&strandv1.GetStreamRequest{Name: "s"}))
	if err != nil {
		t.Fatal(err)
	}
	if es := got.Msg.GetAttention(); !strings.Contains(describeAttention(es), "recovery_seal_refused/"+refuser) {
		t.Fatalf("GetStream attention %s", describeAttention(es))
	}

	peers[refuser].setRefuse(false)
	clustertest.Eventually(t, 15*time.Second, "the refused seal gone from attention once the recovery commits", func() error {
		if es := attentionOf(t, c, "s"); strings.Contains(describeAttention(es), "recovery_seal_refused") {
			return fmt.Errorf("attention %s", describeAttention(es))
		}
		if r, pending := get[cluster.Recovery](h, schema.RecoveryKey("s")); pending {
			return fmt.Errorf("recovery %s still pending", r.TransitionID)
		}
		return nil
	})
	if now, _ := get[cluster.Assignment](h, schema.AssignmentKey("s")); now.Epoch != rec.FenceEpoch || !now.Includes(refuser) || !now.Includes(sealer) {
		t.Fatalf("recovered assignment %+v, want both followers at epoch %d", now, rec.FenceEpoch)
	}
	if r, ok := get[cluster.SealRefusals](h, schema.RefusalsKey("s")); ok {
		t.Fatalf("refusals %+v outlived the recovery", r)
	}
}
