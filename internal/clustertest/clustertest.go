// Package clustertest reads a running cluster's state from etcd for tests:
// the in-process clusters of internal/onebox and the process clusters of
// strandctl's tests both look at a cluster through it.
package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/rpcserver"
)

// callTimeout bounds each etcd or broker call a helper makes.
const callTimeout = 10 * time.Second

// View reads one cluster's keys.
type View struct {
	T      testing.TB
	Cli    *clientv3.Client
	Schema cluster.Schema
}

// Get decodes the value at key; ok is false when the key is absent.
func Get[T any](v View, key string) (T, bool) {
	v.T.Helper()
	var out T
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := v.Cli.Get(ctx, key)
	if err != nil {
		v.T.Fatalf("clustertest: get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return out, false
	}
	out, err = cluster.Decode[T](resp.Kvs[0].Value)
	if err != nil {
		v.T.Fatalf("clustertest: decode %s: %v", key, err)
	}
	return out, true
}

// Assignment reads a stream's assignment.
func (v View) Assignment(stream string) (cluster.Assignment, bool) {
	return Get[cluster.Assignment](v, v.Schema.AssignmentKey(stream))
}

// Recovery reads a stream's pending recovery.
func (v View) Recovery(stream string) (cluster.Recovery, bool) {
	return Get[cluster.Recovery](v, v.Schema.RecoveryKey(stream))
}

// History reads a stream's history starts; absent is empty.
func (v View) History(stream string) cluster.HistoryStarts {
	h, _ := Get[cluster.HistoryStarts](v, v.Schema.HistoryKey(stream))
	return h
}

// HasKey reports whether key exists.
func (v View) HasKey(key string) bool {
	v.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := v.Cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		v.T.Fatalf("clustertest: get %s: %v", key, err)
	}
	return resp.Count > 0
}

// Tails reads what node last published about its copy of stream in its
// heartbeat (the shard that carries the stream); ok is false when there is
// no heartbeat or no copy.
func (v View) Tails(node, stream string) (cluster.CopyTails, bool) {
	hb, ok := Get[cluster.Heartbeat](v, v.Schema.HeartbeatKey(node, cluster.HeartbeatShard(stream)))
	if !ok {
		return cluster.CopyTails{}, false
	}
	t, ok := hb.Streams[stream]
	return t, ok
}

// WaitApplied waits until every member of a publishes its copy at a's
// epoch in its role; members for which skip returns true (brokers a test
// stopped) are not waited for.
func (v View) WaitApplied(a cluster.Assignment, within time.Duration, skip func(node string) bool) {
	v.T.Helper()
	Eventually(v.T, within, fmt.Sprintf("assignment of %s at epoch %d applied", a.Stream, a.Epoch), func() error {
		for _, m := range a.Members() {
			if skip != nil && skip(m) {
				continue
			}
			role := cluster.RoleFollower
			if m == a.Owner {
				role = cluster.RoleOwner
			}
			if t, ok := v.Tails(m, a.Stream); !ok || t.Epoch != a.Epoch || t.Role != role {
				return fmt.Errorf("%s publishes %+v (present %v), want %s at epoch %d", m, t, ok, role, a.Epoch)
			}
		}
		return nil
	})
}

// ReadAll reads every confirmed record of stream that node's copy shows,
// from offset 0, with raw Read calls to that broker (a follower serves
// reads below its watermark).
func ReadAll(sc strandv1connect.StreamServiceClient, node, stream string) ([]*strandv1.StoredRecord, error) {
	var out []*strandv1.StoredRecord
	from := uint64(0)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		resp, err := sc.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: stream, FromOffset: from}))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read %s on %s from %d: %w", stream, node, from, err)
		}
		recs := resp.Msg.GetRecords()
		if len(recs) == 0 {
			return out, nil
		}
		out = append(out, recs...)
		from = resp.Msg.GetNextOffset()
	}
}

// WithUnknownField adds an unknown field of n zero bytes to m and returns
// it: bytes no handler reads or counts, which gzip shrinks to almost
// nothing (tests of request read limits).
func WithUnknownField[M proto.Message](m M, n int) M {
	b := protowire.AppendTag(nil, 999, protowire.BytesType)
	m.ProtoReflect().SetUnknown(protowire.AppendBytes(b, make([]byte, n)))
	return m
}

// Serve serves handler at path (a Connect service's, from its New…Handler)
// on a free loopback port over h2c, as a service does, until the test ends,
// and returns the server (its Addr is what clients dial).
func Serve(t testing.TB, path string, handler http.Handler) *rpcserver.Server {
	t.Helper()
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle(path, handler)
	srv := rpcserver.Serve(ln, mux)
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}
