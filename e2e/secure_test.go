package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	strandclient "github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/onebox/ledger"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// TestSecureOwnerKillFailover is the owner-kill failover of a cluster run
// as deploy/compose/compose.secure.yaml runs it: etcd on https with client
// certificates, every service with --certs-dir (so TLS and authentication
// on, docs/operating.md "Security"), the admin calling with a client
// certificate whose principal holds admin on "*" and a publisher calling
// with a token of its own. Killing the owner under load loses nothing
// confirmed: the recoverer seals and the new owner serves over mutual TLS.
func TestSecureOwnerKillFailover(t *testing.T) {
	h, sec := startSecureCluster(t, 3)
	ctx := t.Context()
	const stream = "secure-kill-owner"
	a0 := h.createStream(ctx, stream, 3, cluster.MajorityDurable)

	// Without credentials the brokers refuse: authentication is on.
	anon := strandv1connect.NewStreamServiceClient(sec.httpClient(h, nil), rpcserver.BaseURLTLS(a0.Owner+":"+brokerPort))
	if _, err := anon.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: []*strandv1.Record{{Payload: []byte("anon")}}})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("publish without credentials: %v, want Unauthenticated", err)
	}

	// The publisher: a token (no client certificate) with publish and read
	// on the stream.
	res, err := h.admin.CreateToken(ctx, connect.NewRequest(&strandv1.CreateTokenRequest{Principal: "publisher"}))
	if err != nil {
		t.Fatalf("create token: %v", err)
	}
	for _, perm := range []string{"publish", "read"} {
		if _, err := h.admin.GrantPermission(ctx, connect.NewRequest(&strandv1.GrantPermissionRequest{Principal: "publisher", Permission: perm, Streams: stream})); err != nil {
			t.Fatalf("grant %s: %v", perm, err)
		}
	}
	cl := sec.client(h, nil, res.Msg.GetSecret())
	l := ledger.New()
	pub := startPublishing(t, cl, stream, "s", 4, l)
	clustertest.Eventually(t, 30*time.Second, "200 confirmed records before the kill", func() (bool, string) {
		return l.Count() >= 200, pub.LastError()
	})

	owner := a0.Owner
	killed := time.Now()
	h.kill(owner)
	a1 := h.waitNewOwner(ctx, stream, a0.Epoch, owner, 30*time.Second)
	t.Logf("failover over TLS: epoch %d -> %d, owner %s -> %s, %s after the kill",
		a0.Epoch, a1.Epoch, owner, a1.Owner, time.Since(killed).Round(10*time.Millisecond))
	clustertest.Eventually(t, 30*time.Second, "publishes confirm at the new epoch", func() (bool, string) {
		return l.AtEpoch(a1.Epoch) >= 100, pub.LastError()
	})
	pub.Stop()

	recs := readAll(ctx, t, "the stream at its owner", l.End(), readThroughClient(cl, stream))
	n := verifyLedger(t, l, recs)
	t.Logf("%d confirmed records verified at their offsets over TLS with auth (%d publishes failed or were cut short)", n, l.Failures())
}

// secureCerts are a secure cluster's certificates, made with the
// tlsconfig issuing code (what strandctl cert runs) into a temp dir: the
// CA, a node certificate per container and the admin client certificate.
type secureCerts struct {
	dir   string
	admin *tlsconfig.Reloader
}

// certsDir is where a container finds its ca.crt, node.crt and node.key.
const certsDir = "/certs"

func makeSecureCerts(t *testing.T, names []string) *secureCerts {
	t.Helper()
	dir := t.TempDir()
	if _, err := tlsconfig.CreateCA(dir, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		// The name is the container's alias on the cluster network, which
		// peers dial; 127.0.0.1 is what the health probe dials inside.
		if _, err := tlsconfig.CreateNode(dir, filepath.Join(dir, n), n, []string{n, "127.0.0.1", "localhost"}, time.Hour, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tlsconfig.CreateClient(dir, "", tlsconfig.DefaultUser, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	admin, err := tlsconfig.New(tlsconfig.ClientFiles(dir, tlsconfig.DefaultUser))
	if err != nil {
		t.Fatal(err)
	}
	return &secureCerts{dir: dir, admin: admin}
}

// mount copies name's certificates into the container at /certs, and runs
// the health probe over TLS with them.
func (s *secureCerts) mount(req testcontainers.GenericContainerRequest, name, port string) testcontainers.GenericContainerRequest {
	req.Files = []testcontainers.ContainerFile{
		{HostFilePath: filepath.Join(s.dir, tlsconfig.CAFile), ContainerFilePath: certsDir + "/" + tlsconfig.CAFile, FileMode: 0o644},
		{HostFilePath: filepath.Join(s.dir, name, tlsconfig.NodeCert), ContainerFilePath: certsDir + "/" + tlsconfig.NodeCert, FileMode: 0o644},
		{HostFilePath: filepath.Join(s.dir, name, tlsconfig.NodeKey), ContainerFilePath: certsDir + "/" + tlsconfig.NodeKey, FileMode: 0o600},
	}
	probe := []string{"/strand-healthprobe", "--cacert", certsDir + "/" + tlsconfig.CAFile,
		"--cert", certsDir + "/" + tlsconfig.NodeCert, "--key", certsDir + "/" + tlsconfig.NodeKey}
	if name == "etcd" {
		probe = append(probe, "--etcd", "https://127.0.0.1:"+port)
	} else {
		probe = append(probe, "127.0.0.1:"+port)
	}
	req.WaitingFor = wait.ForExec(probe).WithPollInterval(200 * time.Millisecond).WithStartupTimeout(60 * time.Second)
	return req
}

// httpClient speaks HTTP/2 over TLS through the harness's dialer (which
// maps a container's alias to its published port), verifying each server
// by its alias, and presents cert (none when nil).
func (s *secureCerts) httpClient(h *harness, cert *tlsconfig.Reloader) *http.Client {
	var cfg *tls.Config
	if cert != nil {
		cfg = cert.ClientConfig()
	} else {
		ca, err := tlsconfig.New(tlsconfig.Files{CAFile: filepath.Join(s.dir, tlsconfig.CAFile)})
		if err != nil {
			h.t.Fatal(err)
		}
		cfg = ca.ClientConfig()
	}
	hc := rpcserver.HTTPClientTLS(cfg)
	hc.Transport.(*http.Transport).DialContext = h.dial
	return hc
}

// client is a Go client of the secure cluster presenting cert (none when
// nil) and sending token (none when empty).
func (s *secureCerts) client(h *harness, cert *tlsconfig.Reloader, token string) *strandclient.Client {
	h.t.Helper()
	var brokers []string
	for _, b := range h.brokers {
		brokers = append(brokers, b+":"+brokerPort)
	}
	hc := s.httpClient(h, cert)
	c, err := strandclient.New(strandclient.Config{
		Controller:     "controller:" + controllerPort,
		Brokers:        brokers,
		HTTPClient:     hc,
		TLS:            hc.Transport.(*http.Transport).TLSClientConfig,
		Token:          token,
		RetryBudget:    30 * time.Second,
		AttemptTimeout: 3 * time.Second,
	})
	if err != nil {
		h.t.Fatalf("client: %v", err)
	}
	h.t.Cleanup(func() { _ = c.Close() })
	return c
}

// startSecureCluster is startCluster with TLS everywhere and so
// authentication on: the flags of deploy/compose/compose.secure.yaml. The
// admin certificate's principal is granted admin on "*" straight in etcd
// (auth.Store.BootstrapPrincipal), as strandctl dev --secure does.
func startSecureCluster(t *testing.T, brokers int) (*harness, *secureCerts) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	docker, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatalf("docker: %v", err)
	}
	h := &harness{
		t: t, id: randomHex(4), docker: docker,
		nodes: make(map[string]*node), hostAddr: make(map[string]string),
		schema: cluster.NewSchema(cluster.DefaultPrefix),
	}
	t.Cleanup(h.cleanup)
	h.clientNet = h.createNetwork(ctx, "a-client")
	h.clusterNet = h.createNetwork(ctx, "b-cluster")
	names := []string{"etcd", "controller", "recoverer"}
	for i := 1; i <= brokers; i++ {
		h.brokers = append(h.brokers, fmt.Sprintf("broker-%d", i))
	}
	sec := makeSecureCerts(t, append(names, h.brokers...))

	certFlags := []string{"--certs-dir=" + certsDir}
	etcdURL := "--etcd=https://etcd:" + etcdPort
	h.startNodes(ctx, sec.mount(h.request("etcd", etcdImage, etcdPort, append([]string{"--name=etcd", "--data-dir=/data/etcd",
		"--listen-client-urls=https://0.0.0.0:" + etcdPort, "--advertise-client-urls=https://etcd:" + etcdPort,
		"--cert-file=" + certsDir + "/" + tlsconfig.NodeCert, "--key-file=" + certsDir + "/" + tlsconfig.NodeKey,
		"--trusted-ca-file=" + certsDir + "/" + tlsconfig.CAFile, "--client-cert-auth", "--tls-min-version=TLS1.3",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=etcd=http://127.0.0.1:2380", "--log-level=warn"}, etcdcfg.Defaults().Flags()...)...), "etcd", etcdPort))

	// The host's etcd client presents the etcd container's node
	// certificate (any the CA signed would do: etcd checks the chain).
	etcdTLS, err := tlsconfig.New(tlsconfig.NodeFiles(filepath.Join(sec.dir, "etcd")))
	if err != nil {
		t.Fatal(err)
	}
	etcdCfg := etcdTLS.ClientConfig()
	etcdCfg.NextProtos = nil
	h.etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{"https://" + h.hostAddrOf("etcd:"+etcdPort)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: etcdCfg})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	st := &auth.Store{KV: h.etcd, Schema: h.schema, Txn: auth.PlainTxn(h.etcd)}
	if _, err := st.BootstrapPrincipal(ctx, tlsconfig.DefaultUser); err != nil {
		t.Fatalf("bootstrap admin %s: %v", tlsconfig.DefaultUser, err)
	}

	reqs := []testcontainers.GenericContainerRequest{
		sec.mount(h.request("controller", controllerImage, controllerPort, append([]string{
			"--name=controller", "--listen=0.0.0.0:" + controllerPort, "--advertise=controller:" + controllerPort,
			etcdURL, "--log-level=debug"}, certFlags...)...), "controller", controllerPort),
		sec.mount(h.request("recoverer", recovererImage, recovererPort, append([]string{
			"--name=recoverer", "--listen=0.0.0.0:" + recovererPort, etcdURL,
			"--seal-timeout=" + sealTimeout.String(), "--log-level=debug"}, certFlags...)...), "recoverer", recovererPort),
	}
	for _, name := range h.brokers {
		reqs = append(reqs, sec.mount(h.request(name, brokerImage, brokerPort, append([]string{
			"--node=" + name, "--listen=0.0.0.0:" + brokerPort, "--advertise=" + name + ":" + brokerPort,
			"--data-dir=/data", etcdURL, "--heartbeat=" + heartbeat.String(), "--lease-ttl=" + leaseTTL.String(),
			"--confirm-timeout=2s", "--log-level=debug"}, certFlags...)...), name, brokerPort))
	}
	h.startNodes(ctx, reqs...)

	h.http = sec.httpClient(h, sec.admin)
	h.admin = strandv1connect.NewAdminServiceClient(h.http, rpcserver.BaseURLTLS("controller:"+controllerPort))
	clustertest.Eventually(t, 30*time.Second, "every broker live at the controller", func() (bool, string) {
		res, err := h.admin.ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
		if err != nil {
			return false, err.Error()
		}
		live := 0
		for _, b := range res.Msg.GetBrokers() {
			if b.GetLive() {
				live++
			}
		}
		return live == brokers, fmt.Sprintf("%d of %d live", live, brokers)
	})
	t.Logf("secure cluster %s up in %s: etcd, controller, recoverer, %d brokers", h.id, time.Since(start).Round(100*time.Millisecond), brokers)
	return h, sec
}
