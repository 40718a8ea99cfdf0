// Package admin serves strand.v1.AdminService on the controller leader:
// stream lifecycle and placement, status, attention and operator actions.
// Every write is a guarded etcd transaction that also compares the leader's
// election key, so a deposed leader changes nothing; bad input is rejected
// before anything is written.
package admin

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/rebalance"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// MaxCopies bounds E.
const MaxCopies = 7

// Config is what the admin service needs.
type Config struct {
	// View is the controller's view of the cluster, which every call
	// reads (brought up to the current revision first).
	View          *state.View
	Schema        cluster.Schema
	Gate          *leader.Gate
	DefaultPolicy cluster.Policy
	Log           zerolog.Logger
	// Memory is what the liveness loop remembers between snapshots (who a
	// change of assignment left out, since when copies are out of sync);
	// nil remembers nothing.
	Memory *attention.Memory
	// Now defaults to time.Now.
	Now func() time.Time
	// MaxCalls bounds the admin calls served at once, MaxQueued those
	// waiting for their turn, and QueueWait how long one waits; a call
	// beyond them is refused with ErrBusy (Unavailable). Zero means
	// DefaultMaxCalls, DefaultMaxQueued, DefaultQueueWait.
	MaxCalls  int
	MaxQueued int
	QueueWait time.Duration
	// KV reads and writes tokens and grants (auth.go); nil answers the
	// token and permission calls Unimplemented.
	KV clientv3.KV
	// Mover makes handovers (Failover with a target, drains); nil refuses
	// a failover with a target as Unavailable.
	Mover *rebalance.Mover
}

// Service implements strandv1connect.AdminServiceHandler.
type Service struct {
	schema cluster.Schema
	gate   *leader.Gate
	policy cluster.Policy
	log    zerolog.Logger
	mem    *attention.Memory
	now    func() time.Time
	// admission bounds the calls served at once (admit).
	admission *admission
	// loads is the placement load of the newest snapshot placed on.
	loads loads
	// view hands out fresh snapshots, one read shared by the calls at once
	// (state.View.Fresh).
	view  *state.View
	kv    clientv3.KV
	mover *rebalance.Mover
}

var _ strandv1connect.AdminServiceHandler = (*Service)(nil)

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxCalls <= 0 {
		cfg.MaxCalls = DefaultMaxCalls
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = DefaultQueueWait
	}
	return &Service{schema: cfg.Schema, gate: cfg.Gate, policy: cfg.DefaultPolicy, log: cfg.Log, mem: cfg.Memory, now: cfg.Now,
		admission: newAdmission(cfg.MaxCalls, cfg.MaxQueued, cfg.QueueWait), view: cfg.View, kv: cfg.KV, mover: cfg.Mover}
}

// lead returns the current term and a snapshot, or the Unavailable a
// non-leader answers (docs/api.md, "Controller leadership").
//
// The snapshot is the view's, brought up to etcd's current revision: a
// call sees every write finished before it (a stream created or deleted by
// the call before), without reading the whole prefix; calls at once share
// one such read (state.View.Fresh). A write still
// compares the mod revisions it read, and one that lost a race to a write
// made since is made again from a newer snapshot.
func (s *Service) lead(ctx context.Context) (*leader.Term, *state.Snapshot, error) {
	term := s.gate.Term()
	if term == nil {
		// The leader hint is how a client finds the leader; a failed read
		// of the election sends none, and the client backs off and asks
		// again.
		addr, err := s.gate.LeaderAddr(ctx)
		if err != nil {
			addr = ""
		}
		return nil, nil, rpcerr.NotLeader(addr)
	}
	snap, err := s.view.Fresh(ctx)
	if err != nil {
		return nil, nil, s.toConnect(err)
	}
	return term, snap, nil
}

func (s *Service) committer(t *leader.Term) transition.Committer {
	return transition.Committer{Term: t, Schema: s.schema}
}

func validateName(field, name string) error {
	if err := cluster.ValidateStreamName(name); err != nil {
		return rpcerr.InvalidArgument(field, "%v", err)
	}
	return nil
}

func validateCopies(c uint32) error {
	if c > MaxCopies {
		return rpcerr.InvalidArgument("copies", "must be between 1 and %d, got %d", MaxCopies, c)
	}
	return nil
}

// requestPolicy reads an optional policy field: nil when absent.
func requestPolicy(p *strandv1.ConfirmPolicy) (*cluster.Policy, error) {
	if p == nil || (p.GetName() == "" && p.GetNodes() == 0) {
		return nil, nil
	}
	pol := policyFromProto(p)
	if pol.Name == "" {
		return nil, rpcerr.InvalidArgument("policy", "a nodes count needs a policy name")
	}
	if err := pol.Validate(); err != nil {
		return nil, rpcerr.InvalidArgument("policy", "%v", err)
	}
	return &pol, nil
}

// CreateStream places a new stream and writes its spec and epoch-1
// assignment in one transaction guarded by the stream key being absent.
func (s *Service) CreateStream(ctx context.Context, req *connect.Request[strandv1.CreateStreamRequest]) (*connect.Response[strandv1.CreateStreamResponse], error) {
	m := req.Msg
	if err := validateName("name", m.GetName()); err != nil {
		return nil, err
	}
	if err := validateCopies(m.GetCopies()); err != nil {
		return nil, err
	}
	copies := max(1, int(m.GetCopies()))
	pol, err := requestPolicy(m.GetPolicy())
	if err != nil {
		return nil, err
	}
	policy := s.policy
	if pol != nil {
		policy = *pol
	}
	if age := m.GetRetention().GetMaxAge(); age != nil && (age.CheckValid() != nil || age.AsDuration() < 0) {
		return nil, rpcerr.InvalidArgument("retention.max_age", "must be a non-negative duration")
	}
	retention := retentionFromProto(m.GetRetention())

	name := m.GetName()
	// Admitted once: the attempts below are the call's, not new calls.
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	for attempt := 0; ; attempt++ {
		term, snap, err := s.lead(ctx)
		if err != nil {
			return nil, err
		}
		_, hasSpec := snap.Streams[name]
		_, hasAsg := snap.Assignments[name]
		if hasSpec || hasAsg {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("stream %q already exists", name))
		}
		live := snap.LiveBrokers()
		if copies > len(live) {
			return nil, rpcerr.FieldPrecondition("copies", rpcerr.PreconditionPlacement, "%d copies need %d live brokers, %d are live", copies, copies, len(live))
		}
		owner, followers, placed, err := s.loads.place(snap, name, copies)
		if err != nil {
			return nil, rpcerr.FieldPrecondition("copies", rpcerr.PreconditionPlacement, "%v", err)
		}
		spec := cluster.StreamSpec{Name: name, Copies: copies, Policy: policy, Retention: retention, Created: s.now().UTC()}
		asg := cluster.Assignment{Stream: name, Epoch: 1, Owner: owner, Followers: followers, Policy: policy, Retention: retention,
			Incarnation: transition.NewTransitionID()}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.schema.StreamKey(name)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.schema.AssignmentKey(name)), "=", 0),
		}
		// The chosen brokers must still be live when the placement commits.
		for _, n := range asg.Members() {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.schema.BrokerKey(n)), ">", 0))
		}
		resp, err := term.Txn(ctx, cmps, []clientv3.Op{
			clientv3.OpPut(s.schema.StreamKey(name), cluster.Encode(spec)),
			clientv3.OpPut(s.schema.AssignmentKey(name), cluster.Encode(asg)),
			// A recreated stream must not inherit the history starts or a
			// pending recovery (with its seal refusals) of the one deleted
			// before it.
			clientv3.OpDelete(s.schema.HistoryKey(name)),
			clientv3.OpDelete(s.schema.RecoveryKey(name)),
			clientv3.OpDelete(s.schema.RefusalsKey(name)),
		}, nil)
		// Counted until a snapshot holds the creation, or forgotten now if
		// it did not commit. A failed call's outcome is unknown: if it did
		// commit, the snapshot that holds it counts it from then on.
		committed := int64(0)
		if err == nil && resp.Succeeded {
			committed = resp.Header.Revision
		}
		placed(committed)
		if err != nil {
			return nil, s.toConnect(err)
		}
		if resp.Succeeded {
			s.log.Info().Str(logging.Stream, name).Str(logging.Owner, owner).Strs(logging.Followers, followers).
				Str(logging.Policy, policy.String()).Msg("stream created")
			return connect.NewResponse(&strandv1.CreateStreamResponse{Spec: specToProto(spec), Assignment: assignmentToProto(asg)}), nil
		}
		if attempt == 2 {
			return nil, s.toConnect(fmt.Errorf("%w: placing %s", transition.ErrConflict, name))
		}
	}
}

// DeleteStream drops the stream's spec, assignment, pending recovery (with
// its seal refusals) and history starts in one transaction (docs/protocol.md,
// "Copies with a longer tail": history starts of a stream that no longer has
// an assignment are dropped). A request
// naming an incarnation deletes only that life of the name: a retry must not
// delete a stream created again after its first attempt deleted the old one.
func (s *Service) DeleteStream(ctx context.Context, req *connect.Request[strandv1.DeleteStreamRequest]) (*connect.Response[strandv1.DeleteStreamResponse], error) {
	name := req.Msg.GetName()
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	term, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	spec, hasSpec := snap.Streams[name]
	asg, hasAsg := snap.Assignments[name]
	if !hasSpec && !hasAsg {
		return nil, s.toConnect(fmt.Errorf("%w: %q", transition.ErrNoStream, name))
	}
	// The guarded transaction below compares the assignment's revision, so
	// the incarnation checked here is the one deleted.
	if want := req.Msg.GetIncarnation(); want != "" && asg.Value.Incarnation != want {
		if !hasAsg {
			return nil, rpcerr.FieldPrecondition("incarnation", rpcerr.PreconditionIncarnation, "stream %q has no assignment, so not incarnation %q", name, want)
		}
		return nil, rpcerr.FieldPrecondition("incarnation", rpcerr.PreconditionIncarnation, "stream %q is incarnation %q, not %q", name, asg.Value.Incarnation, want)
	}
	resp, err := term.Txn(ctx, []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(s.schema.StreamKey(name)), "=", spec.ModRev),
		clientv3.Compare(clientv3.ModRevision(s.schema.AssignmentKey(name)), "=", asg.ModRev),
	}, []clientv3.Op{
		clientv3.OpDelete(s.schema.StreamKey(name)),
		clientv3.OpDelete(s.schema.AssignmentKey(name)),
		clientv3.OpDelete(s.schema.RecoveryKey(name)),
		clientv3.OpDelete(s.schema.RefusalsKey(name)),
		clientv3.OpDelete(s.schema.HistoryKey(name)),
	}, nil)
	if err != nil {
		return nil, s.toConnect(err)
	}
	if !resp.Succeeded {
		return nil, s.toConnect(fmt.Errorf("%w: deleting %s", transition.ErrConflict, name))
	}
	s.log.Info().Str(logging.Stream, name).Msg("stream deleted")
	return connect.NewResponse(&strandv1.DeleteStreamResponse{}), nil
}

// GetStream reports one stream.
func (s *Service) GetStream(ctx context.Context, req *connect.Request[strandv1.GetStreamRequest]) (*connect.Response[strandv1.GetStreamResponse], error) {
	name := req.Msg.GetName()
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	_, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	out, ok := streamStatus(snap, name, s.mem, attention.JudgeStream(snap, name, s.mem))
	if !ok {
		return nil, s.toConnect(fmt.Errorf("%w: %q", transition.ErrNoStream, name))
	}
	return connect.NewResponse(out), nil
}

// Pages of ListStreams: a request without a page size gets
// defaultPageSize streams, and none may ask for more than maxPageSize, so
// one response stays bounded however many streams there are.
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// ListStreams reports one page of streams, ordered by name. A page token
// names the last stream of the page before, so a page starts after it even
// when streams were created or deleted in between: every stream that
// exists throughout a listing is listed once.
func (s *Service) ListStreams(ctx context.Context, req *connect.Request[strandv1.ListStreamsRequest]) (*connect.Response[strandv1.ListStreamsResponse], error) {
	size := int(req.Msg.GetPageSize())
	switch {
	case size < 0 || size > maxPageSize:
		return nil, rpcerr.InvalidArgument("page_size", "must be between 0 and %d, got %d", maxPageSize, size)
	case size == 0:
		size = defaultPageSize
	}
	after, err := decodePageToken(req.Msg.GetPageToken())
	if err != nil {
		return nil, err
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	_, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	names := snap.StreamNames()
	start := 0
	if after != "" {
		i, found := slices.BinarySearch(names, after)
		if found {
			i++
		}
		start = i
	}
	end := min(start+size, len(names))
	out := &strandv1.ListStreamsResponse{}
	for _, name := range names[start:end] {
		if st, ok := streamStatus(snap, name, s.mem, attention.JudgeStream(snap, name, s.mem)); ok {
			out.Streams = append(out.Streams, st)
		}
	}
	if end < len(names) {
		out.NextPageToken = encodePageToken(names[end-1])
	}
	return connect.NewResponse(out), nil
}

// pageTokenPrefix marks a page token, so a token from elsewhere is told
// apart from a stream name.
const pageTokenPrefix = "after:"

func encodePageToken(last string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + last))
}

// decodePageToken returns the stream a page token names ("" for none).
func decodePageToken(token string) (string, error) {
	if token == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	last, ok := strings.CutPrefix(string(raw), pageTokenPrefix)
	if err != nil || !ok || last == "" {
		return "", rpcerr.InvalidArgument("page_token", "not a token a ListStreams response gave")
	}
	return last, nil
}

// ListBrokers reports registered brokers (live) and brokers that hold copies
// but are not registered (not live), ordered by node id.
func (s *Service) ListBrokers(ctx context.Context, _ *connect.Request[strandv1.ListBrokersRequest]) (*connect.Response[strandv1.ListBrokersResponse], error) {
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	_, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	out := &strandv1.ListBrokersResponse{}
	copies, owned := snap.CopyCounts()
	for _, n := range snap.LiveBrokers() {
		out.Brokers = append(out.Brokers, brokerStatus(snap, snap.Brokers[n], true, copies, owned))
	}
	var down []string
	for n := range copies {
		if !snap.Live(n) {
			down = append(down, n)
		}
	}
	for n := range snap.Draining {
		if !snap.Live(n) && copies[n] == 0 {
			down = append(down, n)
		}
	}
	slices.Sort(down)
	for _, n := range slices.Compact(down) {
		out.Brokers = append(out.Brokers, brokerStatus(snap, cluster.BrokerInfo{Node: n}, false, copies, owned))
	}
	return connect.NewResponse(out), nil
}

// ListAttention reports everything waiting, ordered by stream and kind.
func (s *Service) ListAttention(ctx context.Context, _ *connect.Request[strandv1.ListAttentionRequest]) (*connect.Response[strandv1.ListAttentionResponse], error) {
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	_, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	out := &strandv1.ListAttentionResponse{}
	for _, e := range attention.Judge(snap, s.mem) {
		out.Entries = append(out.Entries, attentionToProto(e))
	}
	return connect.NewResponse(out), nil
}
