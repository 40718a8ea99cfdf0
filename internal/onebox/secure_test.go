package onebox

import (
	"context"
	"crypto/tls"
	"fmt"
	"github.com/strandhq/strand/internal/clustertest"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// On a cluster with TLS, a client without TLS is refused on every port (a
// broker's Connect, health and metrics; the controller's), and the admin
// client with TLS creates, publishes and reads.
func TestSecureClusterRefusesPlaintext(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1"}, Controllers: 1, Secure: true})
	c.CreateStream("s", 1, majority)
	if offs := c.Publish("b1", "s", "one", "two"); len(offs) != 2 {
		t.Fatalf("publish over TLS: offsets %v", offs)
	}
	recs, err := c.ReadAll("b1", "s")
	if err != nil || len(recs) != 2 {
		t.Fatalf("read over TLS: %d records, %v", len(recs), err)
	}

	plain := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(c.Addr("b1")))
	ctx, cancel := context.WithTimeout(c.Ctx(), 5*time.Second)
	defer cancel()
	if _, err := plain.Locate(ctx, connect.NewRequest(&strandv1.LocateRequest{Stream: "s"})); err == nil {
		t.Fatal("a broker answered a client without TLS")
	}
	admin := strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(c.ControllerAddr()))
	if _, err := admin.ListStreams(ctx, connect.NewRequest(&strandv1.ListStreamsRequest{})); err == nil {
		t.Fatal("the controller answered a client without TLS")
	}
	for _, path := range []string{"/metrics", "/grpc.health.v1.Health/Check"} {
		if err := plainGet(ctx, rpcserver.BaseURL(c.Addr("b1"))+path); err == nil {
			t.Fatalf("%s answered without TLS", path)
		}
	}
}

func plainGet(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := rpcserver.HTTPClient().Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// follow opens a Follow on client claiming node and returns the error of
// its first answer.
func follow(ctx context.Context, client strandv1connect.ReplicationServiceClient, node string) error {
	s := client.Follow(ctx)
	defer func() { _ = s.CloseRequest() }()
	_ = s.Send(&strandv1.FollowRequest{Node: node})
	_, err := s.Receive()
	return err
}

// A node follows as itself only: a Follow whose claimed node is not the
// one its certificate names is refused (PermissionDenied), as are Follow
// and Seal with a client's certificate, and both without a certificate
// (Unauthenticated). None of them reaches the copies: the stream's real
// followers keep following and the owner keeps confirming.
func TestSecureFollowWithAnotherNodesCertificateRefused(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 1, Recoverers: 1, Secure: true})
	a := c.CreateStream("s", 3, majority)
	follower, other := a.Followers[0], a.Followers[1]
	ctx, cancel := context.WithTimeout(c.Ctx(), 10*time.Second)
	defer cancel()

	// other's certificate, claiming to be follower.
	if err := follow(ctx, c.ReplicationAs(a.Owner, other), follower); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Follow as %s with %s's certificate: %v, want PermissionDenied", follower, other, err)
	}
	// The admin client's certificate: not a node's.
	if err := follow(ctx, c.Replication(a.Owner), follower); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Follow with a client certificate: %v, want PermissionDenied", err)
	}
	_, err := c.Replication(a.Owner).Seal(ctx, connect.NewRequest(&strandv1.SealRequest{Stream: "s", FenceEpoch: a.Epoch + 1, TransitionId: "t"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Seal with a client certificate: %v, want PermissionDenied", err)
	}
	// TLS without any certificate, but with the peer token of a cluster
	// without TLS: not a credential here.
	anon, err := tlsconfig.New(tlsconfig.Files{CAFile: c.CertsDir() + "/" + tlsconfig.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	d := rpcserver.Dialer{TLS: anon}
	anonRepl := strandv1connect.NewReplicationServiceClient(d.HTTPClient(), d.BaseURL(c.Addr(a.Owner)), rpcserver.WithPeerToken(PeerToken))
	if err := follow(ctx, anonRepl, follower); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Follow without a certificate: %v, want Unauthenticated", err)
	}
	_, err = anonRepl.Seal(ctx, connect.NewRequest(&strandv1.SealRequest{Stream: "s", FenceEpoch: a.Epoch + 1, TransitionId: "t"}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("Seal without a certificate: %v, want Unauthenticated", err)
	}

	// Nothing was sealed and the copies still confirm.
	for _, n := range a.Members() {
		if tails, ok := c.Tails(n, "s"); !ok || tails.SealEpoch != 0 {
			t.Fatalf("%s after the refused calls: %+v (present %v)", n, tails, ok)
		}
	}
	res, err := c.Client().Publish(c.Ctx(), "s", []*strandv1.Record{{Payload: []byte("after")}})
	if err != nil || res.GetEpoch() != a.Epoch {
		t.Fatalf("publish after the refused calls: %v, %v", res, err)
	}
}

// A broker's renewed certificate, written over its files, is what the next
// connection to it sees, without a restart; calls keep working on it.
func TestSecureRenewedCertificateServedWithoutRestart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1"}, Controllers: 1, Secure: true})
	serial := func() (string, error) {
		cfg := c.clientTLS.ClientConfig()
		cfg.ServerName = "127.0.0.1"
		conn, err := tls.Dial("tcp", c.Addr("b1"), cfg)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
	}
	before, err := serial()
	if err != nil {
		t.Fatal(err)
	}
	renewed := c.IssueNodeCert("b1")
	if renewed.Serial.String() == before {
		t.Fatal("the renewed certificate has the serial of the old one")
	}
	clustertest.Eventually(t, 10*time.Second, "a new connection to b1 sees the renewed certificate", func() error {
		got, err := serial()
		if err != nil {
			return err
		}
		if got != renewed.Serial.String() {
			return fmt.Errorf("serial %s, want %s", got, renewed.Serial)
		}
		return nil
	})
	c.CreateStream("s", 1, majority)
	c.Publish("b1", "s", "after the renewal")
}

// The mass failover on a cluster with TLS: the killed broker's streams
// recover through sealed copies over mutual TLS (recoverer to brokers,
// followers to owners, controller probes) and nothing confirmed is lost.
func TestSecureMassFailover(t *testing.T) {
	r := massFailover(t, 20, true)
	t.Logf("TLS: killed %s owning %d of 20 streams: all serving within %s", r.killed, r.affected, slices.Max(r.serving))
}

// TLS brings authentication (docs/operating.md, "Security"): the admin
// certificate's principal was bootstrapped with admin on "*" and creates
// the stream; a certificate of principal reader, granted read on orders.*,
// reads orders.a and is refused publish to it and stream creation; a
// client with neither a certificate nor a token is unauthenticated; and a
// token still names its principal beside any certificate, winning over it.
func TestSecureCertificatePrincipals(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1"}, Controllers: 1, Secure: true})
	if c.AdminToken != "" {
		t.Fatal("a secure cluster's admin uses its certificate, yet a token was made")
	}
	const stream = "orders.a"
	c.CreateStream(stream, 1, majority)
	c.Publish("b1", stream, "first")

	if _, err := tlsconfig.CreateClient(c.CertsDir(), "", "reader", time.Hour, false); err != nil {
		t.Fatal(err)
	}
	readerTLS, err := tlsconfig.New(tlsconfig.ClientFiles(c.CertsDir(), "reader"))
	if err != nil {
		t.Fatal(err)
	}
	reader := rpcserver.Dialer{TLS: readerTLS}
	readerStreams := strandv1connect.NewStreamServiceClient(reader.HTTPClient(), reader.BaseURL(c.Addr("b1")))
	readerAdmin := strandv1connect.NewAdminServiceClient(reader.HTTPClient(), reader.BaseURL(c.ControllerAddr()))
	ctx := c.Ctx()
	_, err = read(ctx, readerStreams, stream)
	wantCode(t, "reader before its grant", err, connect.CodePermissionDenied)
	c.grant(t, "reader", "read", "orders.*")
	clustertest.Eventually(t, authWait, "reader reads orders.a once granted", func() error {
		recs, err := read(ctx, readerStreams, stream)
		if err == nil && len(recs) != 1 {
			return fmt.Errorf("%d records, want 1", len(recs))
		}
		return err
	})
	err = publish(ctx, readerStreams, stream, []byte("denied"))
	wantCode(t, "reader publishes", err, connect.CodePermissionDenied)
	_, err = readerAdmin.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "orders.b", Copies: 1}))
	wantCode(t, "reader creates a stream", err, connect.CodePermissionDenied)

	// TLS with the CA only: no client certificate, no token.
	anonTLS, err := tlsconfig.New(tlsconfig.Files{CAFile: tlsconfig.ClientFiles(c.CertsDir(), "reader").CAFile})
	if err != nil {
		t.Fatal(err)
	}
	anon := rpcserver.Dialer{TLS: anonTLS}
	_, err = read(ctx, strandv1connect.NewStreamServiceClient(anon.HTTPClient(), anon.BaseURL(c.Addr("b1"))), stream)
	wantCode(t, "no certificate, no token: read", err, connect.CodeUnauthenticated)
	_, err = strandv1connect.NewAdminServiceClient(anon.HTTPClient(), anon.BaseURL(c.ControllerAddr())).
		ListStreams(ctx, connect.NewRequest(&strandv1.ListStreamsRequest{}))
	wantCode(t, "no certificate, no token: list streams", err, connect.CodeUnauthenticated)

	// A token of a publisher: alone, and beside the reader's certificate.
	_, secret := c.token(t, "publisher", "publish orders.*")
	tokenOnly := strandv1connect.NewStreamServiceClient(anon.HTTPClient(), anon.BaseURL(c.Addr("b1")), auth.WithBearer(secret))
	clustertest.Eventually(t, authWait, "the publisher's token publishes", func() error {
		return publish(ctx, tokenOnly, stream, []byte("by-token"))
	})
	withCert := strandv1connect.NewStreamServiceClient(reader.HTTPClient(), reader.BaseURL(c.Addr("b1")), auth.WithBearer(secret))
	if err := publish(ctx, withCert, stream, []byte("token-beside-cert")); err != nil {
		t.Fatalf("a token beside the reader's certificate: %v", err)
	}
	_, err = read(ctx, withCert, stream)
	wantCode(t, "the publisher's token reads (the token wins over the reader's certificate)", err, connect.CodePermissionDenied)
}
