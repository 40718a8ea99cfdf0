package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/internal/gen/strand/v1"
	"github.com/strandhq/strand/internal/gen/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcserver"
)

// leaderIsAt is how a controller that is not the leader names the leader
// (docs/CONTRACTS.md, "Controller leadership"); the message is the contract.
const leaderIsAt = "leader is at "

// maxLeaderRedirects bounds redirects between controllers within one call.
const maxLeaderRedirects = 3

// ErrNoController is returned by Admin calls when Config.Controller is empty.
var ErrNoController = errors.New("client: no controller address (set Config.Controller)")

// Admin returns the AdminService client. It sends to the controller leader:
// a controller that answers "not the controller leader; leader is at X" is
// retried at X, and Unavailable or a connection error is retried with backoff
// within the call's deadline (or the retry budget).
func (c *Client) Admin() strandv1connect.AdminServiceClient { return c.admin }

type adminClient struct {
	c *Client

	mu      sync.Mutex
	leader  string // address to try first
	clients map[string]strandv1connect.AdminServiceClient
}

func newAdminClient(c *Client) *adminClient {
	return &adminClient{c: c, leader: c.cfg.Controller, clients: make(map[string]strandv1connect.AdminServiceClient)}
}

func (a *adminClient) target() (string, strandv1connect.AdminServiceClient) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cl, ok := a.clients[a.leader]
	if !ok {
		cl = strandv1connect.NewAdminServiceClient(a.c.httpClient, rpcserver.BaseURL(a.leader), a.c.cfg.Options...)
		a.clients[a.leader] = cl
	}
	return a.leader, cl
}

func (a *adminClient) setLeader(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.leader = addr
}

// LeaderHint returns the leader address a non-leader controller named in
// err, if it did.
func LeaderHint(err error) (string, bool) {
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeUnavailable {
		return "", false
	}
	_, addr, ok := strings.Cut(cerr.Message(), leaderIsAt)
	addr = strings.TrimSpace(addr)
	return addr, ok && addr != ""
}

// adminCall sends one AdminService call to the leader with redirects and
// retries. Each attempt gets a fresh request carrying the caller's headers.
func adminCall[Req, Res any](ctx context.Context, a *adminClient, name string, req *connect.Request[Req],
	call func(strandv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	if a.c.cfg.Controller == "" {
		return nil, ErrNoController
	}
	ctx, cancel := a.c.withBudget(ctx)
	defer cancel()
	b := a.c.newBackoff()
	redirects := 0
	attempts := 0
	for {
		addr, cl := a.target()
		next := connect.NewRequest(req.Msg)
		for k, v := range req.Header() {
			next.Header()[k] = append([]string(nil), v...)
		}
		attempts++
		actx, acancel := context.WithTimeout(ctx, a.c.cfg.AttemptTimeout)
		res, err := call(cl, actx, next)
		acancel()
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("client: admin %s: %w after %d attempts; last error: %w", name, ctx.Err(), attempts, err)
		}
		if leader, ok := LeaderHint(err); ok && leader != addr && redirects < maxLeaderRedirects {
			redirects++
			a.setLeader(leader)
			continue
		}
		if !retryable(ctx, err) || connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// FailedPrecondition from the controller is an answer (a
			// stream in a state the action does not fit), not a move.
			return nil, err
		}
		// Back to the configured controller: a leader we were sent to may
		// have gone, and the configured one names the next.
		a.setLeader(a.c.cfg.Controller)
		redirects = 0
		if !a.c.sleep(ctx, b.next()) {
			if a.c.ctx.Err() != nil {
				return nil, ErrClosed
			}
			return nil, fmt.Errorf("client: admin %s: %w after %d attempts; last error: %w", name, ctx.Err(), attempts, err)
		}
	}
}

func (a *adminClient) CreateStream(ctx context.Context, req *connect.Request[strandv1.CreateStreamRequest]) (*connect.Response[strandv1.CreateStreamResponse], error) {
	return adminCall(ctx, a, "CreateStream", req, strandv1connect.AdminServiceClient.CreateStream)
}

func (a *adminClient) DeleteStream(ctx context.Context, req *connect.Request[strandv1.DeleteStreamRequest]) (*connect.Response[strandv1.DeleteStreamResponse], error) {
	return adminCall(ctx, a, "DeleteStream", req, strandv1connect.AdminServiceClient.DeleteStream)
}

func (a *adminClient) GetStream(ctx context.Context, req *connect.Request[strandv1.GetStreamRequest]) (*connect.Response[strandv1.GetStreamResponse], error) {
	return adminCall(ctx, a, "GetStream", req, strandv1connect.AdminServiceClient.GetStream)
}

func (a *adminClient) ListStreams(ctx context.Context, req *connect.Request[strandv1.ListStreamsRequest]) (*connect.Response[strandv1.ListStreamsResponse], error) {
	return adminCall(ctx, a, "ListStreams", req, strandv1connect.AdminServiceClient.ListStreams)
}

func (a *adminClient) UpdateStream(ctx context.Context, req *connect.Request[strandv1.UpdateStreamRequest]) (*connect.Response[strandv1.UpdateStreamResponse], error) {
	return adminCall(ctx, a, "UpdateStream", req, strandv1connect.AdminServiceClient.UpdateStream)
}

func (a *adminClient) ListBrokers(ctx context.Context, req *connect.Request[strandv1.ListBrokersRequest]) (*connect.Response[strandv1.ListBrokersResponse], error) {
	return adminCall(ctx, a, "ListBrokers", req, strandv1connect.AdminServiceClient.ListBrokers)
}

func (a *adminClient) ListAttention(ctx context.Context, req *connect.Request[strandv1.ListAttentionRequest]) (*connect.Response[strandv1.ListAttentionResponse], error) {
	return adminCall(ctx, a, "ListAttention", req, strandv1connect.AdminServiceClient.ListAttention)
}

func (a *adminClient) AcceptOwnerLoss(ctx context.Context, req *connect.Request[strandv1.AcceptOwnerLossRequest]) (*connect.Response[strandv1.AcceptOwnerLossResponse], error) {
	return adminCall(ctx, a, "AcceptOwnerLoss", req, strandv1connect.AdminServiceClient.AcceptOwnerLoss)
}

func (a *adminClient) WithdrawRecovery(ctx context.Context, req *connect.Request[strandv1.WithdrawRecoveryRequest]) (*connect.Response[strandv1.WithdrawRecoveryResponse], error) {
	return adminCall(ctx, a, "WithdrawRecovery", req, strandv1connect.AdminServiceClient.WithdrawRecovery)
}

func (a *adminClient) Failover(ctx context.Context, req *connect.Request[strandv1.FailoverRequest]) (*connect.Response[strandv1.FailoverResponse], error) {
	return adminCall(ctx, a, "Failover", req, strandv1connect.AdminServiceClient.Failover)
}

var _ strandv1connect.AdminServiceClient = (*adminClient)(nil)
