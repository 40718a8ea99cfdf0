package app

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// harness runs real brokers against a real embedded etcd; assignments are
// written straight into etcd, as the controller would.
type harness struct {
	t       *testing.T
	etcd    *etcdtest.Server
	cli     *clientv3.Client
	schema  cluster.Schema
	dir     string
	brokers map[string]*App
	addrs   map[string]string
	confirm time.Duration
	// tokens overrides a node's peer tokens (default: harnessPeerToken
	// alone).
	tokens map[string]peerTokens
	// configure, when set, adjusts a broker's Config before it starts.
	configure func(*Config)
}

// peerTokens are a broker's peer token and the tokens it accepts besides.
type peerTokens struct {
	token    string
	accepted []string
}

func newHarness(t *testing.T, nodes ...string) *harness {
	t.Helper()
	return newHarnessWithTokens(t, nil, nodes...)
}

func newHarnessWithTokens(t *testing.T, tokens map[string]peerTokens, nodes ...string) *harness {
	t.Helper()
	e := etcdtest.Start(t)
	h := &harness{t: t, etcd: e, cli: e.Client(t), schema: cluster.NewSchema(""), dir: t.TempDir(),
		brokers: map[string]*App{}, addrs: map[string]string{}, confirm: 2 * time.Second, tokens: tokens}
	for _, n := range nodes {
		h.start(n)
	}
	t.Cleanup(func() {
		for _, b := range h.brokers {
			_ = b.Close()
		}
	})
	return h
}

func (h *harness) start(node string) *App {
	h.t.Helper()
	log := zerolog.New(io.Discard)
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(h.t)).Level(zerolog.InfoLevel)
	}
	listen := "127.0.0.1:0"
	if addr, ok := h.addrs[node]; ok {
		listen = addr // a restarted broker keeps its address
	}
	tokens, ok := h.tokens[node]
	if !ok {
		tokens = peerTokens{token: harnessPeerToken}
	}
	cfg := Config{
		Node: node, Listen: listen, DataDir: filepath.Join(h.dir, node), Etcd: h.etcd.Endpoints,
		Heartbeat: 200 * time.Millisecond, LeaseTTL: 2 * time.Second, ConfirmTimeout: h.confirm, Logger: &log,
		PeerToken: tokens.token, PeerTokensAccepted: tokens.accepted, TLS: tlsconfig.Settings{Insecure: true},
	}
	if h.configure != nil {
		h.configure(&cfg)
	}
	a, err := Start(context.Background(), cfg)
	if err != nil {
		h.t.Fatalf("start %s: %v", node, err)
	}
	select {
	case <-a.Ready():
	case <-time.After(20 * time.Second):
		h.t.Fatalf("%s not ready", node)
	}
	h.brokers[node] = a
	h.addrs[node] = a.Addr()
	return a
}

func (h *harness) stop(node string) {
	h.t.Helper()
	if err := h.brokers[node].Close(); err != nil {
		h.t.Fatalf("close %s: %v", node, err)
	}
	delete(h.brokers, node)
}

func (h *harness) assign(a cluster.Assignment) {
	h.t.Helper()
	if _, err := h.cli.Put(context.Background(), h.schema.AssignmentKey(a.Stream), cluster.Encode(a)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) streams(node string) strandv1connect.StreamServiceClient {
	return strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs[node]))
}

// harnessPeerToken is the harness cluster's peer token.
const harnessPeerToken = "harness-peer-token"

// replication is a ReplicationService client of node with the peer token.
func (h *harness) replication(node string) strandv1connect.ReplicationServiceClient {
	return h.replicationAs(node, harnessPeerToken)
}

// replicationAs is a ReplicationService client of node sending token.
func (h *harness) replicationAs(node, token string) strandv1connect.ReplicationServiceClient {
	return strandv1connect.NewReplicationServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(h.addrs[node]), rpcserver.WithPeerToken(token))
}

// publish sends one record per payload, retrying while the owner is not yet
// serving the assignment (it is applied asynchronously from the watch).
func (h *harness) publish(node, stream string, payloads ...string) []uint64 {
	h.t.Helper()
	recs := make([]*strandv1.Record, 0, len(payloads))
	for _, p := range payloads {
		recs = append(recs, &strandv1.Record{Payload: []byte(p)})
	}
	var offsets []uint64
	clustertest.Eventually(h.t, 10*time.Second, "publish", func() error {
		resp, err := h.streams(node).Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: recs}))
		if err != nil {
			return err
		}
		offsets = resp.Msg.GetOffsets()
		return nil
	})
	return offsets
}

func (h *harness) readAll(node, stream string) ([]*strandv1.StoredRecord, error) {
	return clustertest.ReadAll(h.streams(node), node, stream)
}

func (h *harness) heartbeat(node, stream string) (cluster.CopyTails, error) {
	t, ok := clustertest.View{T: h.t, Cli: h.cli, Schema: h.schema}.Tails(node, stream)
	if !ok {
		return cluster.CopyTails{}, fmt.Errorf("no copy of %s in %s's heartbeat", stream, node)
	}
	return t, nil
}
