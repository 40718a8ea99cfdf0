package rpcserver_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcserver"
)

// replication counts the calls that reach it: a call the token refuses
// must not.
type replication struct {
	strandv1connect.UnimplementedReplicationServiceHandler
	calls atomic.Int32
}

func (r *replication) Seal(context.Context, *connect.Request[strandv1.SealRequest]) (*connect.Response[strandv1.SealResponse], error) {
	r.calls.Add(1)
	return connect.NewResponse(&strandv1.SealResponse{}), nil
}

func (r *replication) Follow(_ context.Context, s *connect.BidiStream[strandv1.FollowRequest, strandv1.FollowResponse]) error {
	r.calls.Add(1)
	if _, err := s.Receive(); err != nil {
		return err
	}
	return s.Send(&strandv1.FollowResponse{Ends: []*strandv1.FollowEnd{{Id: 7}}})
}

func serveReplication(t *testing.T, token string, accepted ...string) (*replication, string) {
	t.Helper()
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &replication{}
	mux, _ := rpcserver.Mux(strandv1connect.ReplicationServiceName)
	mux.Handle(strandv1connect.NewReplicationServiceHandler(h, rpcserver.RequirePeerToken(token, accepted...)))
	srv := rpcserver.Serve(ln, mux)
	t.Cleanup(func() { _ = srv.Close() })
	return h, srv.Addr()
}

func callBoth(addr, token string, opts ...connect.ClientOption) (sealErr, followErr error) {
	opts = append(opts, rpcserver.WithPeerToken(token))
	c := strandv1connect.NewReplicationServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(addr), opts...)
	ctx := context.Background()
	_, sealErr = c.Seal(ctx, connect.NewRequest(&strandv1.SealRequest{Stream: "s"}))
	s := c.Follow(ctx)
	defer func() { _ = s.CloseRequest() }()
	// A refused stream may fail the send already; the receive carries the
	// code either way.
	_ = s.Send(&strandv1.FollowRequest{Node: "b1"})
	res, err := s.Receive()
	if err == nil && (len(res.GetEnds()) != 1 || res.GetEnds()[0].GetId() != 7) {
		err = errors.New("follow answered the wrong message")
	}
	return sealErr, err
}

// protocols are the wire protocols a broker serves (docs/api.md:
// Connect, gRPC and gRPC-Web clients all work); the token is checked on each.
var protocols = map[string][]connect.ClientOption{
	"connect":  nil,
	"json":     {connect.WithProtoJSON()},
	"grpc":     {connect.WithGRPC()},
	"grpc-web": {connect.WithGRPCWeb()},
}

func TestPeerTokenRefusesCallsWithoutIt(t *testing.T) {
	h, addr := serveReplication(t, "s3cret")
	for proto, opts := range protocols {
		for _, token := range []string{"", "wrong", "s3cret-and-more", "S3CRET"} {
			sealErr, followErr := callBoth(addr, token, opts...)
			for name, err := range map[string]error{"Seal": sealErr, "Follow": followErr} {
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("%s: %s with token %q: %v, want Unauthenticated", proto, name, token, err)
				}
			}
		}
	}
	if n := h.calls.Load(); n != 0 {
		t.Fatalf("%d refused calls reached the handler", n)
	}
	for proto, opts := range protocols {
		sealErr, followErr := callBoth(addr, "s3cret", opts...)
		if sealErr != nil || followErr != nil {
			t.Fatalf("%s with the token: Seal %v, Follow %v", proto, sealErr, followErr)
		}
	}
	if n, want := h.calls.Load(), int32(2*len(protocols)); n != want {
		t.Fatalf("%d calls with the token reached the handler, want %d", n, want)
	}
}

func TestPeerTokenFromTheEnvironment(t *testing.T) {
	t.Setenv(rpcserver.PeerTokenEnv, "  s3cret\n")
	if got := rpcserver.PeerToken(); got != "s3cret" {
		t.Fatalf("PeerToken() = %q, want the token without white space", got)
	}
	for token, ok := range map[string]bool{
		"": true, "s3cret": true, "0123abcdef": true, "a-b_c.d~e/f+g=": true,
		"two words": false, "tab\there": false, "new\nline": false, "caf\u00e9": false, "nul\x00": false,
	} {
		err := rpcserver.ValidatePeerTokens(token, nil)
		if (err == nil) != ok {
			t.Errorf("ValidatePeerTokens(%q, nil) = %v, want ok=%v", token, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), rpcserver.PeerTokenEnv) {
			t.Errorf("ValidatePeerTokens(%q, nil) = %v, want it to name %s", token, err, rpcserver.PeerTokenEnv)
		}
	}
}

// A cluster without a token is open, as before tokens existed; a client
// that sends one anyway is admitted too.
func TestNoPeerTokenAdmitsEveryCall(t *testing.T) {
	h, addr := serveReplication(t, "")
	for _, token := range []string{"", "anything"} {
		sealErr, followErr := callBoth(addr, token)
		if sealErr != nil || followErr != nil {
			t.Fatalf("token %q: Seal %v, Follow %v", token, sealErr, followErr)
		}
	}
	if n := h.calls.Load(); n != 4 {
		t.Fatalf("%d calls reached the handler, want 4", n)
	}
}

// A rotation under way: a broker accepts its own token and the ones it is
// told to accept besides it, on every protocol, and nothing else.
func TestPeerTokenAcceptsTheRotatedTokens(t *testing.T) {
	h, addr := serveReplication(t, "new-token", "old-token", "older-token")
	want := int32(0)
	for proto, opts := range protocols {
		for _, token := range []string{"new-token", "old-token", "older-token"} {
			sealErr, followErr := callBoth(addr, token, opts...)
			if sealErr != nil || followErr != nil {
				t.Fatalf("%s with accepted token %q: Seal %v, Follow %v", proto, token, sealErr, followErr)
			}
			want += 2
		}
		for _, token := range []string{"", "wrong", "old-token,new-token", "new-token old-token"} {
			sealErr, followErr := callBoth(addr, token, opts...)
			for name, err := range map[string]error{"Seal": sealErr, "Follow": followErr} {
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("%s: %s with token %q: %v, want Unauthenticated", proto, name, token, err)
				}
			}
		}
	}
	if n := h.calls.Load(); n != want {
		t.Fatalf("%d calls reached the handler, want the %d with an accepted token", n, want)
	}
}

func TestPeerTokensAcceptedFromTheEnvironment(t *testing.T) {
	t.Setenv(rpcserver.PeerTokenAcceptEnv, " old-token ,, older-token\n")
	got := rpcserver.PeerTokensAccepted()
	if strings.Join(got, "|") != "old-token|older-token" {
		t.Fatalf("PeerTokensAccepted() = %q, want [old-token older-token]", got)
	}
	t.Setenv(rpcserver.PeerTokenAcceptEnv, "")
	if got := rpcserver.PeerTokensAccepted(); got != nil {
		t.Fatalf("PeerTokensAccepted() with the variable empty = %q, want nil", got)
	}
	for _, c := range []struct {
		token    string
		accepted []string
		names    string // "" when valid
	}{
		{"new", []string{"old"}, ""},
		{"new", nil, ""},
		{"", nil, ""},
		{"", []string{"old"}, rpcserver.PeerTokenAcceptEnv + " is set but " + rpcserver.PeerTokenEnv + " is not"},
		{"new", []string{"old", "caf\u00e9"}, rpcserver.PeerTokenAcceptEnv + ": token 2"},
		{"two words", []string{"old"}, rpcserver.PeerTokenEnv},
	} {
		err := rpcserver.ValidatePeerTokens(c.token, c.accepted)
		switch {
		case c.names == "" && err != nil:
			t.Errorf("ValidatePeerTokens(%q, %q) = %v, want ok", c.token, c.accepted, err)
		case c.names != "" && (err == nil || !strings.Contains(err.Error(), c.names)):
			t.Errorf("ValidatePeerTokens(%q, %q) = %v, want an error naming %q", c.token, c.accepted, err, c.names)
		}
	}
}
