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
	// hangStream, when set, is a stream whose seal hangs until the caller
	// gives up, whatever the mode.
	hangStream string
	// many makes the broker serve SealMany, each entry as a Seal; without
	// it SealMany answers Unimplemented, as a broker older than it does.
	many bool
	// manyCalls is the entries of each SealMany served; manyRefused
	// counts those answered Unimplemented.
	manyCalls   []int
	manyRefused int
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
	if b.hangStream != "" && req.Msg.GetStream() == b.hangStream {
		mode = hang
	}
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

// SealMany answers each entry as Seal would, the entries at once, each
// result sent as it comes.
func (b *fakeBroker) SealMany(ctx context.Context, req *connect.Request[strandv1.SealManyRequest], stream *connect.ServerStream[strandv1.SealManyResponse]) error {
	b.mu.Lock()
	if !b.many {
		b.manyRefused++
		b.mu.Unlock()
		return connect.NewError(connect.CodeUnimplemented, errors.New("fake broker: no SealMany"))
	}
	b.manyCalls = append(b.manyCalls, len(req.Msg.GetSeals()))
	b.mu.Unlock()
	results := make(chan *strandv1.SealResult, len(req.Msg.GetSeals()))
	for i, e := range req.Msg.GetSeals() {
		go func() {
			r := &strandv1.SealResult{Entry: uint32(i)}
			if res, err := b.Seal(ctx, connect.NewRequest(e)); err != nil {
				r.Outcome = &strandv1.SealResult_Error{Error: &strandv1.PublishError{Code: uint32(connect.CodeOf(err)), Message: err.Error()}}
			} else {
				r.Outcome = &strandv1.SealResult_Response{Response: res.Msg}
			}
			results <- r
		}()
	}
	for range req.Msg.GetSeals() {
		if err := stream.Send(&strandv1.SealManyResponse{Results: []*strandv1.SealResult{<-results}}); err != nil {
			return err
		}
	}
	return nil
}

// manyCounts returns the entries of each SealMany served and how many
// were refused as Unimplemented.
func (b *fakeBroker) manyCounts() ([]int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.manyCalls...), b.manyRefused
}

func (b *fakeBroker) setMany(many bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.many = many
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
