package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcerr"
)

// maxLeaderRedirects bounds redirects between controllers within one call.
const maxLeaderRedirects = 3

// ErrNoController is returned by Admin calls when Config.Controller is empty.
var ErrNoController = errors.New("client: no controller address (set Config.Controller)")

// Admin returns the AdminService client. It sends to the controller leader:
// a controller that does not lead answers Unavailable with a LeaderHint
// (docs/errors.md), and the call is sent again at the hinted address; any
// other Unavailable or a connection error is retried with backoff within the
// call's deadline (or the retry budget).
//
// A retried CreateStream or DeleteStream reports what the call did, not
// what its last attempt was told: when an earlier attempt may have been
// applied and only its answer lost (it timed out, or failed Unavailable or
// mid-response), a later NotFound from DeleteStream is success (as is a
// FailedPrecondition saying another incarnation of the stream has the name:
// DeleteStream deletes only the stream it found), and a later AlreadyExists
// from CreateStream is success if the stream that exists has the copies,
// policy and retention the request set (its response then describes that
// stream). An AlreadyExists, NotFound or FailedPrecondition answered to the
// first attempt, or after attempts the controller provably did not apply,
// is returned as is.
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
		cl = strandv1connect.NewAdminServiceClient(a.c.httpClient, a.c.baseURL(a.leader), a.c.cfg.Options...)
		a.clients[a.leader] = cl
	}
	return a.leader, cl
}

func (a *adminClient) setLeader(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.leader = addr
}

// adminCall sends one AdminService call to the leader with redirects and
// retries. Each attempt gets a fresh request carrying the caller's headers.
func adminCall[Req, Res any](ctx context.Context, a *adminClient, name string, req *connect.Request[Req],
	call func(strandv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*connect.Response[Res], error) {
	res, _, err := adminRetry(ctx, a, name, req, call)
	return res, err
}

// adminRetry is adminCall that also reports whether an attempt before the
// one that answered may have been applied by the controller
// (mayHaveApplied): the caller of a call that is not idempotent needs it to
// read that answer.
func adminRetry[Req, Res any](ctx context.Context, a *adminClient, name string, req *connect.Request[Req],
	call func(strandv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (res *connect.Response[Res], earlierMayHaveApplied bool, err error) {
	if a.c.cfg.Controller == "" {
		return nil, false, ErrNoController
	}
	ctx, cancel := a.c.withBudget(ctx)
	defer cancel()
	b := a.c.newBackoff()
	redirects := 0
	attempts := 0
	// last is the latest answer an attempt got before the deadline: an
	// attempt the deadline cuts answers only the deadline, and the error
	// names what the calls were told (as call does with lastOf).
	var last error
	for {
		addr, cl := a.target()
		next := connect.NewRequest(req.Msg)
		copyHeader(next, req)
		attempts++
		actx, acancel := context.WithTimeout(ctx, a.c.cfg.AttemptTimeout)
		res, err := call(cl, actx, next)
		acancel()
		if err == nil {
			return res, earlierMayHaveApplied, nil
		}
		if ctx.Err() != nil {
			return nil, earlierMayHaveApplied, fmt.Errorf("client: admin %s: %w after %d attempts; last error: %w", name, ctx.Err(), attempts, lastOf(err, last))
		}
		last = err
		if hint, ok := rpcerr.LeaderHint(err); ok && hint.GetAddress() != addr && redirects < maxLeaderRedirects {
			redirects++
			a.setLeader(hint.GetAddress())
			continue
		}
		if !retryable(ctx, err) || connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// FailedPrecondition from the controller is an answer (a
			// stream in a state the action does not fit), not a move.
			return nil, earlierMayHaveApplied, err
		}
		earlierMayHaveApplied = earlierMayHaveApplied || mayHaveApplied(err)
		// Back to the configured controller: a leader we were sent to may
		// have gone, and the configured one names the next.
		a.setLeader(a.c.cfg.Controller)
		redirects = 0
		if !a.c.sleep(ctx, b.after(err)) {
			if a.c.ctx.Err() != nil {
				return nil, earlierMayHaveApplied, ErrClosed
			}
			return nil, earlierMayHaveApplied, fmt.Errorf("client: admin %s: %w after %d attempts; last error: %w", name, ctx.Err(), attempts, err)
		}
	}
}

// copyHeader gives next the headers of the caller's req (credentials).
func copyHeader[A, B any](next *connect.Request[A], req *connect.Request[B]) {
	for k, v := range req.Header() {
		next.Header()[k] = append([]string(nil), v...)
	}
}

// describe gets stream name for another call, req, with req's headers.
func describe[T any](ctx context.Context, a *adminClient, req *connect.Request[T], name string) (*connect.Response[strandv1.GetStreamResponse], error) {
	get := connect.NewRequest(&strandv1.GetStreamRequest{Name: name})
	copyHeader(get, req)
	return adminCall(ctx, a, "GetStream", get, strandv1connect.AdminServiceClient.GetStream)
}

// mayHaveApplied reports whether a failed admin attempt may have been
// applied by the controller, its answer rather than its request being what
// was lost. Only what proves the request was not applied says no; anything
// else (Unavailable, DeadlineExceeded from the attempt timeout, Canceled, a
// connection lost mid-response) may have come after the controller's
// transaction committed.
func mayHaveApplied(err error) bool {
	if _, ok := rpcerr.LeaderHint(err); ok {
		// A controller that does not lead refuses before it reads or
		// writes anything (docs/api.md, "Controller leadership").
		return false
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		// The request never reached a controller.
		return false
	}
	// Aborted is the controller's answer to a guarded transaction that
	// did not commit (a conflicting change): nothing was written.
	return connect.CodeOf(err) != connect.CodeAborted
}

// CreateStream creates a stream. Creating is not idempotent: after an
// attempt whose answer was lost, the retry finds the stream that attempt
// created and is answered AlreadyExists. So when an earlier attempt may
// have been applied, an AlreadyExists is read as success if the stream
// that exists is the one asked for (createMismatch). A stream someone else
// created meanwhile with the same configuration cannot be told from ours
// (the spec records no creator), and is reported as created too, by
// choice: the caller asked for that stream to exist, and it does, as
// asked. One with another configuration is not the caller's stream
// whoever made it, and stays AlreadyExists, the field that differs named.
func (a *adminClient) CreateStream(ctx context.Context, req *connect.Request[strandv1.CreateStreamRequest]) (*connect.Response[strandv1.CreateStreamResponse], error) {
	// One budget for the create and the describe that may follow it.
	ctx, cancel := a.c.withBudget(ctx)
	defer cancel()
	res, earlier, err := adminRetry(ctx, a, "CreateStream", req, strandv1connect.AdminServiceClient.CreateStream)
	if err == nil || !earlier || connect.CodeOf(err) != connect.CodeAlreadyExists {
		return res, err
	}
	name := req.Msg.GetName()
	got, gerr := describe(ctx, a, req, name)
	switch {
	case connect.CodeOf(gerr) == connect.CodeNotFound:
		// Deleted since it was found: whoever created it, the stream
		// the caller asked for is not there now.
		return nil, err
	case gerr != nil:
		// The outcome is unknown: the caller sees the describe's error
		// (its code, not AlreadyExists), as for a create that ran out of
		// retries.
		return nil, fmt.Errorf("client: admin CreateStream %q: answered %v after an earlier attempt may have created it, and describing the stream failed: %w", name, err, gerr)
	}
	if field := createMismatch(req.Msg, got.Msg.GetSpec()); field != "" {
		return nil, fmt.Errorf("client: admin CreateStream %q: the stream that exists has a %s other than the request's: %w", name, field, err)
	}
	return connect.NewResponse(&strandv1.CreateStreamResponse{Spec: got.Msg.GetSpec(), Assignment: got.Msg.GetAssignment()}), nil
}

// createMismatch names the first field the request sets that spec, the
// stream that exists, does not have, or returns "" when it has them all.
// Copies left zero mean 1 (CreateStreamRequest.copies). A policy left unset
// takes the controller's default, which the client cannot see, so any
// policy matches it. Retention left unset means unbounded: zero limits.
func createMismatch(req *strandv1.CreateStreamRequest, spec *strandv1.StreamSpec) string {
	if spec == nil {
		return "spec"
	}
	if max(1, req.GetCopies()) != spec.GetCopies() {
		return "copies"
	}
	if p := req.GetPolicy(); p.GetName() != "" || p.GetNodes() != 0 {
		if p.GetName() != spec.GetPolicy().GetName() || p.GetNodes() != spec.GetPolicy().GetNodes() {
			return "policy"
		}
	}
	want, have := req.GetRetention(), spec.GetRetention()
	switch {
	case want.GetMaxRecords() != have.GetMaxRecords():
		return "retention.max_records"
	case want.GetMaxBytes() != have.GetMaxBytes():
		return "retention.max_bytes"
	case want.GetMaxAge().AsDuration() != have.GetMaxAge().AsDuration():
		// AsDuration reads an absent max_age as 0, as the controller does.
		return "retention.max_age"
	}
	return ""
}

// DeleteStream deletes a stream. A request without an incarnation is sent
// with the one GetStream reports (NotFound there is the call's answer), so
// its retries delete only the stream the call found: after an attempt that
// deleted it and lost its answer, the name may have been given to a new
// stream, which a retry must leave alone. So when an earlier attempt may
// have deleted the stream, a later NotFound, or FailedPrecondition (another
// incarnation has the name now), is success: the stream is gone, as asked.
// (Deleted by someone else meanwhile is indistinguishable, and the caller's
// wish holds all the same.) A FailedPrecondition no attempt of the call can
// have caused is returned as is: the stream found was replaced before the
// delete reached it. A request that sets an incarnation is sent as it is;
// a stream created before incarnations has none, and a request for it
// deletes whatever stream has the name.
func (a *adminClient) DeleteStream(ctx context.Context, req *connect.Request[strandv1.DeleteStreamRequest]) (*connect.Response[strandv1.DeleteStreamResponse], error) {
	// One budget for the describe and the delete.
	ctx, cancel := a.c.withBudget(ctx)
	defer cancel()
	if req.Msg.GetIncarnation() == "" {
		name := req.Msg.GetName()
		got, err := describe(ctx, a, req, name)
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			return nil, err
		case err != nil:
			return nil, fmt.Errorf("client: admin DeleteStream %q: looking up its incarnation: %w", name, err)
		}
		// The caller's request is theirs: send a copy.
		msg := proto.CloneOf(req.Msg)
		msg.Incarnation = got.Msg.GetAssignment().GetIncarnation()
		next := connect.NewRequest(msg)
		copyHeader(next, req)
		req = next
	}
	res, earlier, err := adminRetry(ctx, a, "DeleteStream", req, strandv1connect.AdminServiceClient.DeleteStream)
	if err != nil && earlier && gone(err, req.Msg) {
		return connect.NewResponse(&strandv1.DeleteStreamResponse{}), nil
	}
	return res, err
}

// gone reports whether err, answered to a delete, says the stream req
// names is not there: no stream has the name, or one of another
// incarnation does.
func gone(err error, req *strandv1.DeleteStreamRequest) bool {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return true
	case connect.CodeFailedPrecondition:
		// Only the refusal of another incarnation, its typed violation
		// naming the field (a FailedPrecondition for anything else leaves
		// the stream there).
		v, ok := rpcerr.Precondition(err, rpcerr.PreconditionIncarnation)
		return req.GetIncarnation() != "" && ok && v.GetSubject() == "incarnation"
	}
	return false
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

func (a *adminClient) DrainBroker(ctx context.Context, req *connect.Request[strandv1.DrainBrokerRequest]) (*connect.Response[strandv1.DrainBrokerResponse], error) {
	return adminCall(ctx, a, "DrainBroker", req, strandv1connect.AdminServiceClient.DrainBroker)
}

func (a *adminClient) UndrainBroker(ctx context.Context, req *connect.Request[strandv1.UndrainBrokerRequest]) (*connect.Response[strandv1.UndrainBrokerResponse], error) {
	return adminCall(ctx, a, "UndrainBroker", req, strandv1connect.AdminServiceClient.UndrainBroker)
}

func (a *adminClient) GetRebalancePlan(ctx context.Context, req *connect.Request[strandv1.GetRebalancePlanRequest]) (*connect.Response[strandv1.GetRebalancePlanResponse], error) {
	return adminCall(ctx, a, "GetRebalancePlan", req, strandv1connect.AdminServiceClient.GetRebalancePlan)
}

var _ strandv1connect.AdminServiceClient = (*adminClient)(nil)
