package app_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
)

// sealMode is how a fake broker answers Seal.
type sealMode int

const (
	// answer with the configured tails at the fence epoch asked.
	answer sealMode = iota
	// hang until the caller gives up (a paused or partitioned broker).
	hang
	// fail with Unavailable at once.
	fail
)

// fakeBroker serves ReplicationService.Seal over real loopback h2c and
// records every call. It stands in for a broker's copy of one stream.
type fakeBroker struct {
	strandv1connect.UnimplementedReplicationServiceHandler

	node string
	srv  *rpcserver.Server

	mu              sync.Mutex
	mode            sealMode
	recordTail      uint64
	cursorEventTail uint64
	calls           []*strandv1.SealRequest
	inFlight        int
	cancelled       int
	// onSeal, when set, runs at the start of every call with its number.
	onSeal func(n int)
}

func startFakeBroker(t *testing.T, node string, mode sealMode, recordTail, cursorEventTail uint64) *fakeBroker {
	t.Helper()
	b := &fakeBroker{node: node, mode: mode, recordTail: recordTail, cursorEventTail: cursorEventTail}
	path, handler := strandv1connect.NewReplicationServiceHandler(b)
	b.srv = clustertest.Serve(t, path, handler)
	return b
}

func (b *fakeBroker) Seal(ctx context.Context, req *connect.Request[strandv1.SealRequest]) (*connect.Response[strandv1.SealResponse], error) {
	b.mu.Lock()
	b.calls = append(b.calls, req.Msg)
	n, mode, hook := len(b.calls), b.mode, b.onSeal
	resp := &strandv1.SealResponse{
		Node:            b.node,
		FenceEpoch:      req.Msg.GetFenceEpoch(),
		RecordTail:      b.recordTail,
		CursorEventTail: b.cursorEventTail,
	}
	b.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	switch mode {
	case hang:
		b.mu.Lock()
		b.inFlight++
		b.mu.Unlock()
		<-ctx.Done()
		b.mu.Lock()
		b.inFlight--
		b.cancelled++
		b.mu.Unlock()
		return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	case fail:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("fake broker: unavailable"))
	}
	return connect.NewResponse(resp), nil
}

func (b *fakeBroker) set(mode sealMode, recordTail, cursorEventTail uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mode, b.recordTail, b.cursorEventTail = mode, recordTail, cursorEventTail
}

func (b *fakeBroker) setHook(f func(n int)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onSeal = f
}

// sealCalls returns a copy of the calls so far.
func (b *fakeBroker) sealCalls() []*strandv1.SealRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*strandv1.SealRequest(nil), b.calls...)
}

func (b *fakeBroker) counts() (calls, inFlight, cancelled int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls), b.inFlight, b.cancelled
}

// register publishes the broker's address at /strand/brokers/<node>.
func (b *fakeBroker) register(t *testing.T, c *env) {
	t.Helper()
	c.put(t, c.schema.BrokerKey(b.node), cluster.BrokerInfo{Node: b.node, Address: b.srv.Addr()})
}
