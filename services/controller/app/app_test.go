package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
)

var schema = cluster.NewSchema("")

// harness is one embedded etcd with controllers and fake brokers, whose
// registrations and heartbeats are written into the real etcd on leases.
type harness struct {
	t      *testing.T
	etcd   *etcdtest.Server
	cli    *clientv3.Client
	leases map[string]clientv3.LeaseID
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	e := etcdtest.Start(t)
	return &harness{t: t, etcd: e, cli: e.Client(t), leases: map[string]clientv3.LeaseID{}}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// controller starts a controller app and waits until it has joined the
// election.
func (h *harness) controller(cfg Config) *App {
	h.t.Helper()
	return h.controllerOn(cfg, h.etcd.Endpoints)
}

// controllerOn is controller reaching etcd at endpoints.
func (h *harness) controllerOn(cfg Config, endpoints []string) *App {
	h.t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Etcd = endpoints
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	cfg.LogWriter = &bytes.Buffer{}
	cfg.TLS.Insecure = true
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	a, err := Start(ctxT(h.t), cfg)
	if err != nil {
		h.t.Fatalf("start controller: %v", err)
	}
	h.t.Cleanup(func() { _ = a.Close() })
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		h.t.Fatal("controller not ready")
	}
	return a
}

// leader starts a controller and waits until it leads.
func (h *harness) leader(cfg Config) (*App, strandv1connect.AdminServiceClient) {
	h.t.Helper()
	a := h.controller(cfg)
	clustertest.Eventually(h.t, 15*time.Second, "controller leads", a.Leading)
	return a, adminClient(a.Addr())
}

func adminClient(addr string) strandv1connect.AdminServiceClient {
	return strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(addr))
}

// broker registers a fake broker on its own lease.
func (h *harness) broker(node string) { h.brokerAt(node, "127.0.0.1:1") }

// brokerAt registers a broker reached at addr on its own lease.
func (h *harness) brokerAt(node, addr string) {
	h.t.Helper()
	ctx := ctxT(h.t)
	l, err := h.cli.Grant(ctx, 60)
	if err != nil {
		h.t.Fatal(err)
	}
	h.leases[node] = l.ID
	info := cluster.BrokerInfo{Node: node, Address: addr, StartTime: time.Now().UTC()}
	if _, err := h.cli.Put(ctx, schema.BrokerKey(node), cluster.Encode(info), clientv3.WithLease(l.ID)); err != nil {
		h.t.Fatal(err)
	}
}

// heartbeat publishes node's copy tails on its lease in one transaction:
// every shard that holds a copy, and shard 0, as a broker does on
// registering.
func (h *harness) heartbeat(node string, streams map[string]cluster.CopyTails) {
	h.t.Helper()
	var shards [cluster.HeartbeatShards]map[string]cluster.CopyTails
	for i := range shards {
		shards[i] = map[string]cluster.CopyTails{}
	}
	for stream, t := range streams {
		shards[cluster.HeartbeatShard(stream)][stream] = t
	}
	ops := make([]clientv3.Op, 0, len(shards))
	for i, m := range shards {
		if len(m) == 0 && i != 0 {
			continue
		}
		hb := cluster.Heartbeat{Node: node, Shard: i, Time: time.Now().UTC(), Streams: m}
		ops = append(ops, clientv3.OpPut(schema.HeartbeatKey(node, i), cluster.Encode(hb), clientv3.WithLease(h.leases[node])))
	}
	if _, err := h.cli.Txn(ctxT(h.t)).Then(ops...).Commit(); err != nil {
		h.t.Fatal(err)
	}
}

// kill revokes node's lease, as a clean shutdown does and as lease expiry
// ends: its broker and heartbeat keys disappear.
func (h *harness) kill(node string) {
	h.t.Helper()
	if _, err := h.cli.Revoke(ctxT(h.t), h.leases[node]); err != nil {
		h.t.Fatal(err)
	}
}

// dump returns every stored key and value outside the election.
func (h *harness) dump() map[string]string {
	h.t.Helper()
	resp, err := h.cli.Get(ctxT(h.t), schema.Prefix()+"/", clientv3.WithPrefix())
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		if !strings.HasPrefix(string(kv.Key), schema.Prefix()+"/election/") {
			out[string(kv.Key)] = string(kv.Value)
		}
	}
	return out
}

func get[T any](h *harness, key string) (T, bool) {
	h.t.Helper()
	resp, err := h.cli.Get(ctxT(h.t), key)
	if err != nil {
		h.t.Fatal(err)
	}
	var zero T
	if len(resp.Kvs) == 0 {
		return zero, false
	}
	v, err := cluster.Decode[T](resp.Kvs[0].Value)
	if err != nil {
		h.t.Fatal(err)
	}
	return v, true
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
}

func create(t *testing.T, c strandv1connect.AdminServiceClient, name string, copies uint32, policy *strandv1.ConfirmPolicy) *strandv1.CreateStreamResponse {
	t.Helper()
	resp, err := c.CreateStream(ctxT(t), connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: copies, Policy: policy}))
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return resp.Msg
}

func TestCreateGetListDelete(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3"} {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	ctx := ctxT(t)

	created := create(t, c, "orders", 3, nil)
	if a := created.GetAssignment(); a.GetEpoch() != 1 || a.GetPolicy().GetName() != cluster.MajorityDurable || len(a.GetFollowers()) != 2 {
		t.Fatalf("assignment = %v, want epoch 1, majority_durable, 2 followers", a)
	}
	spec, ok := get[cluster.StreamSpec](h, schema.StreamKey("orders"))
	if !ok || spec.Copies != 3 || spec.Policy.Name != cluster.MajorityDurable {
		t.Fatalf("stored spec = %+v %v", spec, ok)
	}
	asg, ok := get[cluster.Assignment](h, schema.AssignmentKey("orders"))
	if !ok || asg.Epoch != 1 || asg.Owner != created.GetAssignment().GetOwner() || asg.Policy != spec.Policy {
		t.Fatalf("stored assignment = %+v %v", asg, ok)
	}
	members := asg.Members()
	slices.Sort(members)
	if !slices.Equal(members, []string{"b1", "b2", "b3"}) {
		t.Fatalf("members %v, want b1 b2 b3 each once", members)
	}

	// The second follower is below the owner's confirm watermark by more
	// than the slack of published tails (cluster.InSyncSlack).
	h.heartbeat(asg.Owner, map[string]cluster.CopyTails{"orders": {Epoch: 1, Role: cluster.RoleOwner, RecordTail: 2010, ConfirmWatermark: 2008}})
	h.heartbeat(asg.Followers[0], map[string]cluster.CopyTails{"orders": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 2008}})
	h.heartbeat(asg.Followers[1], map[string]cluster.CopyTails{"orders": {Epoch: 1, Role: cluster.RoleFollower, RecordTail: 5}})
	got, err := c.GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: "orders"}))
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]*strandv1.CopyStatus{}
	for _, cs := range got.Msg.GetCopies() {
		byNode[cs.GetNode()] = cs
	}
	if o := byNode[asg.Owner]; o.GetRole() != cluster.RoleOwner || !o.GetInSync() || o.GetLag() != 0 || !o.GetLive() {
		t.Errorf("owner status %v", o)
	}
	if f := byNode[asg.Followers[0]]; f.GetLag() != 2 || !f.GetInSync() {
		t.Errorf("caught-up follower status %v, want lag 2 in sync", f)
	}
	if f := byNode[asg.Followers[1]]; f.GetLag() != 2005 || f.GetInSync() || f.GetState() != "lagging" {
		t.Errorf("lagging follower status %v, want lag 2005 not in sync", f)
	}
	incarnation := got.Msg.GetAssignment().GetIncarnation()
	if incarnation == "" || incarnation != asg.Incarnation || incarnation != created.GetAssignment().GetIncarnation() {
		t.Fatalf("GetStream incarnation %q, created %q, stored %q: want the stored one, not empty",
			incarnation, created.GetAssignment().GetIncarnation(), asg.Incarnation)
	}

	create(t, c, "audit", 1, &strandv1.ConfirmPolicy{Name: cluster.LocalDurable})
	list, err := c.ListStreams(ctx, connect.NewRequest(&strandv1.ListStreamsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Msg.GetStreams() {
		names = append(names, s.GetSpec().GetName())
	}
	if !slices.Equal(names, []string{"audit", "orders"}) {
		t.Fatalf("ListStreams = %v", names)
	}
	brokers, err := c.ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(brokers.Msg.GetBrokers()) != 3 || !brokers.Msg.GetBrokers()[0].GetLive() || brokers.Msg.GetBrokers()[0].GetNode() != "b1" {
		t.Fatalf("ListBrokers = %v", brokers.Msg.GetBrokers())
	}

	// A history start left behind must not survive a delete and recreate.
	if _, err := h.cli.Put(ctx, schema.HistoryKey("orders"), cluster.Encode(cluster.HistoryStarts{{Epoch: 2, RecordTail: 9, Node: "b2"}})); err != nil {
		t.Fatal(err)
	}
	// So must seal refusals recorded beside a recovery.
	if _, err := h.cli.Put(ctx, schema.RefusalsKey("orders"), cluster.Encode(cluster.SealRefusals{Stream: "orders", FenceEpoch: 2, TransitionID: "t"})); err != nil {
		t.Fatal(err)
	}
	// A delete of another life of the name leaves this one alone.
	before := h.dump()
	_, err = c.DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "orders", Incarnation: "other"}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	if msg := errMessage(err); !strings.HasPrefix(msg, "incarnation: ") || !strings.Contains(msg, incarnation) || !strings.Contains(msg, "other") {
		t.Errorf("error %q does not name field incarnation and both values", msg)
	}
	if after := h.dump(); !maps.Equal(before, after) {
		t.Errorf("delete of another incarnation changed stored state:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := c.GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: "orders"})); err != nil {
		t.Fatalf("stream after a delete of another incarnation: %v", err)
	}
	if _, err := c.DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "orders", Incarnation: incarnation})); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{schema.StreamKey("orders"), schema.AssignmentKey("orders"), schema.HistoryKey("orders"), schema.RecoveryKey("orders"), schema.RefusalsKey("orders")} {
		if _, ok := h.dump()[k]; ok {
			t.Errorf("%s survived the delete", k)
		}
	}
	_, err = c.GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: "orders"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "orders"}))
	wantCode(t, err, connect.CodeNotFound)

	// A leftover history start or seal refusals are dropped by create too.
	if _, err := h.cli.Put(ctx, schema.HistoryKey("orders"), cluster.Encode(cluster.HistoryStarts{{Epoch: 2, RecordTail: 9, Node: "b2"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Put(ctx, schema.RefusalsKey("orders"), cluster.Encode(cluster.SealRefusals{Stream: "orders", FenceEpoch: 2, TransitionID: "t"})); err != nil {
		t.Fatal(err)
	}
	if again := create(t, c, "orders", 1, nil).GetAssignment().GetIncarnation(); again == "" || again == incarnation {
		t.Errorf("recreated stream has incarnation %q, want a new one (not %q)", again, incarnation)
	}
	if _, ok := h.dump()[schema.HistoryKey("orders")]; ok {
		t.Error("recreated stream inherited history starts")
	}
	if _, ok := h.dump()[schema.RefusalsKey("orders")]; ok {
		t.Error("recreated stream inherited seal refusals")
	}
}

func TestPlacementSpreadsCopies(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"b1", "b2", "b3", "b4"} {
		h.broker(n)
	}
	_, c := h.leader(Config{})
	copies := map[string]int{}
	owners := map[string]int{}
	for i := range 4 {
		a := create(t, c, fmt.Sprintf("s%d", i), 3, nil).GetAssignment()
		members := append([]string{a.GetOwner()}, a.GetFollowers()...)
		seen := map[string]bool{}
		for _, m := range members {
			if seen[m] {
				t.Fatalf("s%d: %s holds two copies: %v", i, m, members)
			}
			seen[m] = true
			copies[m]++
		}
		owners[a.GetOwner()]++
	}
	// 12 copies on 4 brokers, fewest-first: 3 each; 4 owners, one each.
	for _, n := range []string{"b1", "b2", "b3", "b4"} {
		if copies[n] != 3 || owners[n] != 1 {
			t.Errorf("%s: %d copies, %d owned; want 3 and 1 (copies %v owners %v)", n, copies[n], owners[n], copies, owners)
		}
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	h.broker("b2")
	a, c := h.leader(Config{})
	addr := a.Addr()
	create(t, c, "exists", 1, nil)
	ctx := ctxT(t)

	cases := []struct {
		name  string
		call  func() error
		code  connect.Code
		field string
	}{
		{"empty name", func() error { return createErr(ctx, c, "", 1, nil) }, connect.CodeInvalidArgument, "name"},
		{"upper-case name", func() error { return createErr(ctx, c, "Orders", 1, nil) }, connect.CodeInvalidArgument, "name"},
		{"slash in name", func() error { return createErr(ctx, c, "a/b", 1, nil) }, connect.CodeInvalidArgument, "name"},
		{"long name", func() error { return createErr(ctx, c, strings.Repeat("a", 129), 1, nil) }, connect.CodeInvalidArgument, "name"},
		{"copies 8", func() error { return createErr(ctx, c, "s", 8, nil) }, connect.CodeInvalidArgument, "copies"},
		{"copies above live brokers", func() error { return createErr(ctx, c, "s", 3, nil) }, connect.CodeFailedPrecondition, "copies"},
		{"unknown policy", func() error { return createErr(ctx, c, "s", 1, &strandv1.ConfirmPolicy{Name: "bogus"}) }, connect.CodeInvalidArgument, "policy"},
		{"replica_durable without nodes", func() error {
			return createErr(ctx, c, "s", 1, &strandv1.ConfirmPolicy{Name: cluster.ReplicaDurable})
		}, connect.CodeInvalidArgument, "policy"},
		{"nodes without a name", func() error { return createErr(ctx, c, "s", 1, &strandv1.ConfirmPolicy{Nodes: 2}) }, connect.CodeInvalidArgument, "policy"},
		{"existing stream", func() error { return createErr(ctx, c, "exists", 1, nil) }, connect.CodeAlreadyExists, ""},
		{"delete bad name", func() error {
			_, err := c.DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "-x"}))
			return err
		}, connect.CodeInvalidArgument, "name"},
		{"delete unknown", func() error {
			_, err := c.DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "nope"}))
			return err
		}, connect.CodeNotFound, ""},
		{"get unknown", func() error {
			_, err := c.GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: "nope"}))
			return err
		}, connect.CodeNotFound, ""},
		{"update copies 9", func() error {
			_, err := c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "exists", Copies: 9}))
			return err
		}, connect.CodeInvalidArgument, "copies"},
		{"update unknown policy", func() error {
			_, err := c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "exists", Policy: &strandv1.ConfirmPolicy{Name: "x"}}))
			return err
		}, connect.CodeInvalidArgument, "policy"},
		{"update copies above live brokers", func() error {
			_, err := c.UpdateStream(ctx, connect.NewRequest(&strandv1.UpdateStreamRequest{Name: "exists", Copies: 3}))
			return err
		}, connect.CodeFailedPrecondition, "copies"},
		{"accept-loss bad node", func() error {
			_, err := c.AcceptOwnerLoss(ctx, connect.NewRequest(&strandv1.AcceptOwnerLossRequest{Stream: "exists", Node: "a b"}))
			return err
		}, connect.CodeInvalidArgument, "node"},
		{"accept-loss live owner", func() error {
			_, err := c.AcceptOwnerLoss(ctx, connect.NewRequest(&strandv1.AcceptOwnerLossRequest{Stream: "exists"}))
			return err
		}, connect.CodeFailedPrecondition, ""},
		{"withdraw without recovery", func() error {
			_, err := c.WithdrawRecovery(ctx, connect.NewRequest(&strandv1.WithdrawRecoveryRequest{Stream: "exists"}))
			return err
		}, connect.CodeNotFound, ""},
		{"failover bad stream", func() error {
			_, err := c.Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: ""}))
			return err
		}, connect.CodeInvalidArgument, "stream"},
		{"failover with a note too long", func() error {
			_, err := c.Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: "exists", Why: strings.Repeat("<", 300000)}))
			return err
		}, connect.CodeInvalidArgument, "why"},
		{"withdraw with a name too long", func() error {
			_, err := c.WithdrawRecovery(ctx, connect.NewRequest(&strandv1.WithdrawRecoveryRequest{Stream: "exists", Who: strings.Repeat("w", 2000)}))
			return err
		}, connect.CodeInvalidArgument, "who"},
		{"failover single copy", func() error {
			_, err := c.Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: "exists"}))
			return err
		}, connect.CodeFailedPrecondition, ""},
		// Above the read limit, as sent or as inflated: refused before it
		// is decoded (rpcserver.ReadLimit).
		{"request above the read limit", func() error {
			_, err := c.CreateStream(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.CreateStreamRequest{Name: "big", Copies: 1}, 2<<20)))
			return err
		}, connect.CodeResourceExhausted, ""},
		{"gzip request inflating past the read limit", func() error {
			gz := strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(addr), connect.WithSendGzip())
			_, err := gz.CreateStream(ctx, connect.NewRequest(clustertest.WithUnknownField(&strandv1.CreateStreamRequest{Name: "bomb", Copies: 1}, 64<<20)))
			return err
		}, connect.CodeResourceExhausted, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := h.dump()
			err := tc.call()
			wantCode(t, err, tc.code)
			if tc.field != "" && !strings.HasPrefix(errMessage(err), tc.field+": ") {
				t.Errorf("error %q does not name field %q", errMessage(err), tc.field)
			}
			// The field travels as a typed detail too, so no program has
			// to read the message (docs/errors.md).
			if got := detailField(err); got != tc.field {
				t.Errorf("error %v carries field %q in its details, want %q", err, got, tc.field)
			}
			if after := h.dump(); !maps.Equal(before, after) {
				t.Errorf("stored state changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// detailField is the request field err's typed details name: a BadRequest
// field violation, or the subject of a PreconditionFailure; "" for none.
func detailField(err error) string {
	if fv := rpcerr.FieldViolations(err); len(fv) == 1 {
		return fv[0].GetField()
	}
	for _, kind := range []string{rpcerr.PreconditionPlacement, rpcerr.PreconditionIncarnation} {
		if v, ok := rpcerr.Precondition(err, kind); ok {
			return v.GetSubject()
		}
	}
	return ""
}

func errMessage(err error) string {
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr.Message()
	}
	return ""
}

func createErr(ctx context.Context, c strandv1connect.AdminServiceClient, name string, copies uint32, p *strandv1.ConfirmPolicy) error {
	_, err := c.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: copies, Policy: p}))
	return err
}

func TestLeaderFailover(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	first, c1 := h.leader(Config{Name: "c1"})
	second := h.controller(Config{Name: "c2"})
	c2 := adminClient(second.Addr())

	// The follower refuses and names the leader, in its message for
	// people and in a LeaderHint for programs.
	_, err := c2.ListStreams(ctxT(t), connect.NewRequest(&strandv1.ListStreamsRequest{}))
	wantCode(t, err, connect.CodeUnavailable)
	if want := "not the controller leader; leader is at " + first.Addr(); errMessage(err) != want {
		t.Fatalf("follower said %q, want %q", errMessage(err), want)
	}
	if hint, ok := rpcerr.LeaderHint(err); !ok || hint.GetAddress() != first.Addr() {
		t.Fatalf("follower's leader hint %v (%v), want address %s", hint, ok, first.Addr())
	}
	create(t, c1, "s", 1, nil)

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 15*time.Second, "second controller leads", second.Leading)
	got, err := c2.GetStream(ctxT(t), connect.NewRequest(&strandv1.GetStreamRequest{Name: "s"}))
	if err != nil {
		t.Fatalf("new leader GetStream: %v", err)
	}
	if got.Msg.GetAssignment().GetOwner() != "b1" {
		t.Fatalf("assignment %v", got.Msg.GetAssignment())
	}
	create(t, c2, "t", 1, nil)
}

func TestLeaderLosesSession(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	first, _ := h.leader(Config{Name: "c1"})
	second := h.controller(Config{Name: "c2"})

	// Revoke the leader's election lease, as its expiry would.
	resp, err := h.cli.Get(ctxT(t), schema.ControllerElection()+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != first.Addr() {
		t.Fatalf("election leader %v %v, want %s", resp, err, first.Addr())
	}
	if _, err := h.cli.Revoke(ctxT(t), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 15*time.Second, "second controller leads", second.Leading)
	clustertest.Eventually(t, 15*time.Second, "first controller stops leading", func() bool { return !first.Leading() })
	// The first campaigns again and now points at the second.
	clustertest.Eventually(t, 15*time.Second, "first names the new leader", func() bool {
		_, err := adminClient(first.Addr()).ListStreams(ctxT(t), connect.NewRequest(&strandv1.ListStreamsRequest{}))
		hint, ok := rpcerr.LeaderHint(err)
		return ok && hint.GetAddress() == second.Addr()
	})
	if _, err := adminClient(second.Addr()).ListStreams(ctxT(t), connect.NewRequest(&strandv1.ListStreamsRequest{})); err != nil {
		t.Fatalf("new leader: %v", err)
	}
}

// TestStandbyLeadsAfterHistoryCompacted: a standby controller waits in its
// campaign while etcd compacts its history (docs/etcd.md: compaction is on
// in every etcd Strand starts), so the revision its election key was made
// at is gone by the time it leads. It keeps the term it won: the watch that
// ends a term starts from a revision just read, not from the key's.
func TestStandbyLeadsAfterHistoryCompacted(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	first, c1 := h.leader(Config{Name: "c1"})
	second := h.controller(Config{Name: "c2"})
	keyOf := func(addr string) (string, int64) {
		t.Helper()
		resp, err := h.cli.Get(ctxT(t), schema.ControllerElection()+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Value) == addr {
				return string(kv.Key), kv.CreateRevision
			}
		}
		t.Fatalf("no election key of %s in %v", addr, resp.Kvs)
		return "", 0
	}
	clustertest.Eventually(t, 15*time.Second, "second controller campaigns", func() bool {
		resp, err := h.cli.Get(ctxT(t), schema.ControllerElection()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	key, created := keyOf(second.Addr())
	// Writes after the key, so the history compacted away reaches past it.
	create(t, c1, "s", 1, nil)
	create(t, c1, "u", 1, nil)
	rev, err := h.cli.Get(ctxT(t), "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Compact(ctxT(t), rev.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 15*time.Second, "second controller leads", second.Leading)
	// etcd answers a watch from a compacted revision in a background pass
	// over the watches not caught up; once one made after the second
	// controller began to lead has its answer, the second's has too.
	wctx, wcancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer wcancel()
	if wr := <-h.cli.Watch(wctx, "/nothing", clientv3.WithRev(1)); wr.CompactRevision == 0 {
		t.Fatalf("a watch from revision 1 after compaction: %+v", wr)
	}
	// A term given up would end within a round trip of that answer; each
	// of these needs the term, and they take many round trips.
	for i := range 5 {
		create(t, adminClient(second.Addr()), fmt.Sprintf("t%d", i), 1, nil)
	}
	if k, c := keyOf(second.Addr()); k != key || c != created || !second.Leading() {
		t.Fatalf("second controller leads %v under key %s created at %d, want the key %s created at %d it campaigned with (it gave up its term)",
			second.Leading(), k, c, key, created)
	}
}

// A leader whose election keep-alives still reach etcd while their answers
// come late (a saturated machine) keeps its term: its client gives the
// session up, the lease lives on in etcd and is resumed, so the election
// key is never deleted and the standby never leads. Ending the term
// instead would hand the cluster to a controller starting from nothing.
func TestLeaderKeepsTermThroughLateKeepAliveAnswers(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	fwd := h.etcd.Forward(t)
	first := h.controllerOn(Config{Name: "c1", SessionTTL: 2}, []string{"http://" + fwd.Addr()})
	clustertest.Eventually(t, 15*time.Second, "controller leads", first.Leading)
	second := h.controller(Config{Name: "c2"})
	leaderKey := func() (int64, string) {
		t.Helper()
		resp, err := h.cli.Get(ctxT(t), schema.ControllerElection()+"/", clientv3.WithFirstCreate()...)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("election leader: %v %v", resp, err)
		}
		return resp.Kvs[0].CreateRevision, string(resp.Kvs[0].Value)
	}
	created, addr := leaderKey()
	if addr != first.Addr() {
		t.Fatalf("leader %s, want %s", addr, first.Addr())
	}

	fwd.HoldReplies()
	clustertest.Eventually(t, 30*time.Second, "the election session lapsed", func() bool { return first.leases.Lapsed.Load() >= 1 })
	fwd.ReleaseReplies()
	clustertest.Eventually(t, 15*time.Second, "the election lease resumed", func() bool { return first.leases.Resumed.Load() >= 1 })
	if got, addr := leaderKey(); got != created || addr != first.Addr() {
		t.Fatalf("leader key created at %d by %s, want %d by %s: the term ended", got, addr, created, first.Addr())
	}
	if !first.Leading() || second.Leading() {
		t.Fatalf("first leads %v, second leads %v; want true, false", first.Leading(), second.Leading())
	}
	if _, err := adminClient(first.Addr()).ListStreams(ctxT(t), connect.NewRequest(&strandv1.ListStreamsRequest{})); err != nil {
		t.Fatalf("leader after the resume: %v", err)
	}
}
