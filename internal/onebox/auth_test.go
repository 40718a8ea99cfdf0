package onebox

import (
	"context"
	"errors"
	"fmt"
	"github.com/strandhq/strand/internal/clustertest"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/rpcserver"
)

// authWait bounds how long a grant or revoke may take to reach the
// brokers' and controllers' credential caches. The watch delivers it at
// once (well within a second on an idle machine); the bound is generous
// so a loaded test machine does not fail a correct cluster.
const authWait = 10 * time.Second

// authCluster is one broker and one controller checking credentials, with
// a publish limit of authRate bytes per second and authSubs subscriptions
// per principal.
const (
	authRate = 4096
	authSubs = 2
)

func startAuth(t *testing.T) *Cluster {
	return Start(t, Options{Brokers: []string{"b1"}, Controllers: 1,
		Auth: auth.Options{Enabled: true, PublishBytesPerSecond: authRate, MaxSubscriptions: authSubs}})
}

// token makes a token of principal through the admin API and grants it
// perm on each pattern.
func (c *Cluster) token(t *testing.T, principal string, grants ...string) (id, secret string) {
	t.Helper()
	res, err := c.Admin().CreateToken(c.Ctx(), connect.NewRequest(&strandv1.CreateTokenRequest{Principal: principal}))
	if err != nil {
		t.Fatalf("create token of %s: %v", principal, err)
	}
	for _, g := range grants {
		perm, streams, _ := strings.Cut(g, " ")
		c.grant(t, principal, perm, streams)
	}
	return res.Msg.GetToken().GetId(), res.Msg.GetSecret()
}

func (c *Cluster) grant(t *testing.T, principal, perm, streams string) {
	t.Helper()
	if _, err := c.Admin().GrantPermission(c.Ctx(), connect.NewRequest(&strandv1.GrantPermissionRequest{
		Principal: principal, Permission: perm, Streams: streams,
	})); err != nil {
		t.Fatalf("grant %s %s on %s: %v", principal, perm, streams, err)
	}
}

// streamsAs is a raw StreamService client of b1 sending secret.
func (c *Cluster) streamsAs(secret string) strandv1connect.StreamServiceClient {
	return strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(c.Addr("b1")), auth.WithBearer(secret))
}

// adminAs is a raw AdminService client of the controller sending secret.
func (c *Cluster) adminAs(secret string) strandv1connect.AdminServiceClient {
	return strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(c.ControllerAddr()), auth.WithBearer(secret))
}

func read(ctx context.Context, s strandv1connect.StreamServiceClient, stream string) ([]*strandv1.StoredRecord, error) {
	res, err := s.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: stream, FromEarliest: true}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetRecords(), nil
}

func publish(ctx context.Context, s strandv1connect.StreamServiceClient, stream string, payload []byte) error {
	_, err := s.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: []*strandv1.Record{{Payload: payload}}}))
	return err
}

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

// Every client-facing procedure of the generated services answers
// Unauthenticated to a call without credentials, and to one with a token
// nobody made, before anything reads its request's stream: iterating the
// descriptors, so a new RPC is covered the day it is added.
func TestAuthEveryProcedureNeedsCredentials(t *testing.T) {
	t.Parallel()
	c := startAuth(t)
	hc := rpcserver.HTTPClient()
	bogus, err := auth.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("strand.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				md := sd.Methods().Get(j)
				procedure := fmt.Sprintf("/%s/%s", sd.FullName(), md.Name())
				rule, ok := auth.Rules[procedure]
				if !ok {
					t.Errorf("%s: no rule (TestRulesCoverEveryProcedure)", procedure)
					continue
				}
				if rule.Scope == auth.Peer {
					// Under the peer token, not client credentials.
					continue
				}
				addr := c.Addr("b1")
				if sd.FullName() == strandv1connect.AdminServiceName {
					addr = c.ControllerAddr()
				}
				for _, cred := range []string{"", bogus, "not-a-strand-token"} {
					n++
					var opts []connect.ClientOption
					if cred != "" {
						opts = append(opts, auth.WithBearer(cred))
					}
					cl := connect.NewClient[emptypb.Empty, emptypb.Empty](hc, rpcserver.BaseURL(addr)+procedure, opts...)
					var err error
					switch {
					case md.IsStreamingServer() && !md.IsStreamingClient():
						var s *connect.ServerStreamForClient[emptypb.Empty]
						s, err = cl.CallServerStream(c.Ctx(), connect.NewRequest(&emptypb.Empty{}))
						if err == nil {
							s.Receive()
							err = s.Err()
							_ = s.Close()
						}
					case !md.IsStreamingServer() && !md.IsStreamingClient():
						_, err = cl.CallUnary(c.Ctx(), connect.NewRequest(&emptypb.Empty{}))
					default:
						t.Errorf("%s: a client streaming procedure for clients: add a case here", procedure)
						continue
					}
					if connect.CodeOf(err) != connect.CodeUnauthenticated {
						t.Errorf("%s with credentials %q: got %v, want Unauthenticated", procedure, cred, err)
					}
				}
			}
		}
		return true
	})
	if n == 0 {
		t.Fatal("no procedures called")
	}
}

// A principal that may read a stream prefix reads and subscribes, and is
// refused Publish and the admin calls with PermissionDenied naming the
// permission and the stream; the refused publish stores nothing. A grant
// made later takes effect without a restart.
func TestAuthReaderIsRefusedPublishAndAdmin(t *testing.T) {
	t.Parallel()
	c := startAuth(t)
	const stream = "orders.eu"
	c.CreateStream(stream, 1, majority)
	c.Publish("b1", stream, "first")
	_, secret := c.token(t, "reader", "read orders.*")
	r := c.streamsAs(secret)

	clustertest.Eventually(t, authWait, "the reader reads", func() error {
		recs, err := read(c.Ctx(), r, stream)
		if err == nil && len(recs) != 1 {
			return fmt.Errorf("%d records, want 1", len(recs))
		}
		return err
	})
	sub, err := r.Subscribe(c.Ctx(), connect.NewRequest(&strandv1.SubscribeRequest{Stream: stream, Start: strandv1.StartPosition_START_POSITION_EARLIEST}))
	if err != nil {
		t.Fatal(err)
	}
	// The first messages may carry only the confirm watermark.
	for got := 0; got == 0; got = len(sub.Msg().GetRecords()) {
		if !sub.Receive() {
			t.Fatalf("reader's subscription: %v", sub.Err())
		}
	}
	_ = sub.Close()

	err = publish(c.Ctx(), r, stream, []byte("not allowed"))
	wantCode(t, "reader publishes", err, connect.CodePermissionDenied)
	if msg := err.Error(); !strings.Contains(msg, "publish") || !strings.Contains(msg, stream) || !strings.Contains(msg, "reader") {
		t.Errorf("refusal %q names not the permission, the stream and the principal", msg)
	}
	var info *errdetails.ErrorInfo
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		for _, d := range cerr.Details() {
			if v, verr := d.Value(); verr == nil {
				if i, ok := v.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
		}
	}
	if info.GetMetadata()["permission"] != "publish" || info.GetMetadata()["stream"] != stream {
		t.Errorf("refusal's ErrorInfo %v: want permission publish and stream %s", info, stream)
	}
	// The Go client with the reader's token reads, and gives up on a
	// publish at once: a refusal is an answer, not a move.
	cl, err := client.New(client.Config{Brokers: c.Addrs(), Token: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Close() }()
	if res, err := cl.Read(c.Ctx(), &strandv1.ReadRequest{Stream: stream, FromEarliest: true}); err != nil || len(res.GetRecords()) != 1 {
		t.Fatalf("client read with the reader's token: %v, %v", res, err)
	}
	_, err = cl.Publish(c.Ctx(), stream, []*strandv1.Record{{Payload: []byte("not allowed")}})
	wantCode(t, "client publish with the reader's token", err, connect.CodePermissionDenied)
	// A stream outside the prefix is not readable either.
	_, err = read(c.Ctx(), r, "payments")
	wantCode(t, "reader reads outside its prefix", err, connect.CodePermissionDenied)

	adm := c.adminAs(secret)
	_, err = adm.CreateStream(c.Ctx(), connect.NewRequest(&strandv1.CreateStreamRequest{Name: "orders.us", Copies: 1}))
	wantCode(t, "reader creates a stream", err, connect.CodePermissionDenied)
	_, err = adm.DeleteStream(c.Ctx(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: stream}))
	wantCode(t, "reader deletes a stream", err, connect.CodePermissionDenied)
	_, err = adm.ListAttention(c.Ctx(), connect.NewRequest(&strandv1.ListAttentionRequest{}))
	wantCode(t, "reader lists attention", err, connect.CodePermissionDenied)
	_, err = adm.CreateToken(c.Ctx(), connect.NewRequest(&strandv1.CreateTokenRequest{Principal: "reader"}))
	wantCode(t, "reader makes itself a token", err, connect.CodePermissionDenied)
	_, err = adm.GrantPermission(c.Ctx(), connect.NewRequest(&strandv1.GrantPermissionRequest{Principal: "reader", Permission: "admin", Streams: "*"}))
	wantCode(t, "reader grants itself admin", err, connect.CodePermissionDenied)
	if _, err := adm.GetStream(c.Ctx(), connect.NewRequest(&strandv1.GetStreamRequest{Name: stream})); err != nil {
		t.Errorf("reader's GetStream of a stream it reads: %v", err)
	}
	if _, err := adm.ListBrokers(c.Ctx(), connect.NewRequest(&strandv1.ListBrokersRequest{})); err != nil {
		t.Errorf("reader's ListBrokers: %v", err)
	}

	recs, err := read(c.Ctx(), c.Streams("b1"), stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := Payloads(recs); len(got) != 1 || got[0] != "first" {
		t.Fatalf("after the refused publish the stream holds %q, want only [first]", got)
	}

	// Granted publish, the same token publishes.
	c.grant(t, "reader", "publish", stream)
	clustertest.Eventually(t, authWait, "the grant of publish takes effect", func() error {
		return publish(c.Ctx(), r, stream, []byte("second"))
	})
	// And revoked, it no longer does; reading still works.
	if res, err := c.Admin().RevokePermission(c.Ctx(), connect.NewRequest(&strandv1.RevokePermissionRequest{
		Principal: "reader", Permission: "publish", Streams: stream,
	})); err != nil || !res.Msg.GetRevoked() {
		t.Fatalf("revoke publish: %v, %v", res, err)
	}
	clustertest.Eventually(t, authWait, "the revoke of publish takes effect", func() error {
		if err := publish(c.Ctx(), r, stream, []byte("third")); connect.CodeOf(err) != connect.CodePermissionDenied {
			return fmt.Errorf("publish: %v, want PermissionDenied", err)
		}
		return nil
	})
	if _, err := read(c.Ctx(), r, stream); err != nil {
		t.Fatalf("reader reads after the revoke of publish: %v", err)
	}
}

// A revoked token stops working: by id, and every token of a principal
// at once. Tokens are listed without secrets.
func TestAuthRevokedTokenStops(t *testing.T) {
	t.Parallel()
	c := startAuth(t)
	const stream = "audit"
	c.CreateStream(stream, 1, majority)
	id, secret := c.token(t, "temp", "read "+stream)
	_, other1 := c.token(t, "batch")
	_, other2 := c.token(t, "batch", "read *")

	works := func(secret string) func() error {
		return func() error {
			_, err := read(c.Ctx(), c.streamsAs(secret), stream)
			return err
		}
	}
	clustertest.Eventually(t, authWait, "temp's token works", works(secret))
	clustertest.Eventually(t, authWait, "batch's tokens work", func() error {
		if err := works(other1)(); err != nil {
			return err
		}
		return works(other2)()
	})

	list, err := c.Admin().ListTokens(c.Ctx(), connect.NewRequest(&strandv1.ListTokensRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, tok := range list.Msg.GetTokens() {
		listed[tok.GetId()] = tok.GetPrincipal()
	}
	if listed[id] != "temp" || len(listed) != 4 {
		t.Fatalf("tokens listed %v: want 4 (the bootstrap admin's, temp's %s and batch's two)", listed, id)
	}
	// Nothing in etcd holds a secret.
	resp, err := c.Cli.Get(c.Ctx(), c.Schema.AuthDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		for _, s := range []string{secret, other1, other2, c.AdminToken} {
			if strings.Contains(string(kv.Value), strings.TrimPrefix(s, auth.TokenPrefix)) {
				t.Fatalf("etcd key %s holds a token secret", kv.Key)
			}
		}
	}

	res, err := c.Admin().RevokeToken(c.Ctx(), connect.NewRequest(&strandv1.RevokeTokenRequest{Id: id}))
	if err != nil || len(res.Msg.GetRevoked()) != 1 {
		t.Fatalf("revoke %s: %v, %v", id, res, err)
	}
	unauthenticated := func(secret string) func() error {
		return func() error {
			if err := works(secret)(); connect.CodeOf(err) != connect.CodeUnauthenticated {
				return fmt.Errorf("read: %v, want Unauthenticated", err)
			}
			return nil
		}
	}
	clustertest.Eventually(t, authWait, "the revoked token stops working", unauthenticated(secret))

	res, err = c.Admin().RevokeToken(c.Ctx(), connect.NewRequest(&strandv1.RevokeTokenRequest{Principal: "batch"}))
	if err != nil || len(res.Msg.GetRevoked()) != 2 {
		t.Fatalf("revoke batch's tokens: %v, %v", res, err)
	}
	clustertest.Eventually(t, authWait, "both of batch's tokens stop working", func() error {
		if err := unauthenticated(other1)(); err != nil {
			return err
		}
		return unauthenticated(other2)()
	})
	// The admin's own token is untouched.
	if err := works(c.AdminToken)(); err != nil {
		t.Fatalf("admin after the revokes: %v", err)
	}
	_, err = c.Admin().RevokeToken(c.Ctx(), connect.NewRequest(&strandv1.RevokeTokenRequest{Id: id, Principal: "temp"}))
	wantCode(t, "revoke naming both id and principal", err, connect.CodeInvalidArgument)
}

// A principal publishing faster than its limit is refused with
// ResourceExhausted and a RetryInfo saying when to retry; a single publish
// larger than a second's worth is refused without one; what is refused is
// not stored.
func TestAuthPublishRateLimit(t *testing.T) {
	t.Parallel()
	c := startAuth(t)
	const stream = "metrics"
	c.CreateStream(stream, 1, majority)
	_, secret := c.token(t, "fast", "publish "+stream)
	p := c.streamsAs(secret)
	clustertest.Eventually(t, authWait, "the grant takes effect", func() error {
		return publish(c.Ctx(), p, stream, []byte("x"))
	})
	stored := 1
	payload := make([]byte, authRate/4)
	var refused error
	// A second's worth is authRate bytes: unless each publish took more
	// than a quarter second, one of these is over the limit.
	for range 40 {
		err := publish(c.Ctx(), p, stream, payload)
		if err != nil {
			refused = err
			break
		}
		stored++
	}
	wantCode(t, "publishing above the limit", refused, connect.CodeResourceExhausted)
	if d := retryDelay(refused); d <= 0 || d > time.Second {
		t.Errorf("refusal %v: RetryInfo delay %v, want within a second", refused, d)
	}
	err := publish(c.Ctx(), p, stream, make([]byte, 2*authRate))
	wantCode(t, "a publish larger than the bucket", err, connect.CodeResourceExhausted)
	if d := retryDelay(err); d != 0 {
		t.Errorf("a publish no retry can pass told to retry in %v", d)
	}
	recs, err := read(c.Ctx(), c.Streams("b1"), stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != stored {
		t.Fatalf("%d records stored, want the %d publishes admitted", len(recs), stored)
	}
	// Another principal has a bucket of its own.
	if err := publish(c.Ctx(), c.Streams("b1"), stream, payload); err != nil {
		t.Fatalf("the admin's publish after fast's refusal: %v", err)
	}
}

// A principal holds at most authSubs subscriptions on a broker at once;
// one more is ResourceExhausted, and one ended frees its place.
func TestAuthSubscriptionLimit(t *testing.T) {
	t.Parallel()
	c := startAuth(t)
	const stream = "feed"
	c.CreateStream(stream, 1, majority)
	c.Publish("b1", stream, "r0")
	_, secret := c.token(t, "watcher", "read "+stream)
	s := c.streamsAs(secret)
	subscribe := func() (*connect.ServerStreamForClient[strandv1.SubscribeResponse], error) {
		sub, err := s.Subscribe(c.Ctx(), connect.NewRequest(&strandv1.SubscribeRequest{Stream: stream, Start: strandv1.StartPosition_START_POSITION_EARLIEST}))
		if err != nil {
			return nil, err
		}
		if !sub.Receive() {
			err := sub.Err()
			_ = sub.Close()
			return nil, err
		}
		return sub, nil
	}
	var open []*connect.ServerStreamForClient[strandv1.SubscribeResponse]
	clustertest.Eventually(t, authWait, "the grant takes effect", func() error {
		sub, err := subscribe()
		if err == nil {
			open = append(open, sub)
		}
		return err
	})
	for len(open) < authSubs {
		sub, err := subscribe()
		if err != nil {
			t.Fatalf("subscription %d of %d: %v", len(open)+1, authSubs, err)
		}
		open = append(open, sub)
	}
	_, err := subscribe()
	wantCode(t, "one subscription more than the limit", err, connect.CodeResourceExhausted)
	_ = open[0].Close()
	clustertest.Eventually(t, authWait, "an ended subscription frees its place", func() error {
		sub, err := subscribe()
		if err == nil {
			_ = sub.Close()
		}
		return err
	})
	for _, sub := range open[1:] {
		_ = sub.Close()
	}
}

// retryDelay is the RetryInfo delay of err (0: none).
func retryDelay(err error) time.Duration {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return 0
	}
	for _, d := range cerr.Details() {
		if v, verr := d.Value(); verr == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				return ri.GetRetryDelay().AsDuration()
			}
		}
	}
	return 0
}

// A principal the transport proved (a client certificate's subject, once
// TLS is on) is used when a call carries no token, through the
// auth.Options.Transport hook; here the hook names callers by their
// loopback address. A token, when sent, wins: an unknown one is refused
// even though the transport would name someone.
func TestAuthTransportPrincipal(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1"}, Controllers: 1, Auth: auth.Options{Enabled: true,
		Transport: func(_ context.Context, _ connect.Spec, peer connect.Peer, _ http.Header) (string, bool) {
			host, _, err := net.SplitHostPort(peer.Addr)
			return "node-loopback", err == nil && net.ParseIP(host).IsLoopback()
		}}})
	const stream = "telemetry"
	c.CreateStream(stream, 1, majority)
	anonymous := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(c.Addr("b1")))
	_, err := read(c.Ctx(), anonymous, stream)
	wantCode(t, "the transport's principal without a grant", err, connect.CodePermissionDenied)
	if !strings.Contains(err.Error(), "node-loopback") {
		t.Errorf("refusal %q does not name the transport's principal", err)
	}
	c.grant(t, "node-loopback", "read", stream)
	clustertest.Eventually(t, authWait, "the transport's principal reads once granted", func() error {
		_, err := read(c.Ctx(), anonymous, stream)
		return err
	})
	bogus, err := auth.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	_, err = read(c.Ctx(), c.streamsAs(bogus), stream)
	wantCode(t, "an unknown token with a transport principal", err, connect.CodeUnauthenticated)
}

// Each entry of a PublishMany needs publish on its own stream: a principal
// that only reads one of two streams has that entry refused with
// PermissionDenied naming the permission and the stream, and stores
// nothing there, while its entry of the stream it may publish to is
// stored. The entries count against its publish bytes as their Publishes
// would.
func TestAuthPublishManyChecksEachEntry(t *testing.T) {
	t.Parallel()
	c := startAuth(t)
	const mine, theirs = "mine.a", "theirs.b"
	c.CreateStream(mine, 1, majority)
	c.CreateStream(theirs, 1, majority)
	c.Publish("b1", theirs, "first")
	_, secret := c.token(t, "writer", "publish mine.*", "read mine.*", "read theirs.*")
	w := c.streamsAs(secret)
	req := &strandv1.PublishManyRequest{Publishes: []*strandv1.PublishRequest{
		{Stream: mine, Records: []*strandv1.Record{{Payload: []byte("mine")}}},
		{Stream: theirs, Records: []*strandv1.Record{{Payload: []byte("not allowed")}}},
	}}
	var res *connect.Response[strandv1.PublishManyResponse]
	clustertest.Eventually(t, authWait, "the writer's grants reach the broker", func() error {
		var err error
		res, err = w.PublishMany(c.Ctx(), connect.NewRequest(req))
		if err != nil {
			return err
		}
		if res.Msg.GetResults()[0].GetResponse() == nil {
			return fmt.Errorf("entry 0: %v", res.Msg.GetResults()[0])
		}
		return nil
	})
	pe := res.Msg.GetResults()[1].GetError()
	if connect.Code(pe.GetCode()) != connect.CodePermissionDenied || !strings.Contains(pe.GetMessage(), "publish") || !strings.Contains(pe.GetMessage(), theirs) {
		t.Fatalf("the entry of %s answered %v, want PermissionDenied naming publish and the stream", theirs, res.Msg.GetResults()[1])
	}
	for stream, want := range map[string]string{mine: "mine", theirs: "first"} {
		recs, err := read(c.Ctx(), w, stream)
		if err != nil {
			t.Fatal(err)
		}
		got := []string{}
		for _, r := range recs {
			got = append(got, string(r.GetPayload()))
		}
		if len(got) < 1 || got[len(got)-1] != want || (stream == theirs && len(got) != 1) {
			t.Fatalf("%s holds %q, want it to end with %q (and %s nothing new)", stream, got, want, theirs)
		}
	}
	// An entry above the principal's publish bytes per second is refused
	// alone, as its Publish would be.
	big := &strandv1.PublishManyRequest{Publishes: []*strandv1.PublishRequest{
		{Stream: mine, Records: []*strandv1.Record{{Payload: make([]byte, authRate+1)}}},
	}}
	res, err := w.PublishMany(c.Ctx(), connect.NewRequest(big))
	if err != nil {
		t.Fatal(err)
	}
	if pe := res.Msg.GetResults()[0].GetError(); connect.Code(pe.GetCode()) != connect.CodeResourceExhausted {
		t.Fatalf("an entry above the publish limit answered %v, want ResourceExhausted", res.Msg.GetResults()[0])
	}
}

// With auth off (--insecure) the broker says so explicitly (auth.Open), so
// PublishMany's entries, which the handler checks itself and refuses
// without a marker, are still stored for a caller without credentials.
func TestAuthOffPublishManyStores(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1"}, Controllers: 1})
	const a, b = "open.a", "open.b"
	c.CreateStream(a, 1, majority)
	c.CreateStream(b, 1, majority)
	anonymous := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(c.Addr("b1")))
	req := &strandv1.PublishManyRequest{Publishes: []*strandv1.PublishRequest{
		{Stream: a, Records: []*strandv1.Record{{Payload: []byte("to a")}}},
		{Stream: b, Records: []*strandv1.Record{{Payload: []byte("to b")}}},
	}}
	// CreateStream waited for b1 to apply both assignments: one call.
	res, err := anonymous.PublishMany(c.Ctx(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Msg.GetResults() {
		if r.GetResponse() == nil {
			t.Fatalf("entry %d answered %v, want it stored", i, r)
		}
	}
	for stream, want := range map[string]string{a: "to a", b: "to b"} {
		recs, err := read(c.Ctx(), anonymous, stream)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || string(recs[0].GetPayload()) != want {
			t.Fatalf("%s holds %v, want the one record %q", stream, recs, want)
		}
	}
}
