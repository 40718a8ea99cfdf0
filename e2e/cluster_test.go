package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	strandclient "github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/rpcserver"
)

// Images built by `make images`.
const (
	etcdImage       = "strand/etcd:dev"
	controllerImage = "strand/controller:dev"
	recovererImage  = "strand/recoverer:dev"
	brokerImage     = "strand/broker:dev"
)

// Container ports, fixed inside the cluster network.
const (
	etcdPort       = "2379"
	controllerPort = "7102"
	recovererPort  = "7103"
	brokerPort     = "7110"
)

// Liveness settings short enough for a failover in a few seconds on a loaded
// 2-core machine (etcd's shortest lease is 2s with its default timing).
var (
	heartbeat   = 200 * time.Millisecond
	leaseTTL    = 2 * time.Second
	sealTimeout = time.Second
)

// node is one service container. Its name is both its network alias on the
// cluster network and, for brokers, its node id.
type node struct {
	name string
	port string
	ctr  testcontainers.Container
}

// advertise is the address the node is known by inside the cluster network,
// and so the address owner hints and Locate answers carry.
func (n *node) advertise() string { return n.name + ":" + n.port }

// harness is one test's cluster: networks, containers, and the host-side
// clients that reach them through mapped ports.
type harness struct {
	t      *testing.T
	id     string
	docker *testcontainers.DockerClient

	clientNet, clusterNet string // network names

	mu      sync.Mutex
	nodes   map[string]*node
	brokers []string
	// hostAddr maps an advertise address to the host port Docker published
	// for it; a node that is not running has no entry and dials fail.
	hostAddr map[string]string
	host     string // where Docker publishes ports, see dockerHost

	http   *http.Client
	admin  strandv1connect.AdminServiceClient
	etcd   *clientv3.Client
	schema cluster.Schema
}

// startCluster starts etcd, a controller, a recoverer and n brokers
// (broker-1..broker-n) and waits until every one reports itself serving.
func startCluster(t *testing.T, brokers int) *harness {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	docker, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatalf("docker: %v", err)
	}
	h := &harness{
		t:        t,
		id:       randomHex(4),
		docker:   docker,
		nodes:    make(map[string]*node),
		hostAddr: make(map[string]string),
		schema:   cluster.NewSchema(cluster.DefaultPrefix),
	}
	t.Cleanup(h.cleanup)
	// The client network must be the container's first network: Docker
	// publishes ports on it, so a partition from the cluster network leaves
	// the host's path to the container intact. Names sort the same way.
	h.clientNet = h.createNetwork(ctx, "a-client")
	h.clusterNet = h.createNetwork(ctx, "b-cluster")

	h.http = rpcserver.HTTPClient()
	h.http.Transport.(*http.Transport).DialContext = h.dial

	h.startNodes(ctx, h.etcdRequest())
	var reqs []testcontainers.GenericContainerRequest
	reqs = append(reqs, h.controllerRequest(), h.recovererRequest())
	for i := 1; i <= brokers; i++ {
		name := fmt.Sprintf("broker-%d", i)
		h.brokers = append(h.brokers, name)
		reqs = append(reqs, h.brokerRequest(name))
	}
	h.startNodes(ctx, reqs...)

	etcdAddr := h.hostAddrOf("etcd:" + etcdPort)
	h.etcd, err = clientv3.New(clientv3.Config{Endpoints: []string{etcdAddr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	h.admin = strandv1connect.NewAdminServiceClient(h.http, rpcserver.BaseURL("controller:"+controllerPort))
	// Every broker registered and the controller sees it live.
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
	t.Logf("cluster %s up in %s: etcd, controller, recoverer, %d brokers", h.id, time.Since(start).Round(100*time.Millisecond), brokers)
	return h
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (h *harness) createNetwork(ctx context.Context, suffix string) string {
	name := fmt.Sprintf("strand-e2e-%s-%s", h.id, suffix)
	if _, err := h.docker.NetworkCreate(ctx, name, client.NetworkCreateOptions{
		Driver: "bridge",
		Labels: map[string]string{"strand-e2e": h.id},
	}); err != nil {
		h.t.Fatalf("create network %s: %v", name, err)
	}
	return name
}

func (h *harness) request(name, image, port string, cmd ...string) testcontainers.GenericContainerRequest {
	return testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Name:         fmt.Sprintf("strand-e2e-%s-%s", h.id, name),
			Image:        image,
			Cmd:          cmd,
			ExposedPorts: []string{port + "/tcp"},
			Networks:     []string{h.clientNet, h.clusterNet},
			// The alias exists on the cluster network only: a container cut
			// off from it cannot resolve its peers through the client network.
			NetworkAliases: map[string][]string{h.clusterNet: {name}},
			Labels:         map[string]string{"strand-e2e": h.id},
			// Brokers refuse Follow and Seal without the cluster's peer
			// token; the recoverer sends it with its seals.
			Env: map[string]string{rpcserver.PeerTokenEnv: "strand-e2e-" + h.id},
			// The health probe baked into every image, the same check compose
			// runs. It is also run again after every restart.
			WaitingFor: wait.ForExec(healthCommand(name, port)).
				WithPollInterval(200 * time.Millisecond).
				WithStartupTimeout(60 * time.Second),
		},
		Started: true,
	}
}

func healthCommand(name, port string) []string {
	if name == "etcd" {
		return []string{"/strand-healthprobe", "--etcd", "http://127.0.0.1:" + port}
	}
	return []string{"/strand-healthprobe", "127.0.0.1:" + port}
}

// etcdRequest runs etcd with the compaction and quota of every etcd Strand
// starts (docs/etcd.md).
func (h *harness) etcdRequest() testcontainers.GenericContainerRequest {
	args := append([]string{"--name=etcd", "--data-dir=/data/etcd",
		"--listen-client-urls=http://0.0.0.0:" + etcdPort, "--advertise-client-urls=http://etcd:" + etcdPort,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=etcd=http://127.0.0.1:2380", "--log-level=warn"}, etcdcfg.Defaults().Flags()...)
	return h.request("etcd", etcdImage, etcdPort, args...)
}

func (h *harness) controllerRequest() testcontainers.GenericContainerRequest {
	return h.request("controller", controllerImage, controllerPort,
		"--name=controller", "--listen=0.0.0.0:"+controllerPort, "--advertise=controller:"+controllerPort,
		"--etcd=http://etcd:"+etcdPort, "--log-level=debug", "--insecure")
}

func (h *harness) recovererRequest() testcontainers.GenericContainerRequest {
	return h.request("recoverer", recovererImage, recovererPort,
		"--name=recoverer", "--listen=0.0.0.0:"+recovererPort, "--etcd=http://etcd:"+etcdPort,
		"--seal-timeout="+sealTimeout.String(), "--log-level=debug", "--insecure")
}

func (h *harness) brokerRequest(name string) testcontainers.GenericContainerRequest {
	return h.request(name, brokerImage, brokerPort,
		"--node="+name, "--listen=0.0.0.0:"+brokerPort, "--advertise="+name+":"+brokerPort,
		"--data-dir=/data", "--etcd=http://etcd:"+etcdPort,
		"--heartbeat="+heartbeat.String(), "--lease-ttl="+leaseTTL.String(),
		"--confirm-timeout=2s", "--log-level=debug", "--insecure")
}

// startNodes starts containers concurrently and waits until all are healthy.
func (h *harness) startNodes(ctx context.Context, reqs ...testcontainers.GenericContainerRequest) {
	h.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(reqs))
	for i, req := range reqs {
		name := strings.TrimPrefix(req.Name, fmt.Sprintf("strand-e2e-%s-", h.id))
		n := &node{name: name, port: strings.TrimSuffix(req.ExposedPorts[0], "/tcp")}
		wg.Go(func() {
			ctr, err := testcontainers.GenericContainer(ctx, req)
			h.mu.Lock()
			// Keep even a container that failed its health wait, for its logs.
			if ctr != nil && !isNil(ctr) {
				n.ctr = ctr
				h.nodes[n.name] = n
			}
			h.mu.Unlock()
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", n.name, err)
				return
			}
			errs[i] = h.refresh(ctx, n)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		h.t.Fatalf("start containers: %v", err)
	}
}

// isNil reports whether a Container interface holds a nil *DockerContainer,
// which GenericContainer returns alongside some errors.
func isNil(c testcontainers.Container) bool {
	dc, ok := c.(*testcontainers.DockerContainer)
	return ok && dc == nil
}

func (h *harness) node(name string) *node {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.nodes[name]
	if !ok {
		h.t.Fatalf("no node %q", name)
	}
	return n
}

// refresh records where the host reaches n now. Docker publishes a new host
// port when a container restarts or its networks change.
func (h *harness) refresh(ctx context.Context, n *node) error {
	info, err := n.ctr.Inspect(ctx)
	if err != nil {
		return fmt.Errorf("%s: inspect: %w", n.name, err)
	}
	if info.State == nil || !info.State.Running {
		h.mu.Lock()
		delete(h.hostAddr, n.advertise())
		h.mu.Unlock()
		return nil
	}
	port, err := n.ctr.MappedPort(ctx, n.port+"/tcp")
	if err != nil {
		return fmt.Errorf("%s: mapped port: %w", n.name, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.host == "" {
		host, err := dockerHost(ctx, n.ctr, port.Num())
		if err != nil {
			return fmt.Errorf("%s: %w", n.name, err)
		}
		h.host = host
	}
	h.hostAddr[n.advertise()] = net.JoinHostPort(h.host, fmt.Sprint(port.Num()))
	return nil
}

// dockerHost finds the host where published ports are reachable:
// TESTCONTAINERS_HOST_OVERRIDE when set, else the loopback when the port
// answers there (a local engine, also from inside a container sharing the
// engine's network), else what testcontainers guesses (the default gateway
// when the tests run in a container).
func dockerHost(ctx context.Context, ctr testcontainers.Container, port uint16) (string, error) {
	if o := os.Getenv("TESTCONTAINERS_HOST_OVERRIDE"); o != "" {
		return o, nil
	}
	d := net.Dialer{Timeout: time.Second}
	if c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(port))); err == nil {
		_ = c.Close()
		return "127.0.0.1", nil
	}
	host, err := ctr.Host(ctx)
	if err != nil {
		return "", fmt.Errorf("docker host: %w", err)
	}
	return host, nil
}

func (h *harness) hostAddrOf(advertise string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hostAddr[advertise]
}

// errNodeDown is what dialing a stopped container's address gives: a
// refused connection, as from a crashed host.
var errNodeDown = fmt.Errorf("e2e: container is not running: %w", syscall.ECONNREFUSED)

// dial translates advertise addresses to mapped host ports.
func (h *harness) dial(ctx context.Context, netw, addr string) (net.Conn, error) {
	h.mu.Lock()
	target, ok := h.hostAddr[addr]
	known := false
	for _, n := range h.nodes {
		if n.advertise() == addr {
			known = true
		}
	}
	h.mu.Unlock()
	switch {
	case ok:
		addr = target
	case known:
		return nil, &net.OpError{Op: "dial", Net: netw, Err: errNodeDown}
	}
	d := net.Dialer{Timeout: 2 * time.Second, KeepAlive: 5 * time.Second}
	return d.DialContext(ctx, netw, addr)
}

// kill sends SIGKILL to a container, as a crash would, and waits until
// Docker reports it stopped.
func (h *harness) kill(name string) {
	h.t.Helper()
	n := h.node(name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.docker.ContainerKill(ctx, n.ctr.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		h.t.Fatalf("kill %s: %v", name, err)
	}
	clustertest.Eventually(h.t, 20*time.Second, name+" stopped", func() (bool, string) {
		st, err := n.ctr.State(ctx)
		if err != nil {
			return false, err.Error()
		}
		return !st.Running, string(st.Status)
	})
	if err := h.refresh(ctx, n); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("killed %s (SIGKILL)", name)
}

// restart starts a stopped container again, with its data volume, and waits
// for its health probe.
func (h *harness) restart(name string) {
	h.t.Helper()
	n := h.node(name)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := n.ctr.Start(ctx); err != nil {
		h.t.Fatalf("restart %s: %v", name, err)
	}
	if err := h.refresh(ctx, n); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("restarted %s", name)
}

// partition disconnects a container from the cluster network while it runs.
func (h *harness) partition(name string) {
	h.t.Helper()
	n := h.node(name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.docker.NetworkDisconnect(ctx, h.clusterNet, client.NetworkDisconnectOptions{Container: n.ctr.GetContainerID(), Force: true}); err != nil {
		h.t.Fatalf("disconnect %s: %v", name, err)
	}
	if err := h.refresh(ctx, n); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("partitioned %s from the cluster network", name)
}

// heal reconnects a partitioned container under its alias.
func (h *harness) heal(name string) {
	h.t.Helper()
	n := h.node(name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.docker.NetworkConnect(ctx, h.clusterNet, client.NetworkConnectOptions{
		Container:      n.ctr.GetContainerID(),
		EndpointConfig: &network.EndpointSettings{Aliases: []string{name}},
	}); err != nil {
		h.t.Fatalf("reconnect %s: %v", name, err)
	}
	if err := h.refresh(ctx, n); err != nil {
		h.t.Fatal(err)
	}
	h.t.Logf("reconnected %s to the cluster network", name)
}

// cleanup saves logs when the test failed, then removes containers (with
// their volumes) and networks.
func (h *harness) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.mu.Lock()
	nodes := make([]*node, 0, len(h.nodes))
	for _, n := range h.nodes {
		nodes = append(nodes, n)
	}
	h.mu.Unlock()
	if h.t.Failed() {
		h.dumpGoroutines(ctx, nodes)
		h.saveLogs(ctx, nodes)
	}
	if h.etcd != nil {
		_ = h.etcd.Close()
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			if err := n.ctr.Terminate(ctx, testcontainers.StopTimeout(0)); err != nil {
				h.t.Logf("remove %s: %v", n.name, err)
			}
		})
	}
	wg.Wait()
	for _, name := range []string{h.clusterNet, h.clientNet} {
		if name == "" {
			continue
		}
		if _, err := h.docker.NetworkRemove(ctx, name, client.NetworkRemoveOptions{}); err != nil {
			h.t.Logf("remove network: %v", err)
		}
	}
	_ = h.docker.Close()
}

// dumpGoroutines sends SIGQUIT to every running service so that the Go
// runtime writes every goroutine's stack to its log before it exits: a test
// that timed out waiting shows where each service was stuck.
func (h *harness) dumpGoroutines(ctx context.Context, nodes []*node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			st, err := n.ctr.State(ctx)
			if err != nil || !st.Running {
				return
			}
			if _, err := h.docker.ContainerKill(ctx, n.ctr.GetContainerID(), client.ContainerKillOptions{Signal: "QUIT"}); err != nil {
				return
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			res := h.docker.ContainerWait(wctx, n.ctr.GetContainerID(), client.ContainerWaitOptions{})
			select {
			case <-res.Result:
			case <-res.Error:
			}
		})
	}
	wg.Wait()
}

// saveLogs writes every container's output to e2e/logs/<test>/<node>.log.
func (h *harness) saveLogs(ctx context.Context, nodes []*node) {
	dir := filepath.Join("logs", strings.NewReplacer("/", "_", " ", "_").Replace(h.t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Logf("save logs: %v", err)
		return
	}
	for _, n := range nodes {
		rc, err := n.ctr.Logs(ctx)
		if err != nil {
			h.t.Logf("logs of %s: %v", n.name, err)
			continue
		}
		f, err := os.Create(filepath.Join(dir, n.name+".log"))
		if err == nil {
			_, err = f.ReadFrom(rc)
			err = errors.Join(err, f.Close())
		}
		_ = rc.Close()
		if err != nil {
			h.t.Logf("save logs of %s: %v", n.name, err)
		}
	}
	abs, _ := filepath.Abs(dir)
	h.t.Logf("container logs saved in %s", abs)
}

// client returns a Go client (package client) for the cluster. Attempts are
// bounded so a partitioned owner is given up on quickly.
func (h *harness) client() *strandclient.Client {
	h.t.Helper()
	var brokers []string
	for _, b := range h.brokers {
		brokers = append(brokers, b+":"+brokerPort)
	}
	c, err := strandclient.New(strandclient.Config{
		Controller:     "controller:" + controllerPort,
		Brokers:        brokers,
		HTTPClient:     h.http,
		RetryBudget:    30 * time.Second,
		AttemptTimeout: 3 * time.Second,
	})
	if err != nil {
		h.t.Fatalf("client: %v", err)
	}
	h.t.Cleanup(func() { _ = c.Close() })
	return c
}

// broker returns a raw StreamService client of one broker: no redirects, no
// retries.
func (h *harness) broker(name string) strandv1connect.StreamServiceClient {
	return strandv1connect.NewStreamServiceClient(h.http, rpcserver.BaseURL(name+":"+brokerPort))
}

// createStream creates a replicated stream and waits until every copy
// reports the first assignment in its heartbeat.
func (h *harness) createStream(ctx context.Context, name string, copies int, policy string) cluster.Assignment {
	h.t.Helper()
	res, err := h.admin.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{
		Name: name, Copies: uint32(copies), Policy: &strandv1.ConfirmPolicy{Name: policy},
	}))
	if err != nil {
		h.t.Fatalf("create stream %s: %v", name, err)
	}
	a := res.Msg.GetAssignment()
	h.t.Logf("stream %s: epoch %d, owner %s, followers %v", name, a.GetEpoch(), a.GetOwner(), a.GetFollowers())
	clustertest.Eventually(h.t, 30*time.Second, "every copy of "+name+" applied its assignment", func() (bool, string) {
		st, err := h.getStream(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, c := range st.GetCopies() {
			if c.GetLive() && c.GetEpoch() == a.GetEpoch() {
				n++
			}
		}
		return n == copies, describeCopies(st)
	})
	got, ok := h.assignment(ctx, name)
	if !ok {
		h.t.Fatalf("no assignment of %s in etcd", name)
	}
	return got
}

func (h *harness) getStream(ctx context.Context, name string) (*strandv1.GetStreamResponse, error) {
	res, err := h.admin.GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: name}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func describeCopies(st *strandv1.GetStreamResponse) string {
	var b strings.Builder
	a := st.GetAssignment()
	fmt.Fprintf(&b, "assignment epoch %d owner %s followers %v;", a.GetEpoch(), a.GetOwner(), a.GetFollowers())
	for _, c := range st.GetCopies() {
		fmt.Fprintf(&b, " %s(%s live=%t epoch=%d tail=%d wm=%d seal=%d)", c.GetNode(), c.GetRole(), c.GetLive(),
			c.GetEpoch(), c.GetRecordTail(), c.GetConfirmWatermark(), c.GetSealEpoch())
	}
	if r := st.GetPendingRecovery(); r != nil {
		fmt.Fprintf(&b, " pending recovery fence %d proposed %s;", r.GetFenceEpoch(), r.GetProposedOwner())
	}
	for _, e := range st.GetAttention() {
		fmt.Fprintf(&b, " attention %s: %s;", e.GetKind(), e.GetReason())
	}
	return b.String()
}

func copyOf(st *strandv1.GetStreamResponse, node string) *strandv1.CopyStatus {
	for _, c := range st.GetCopies() {
		if c.GetNode() == node {
			return c
		}
	}
	return nil
}

// The coordination state, read straight from etcd: it stays readable while
// the controller is down.

func (h *harness) assignment(ctx context.Context, stream string) (cluster.Assignment, bool) {
	h.t.Helper()
	a, ok, err := getJSON[cluster.Assignment](ctx, h.etcd, h.schema.AssignmentKey(stream))
	if err != nil {
		h.t.Fatalf("read assignment: %v", err)
	}
	return a, ok
}

func (h *harness) history(ctx context.Context, stream string) cluster.HistoryStarts {
	h.t.Helper()
	hs, _, err := getJSON[cluster.HistoryStarts](ctx, h.etcd, h.schema.HistoryKey(stream))
	if err != nil {
		h.t.Fatalf("read history: %v", err)
	}
	return hs
}

func (h *harness) recovery(ctx context.Context, stream string) (cluster.Recovery, bool) {
	h.t.Helper()
	r, ok, err := getJSON[cluster.Recovery](ctx, h.etcd, h.schema.RecoveryKey(stream))
	if err != nil {
		h.t.Fatalf("read recovery: %v", err)
	}
	return r, ok
}

func getJSON[T any](ctx context.Context, cli *clientv3.Client, key string) (T, bool, error) {
	var zero T
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := cli.Get(ctx, key)
	if err != nil {
		return zero, false, err
	}
	if len(res.Kvs) == 0 {
		return zero, false, nil
	}
	v, err := cluster.Decode[T](res.Kvs[0].Value)
	return v, err == nil, err
}

// waitNewOwner waits until the stream has an assignment past epoch whose
// owner is not old and no recovery is pending: a failover that completed.
func (h *harness) waitNewOwner(ctx context.Context, stream string, epoch uint64, old string, timeout time.Duration) cluster.Assignment {
	h.t.Helper()
	var a cluster.Assignment
	clustertest.Eventually(h.t, timeout, "a new owner of "+stream, func() (bool, string) {
		var ok bool
		a, ok = h.assignment(ctx, stream)
		_, pending := h.recovery(ctx, stream)
		return ok && a.Epoch > epoch && a.Owner != old && !pending,
			fmt.Sprintf("epoch %d owner %s followers %v, recovery pending %t", a.Epoch, a.Owner, a.Followers, pending)
	})
	return a
}

// waitRejoined waits until node is a live follower of the stream's current
// assignment at epoch, caught up with the owner's record tail.
func (h *harness) waitRejoined(ctx context.Context, stream, nodeName string, epoch uint64, timeout time.Duration) *strandv1.GetStreamResponse {
	h.t.Helper()
	var st *strandv1.GetStreamResponse
	clustertest.Eventually(h.t, timeout, nodeName+" rejoins "+stream+" as a caught-up follower", func() (bool, string) {
		var err error
		st, err = h.getStream(ctx, stream)
		if err != nil {
			return false, err.Error()
		}
		a := st.GetAssignment()
		c, o := copyOf(st, nodeName), copyOf(st, a.GetOwner())
		ok := a.GetEpoch() == epoch && slices.Contains(a.GetFollowers(), nodeName) &&
			c != nil && o != nil && c.GetLive() && c.GetRole() == cluster.RoleFollower && c.GetEpoch() == epoch &&
			c.GetRecordTail() == o.GetRecordTail() && c.GetConfirmWatermark() == o.GetConfirmWatermark()
		return ok, describeCopies(st)
	})
	return st
}

// sampleCount reads a broker's /metrics and returns the sample count of
// histogram metric (summed over its label series), or an error when the
// broker does not serve it.
func (h *harness) sampleCount(ctx context.Context, name, metric string) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rpcserver.BaseURL(name+":"+brokerPort)+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := h.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s /metrics: %s", name, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s /metrics: %w", name, err)
	}
	f, ok := fams[metric]
	if !ok {
		return 0, fmt.Errorf("%s /metrics has no %s", name, metric)
	}
	var n uint64
	for _, m := range f.GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n, nil
}
