package api

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// startService serves a StreamService over loopback on a manager over real
// Badger in dir, and returns the manager, a client of the service, and a
// stop that closes both (a restart opens dir again).
func startService(t *testing.T, dir string) (*replica.Manager, strandv1connect.StreamServiceClient, func()) {
	t.Helper()
	db, err := storage.Open(storage.Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := replica.NewManager(replica.Config{Node: "b1", Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: time.Second,
		History: func(context.Context, string, int64) (cluster.HistoryStarts, error) { return nil, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	path, handler := NewStreamService(m, Limits{}, zerolog.Nop()).Handler(auth.Open())
	srv := clustertest.Serve(t, path, handler)
	stop := func() {
		_ = srv.Close()
		m.Close()
		_ = db.Close()
	}
	t.Cleanup(stop)
	return m, strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(srv.Addr())), stop
}

// everyCall makes each StreamService call a client makes for stream and
// returns its error by name.
func everyCall(t *testing.T, sc strandv1connect.StreamServiceClient, stream string) map[string]error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := map[string]error{}
	_, errs["Publish"] = sc.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: stream, Records: []*strandv1.Record{{Payload: []byte("x")}}}))
	_, errs["Read"] = sc.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: stream}))
	_, errs["CommitCursor"] = sc.CommitCursor(ctx, connect.NewRequest(&strandv1.CommitCursorRequest{Stream: stream, Cursor: "c", Offset: 1}))
	_, errs["GetCursor"] = sc.GetCursor(ctx, connect.NewRequest(&strandv1.GetCursorRequest{Stream: stream, Cursor: "c"}))
	_, errs["Locate"] = sc.Locate(ctx, connect.NewRequest(&strandv1.LocateRequest{Stream: stream}))
	sub, err := sc.Subscribe(ctx, connect.NewRequest(&strandv1.SubscribeRequest{Stream: stream}))
	if err == nil {
		for sub.Receive() {
		}
		err = sub.Err()
		_ = sub.Close()
	}
	errs["Subscribe"] = err
	return errs
}

func wantCodes(t *testing.T, when string, errs map[string]error, want connect.Code) {
	t.Helper()
	for call, err := range errs {
		if connect.CodeOf(err) != want {
			t.Errorf("%s: %s = %v, want %v", when, call, err, want)
		}
	}
}

// NotFound means the stream does not exist in etcd, and a broker can only
// know that while its assignments mirror etcd. Before its first listing (it
// just started) and after its watch ended, a stream it has no assignment
// for may exist all the same: every call answers Unavailable, which clients
// retry. A copy it found on disk and has no assignment for yet (a restart)
// is no different.
func TestUnknownStreamIsNotFoundOnlyWhileAssignmentsAreCurrent(t *testing.T) {
	dir := t.TempDir()
	m, sc, stop := startService(t, dir)
	wantCodes(t, "before the first listing", everyCall(t, sc, "s"), connect.CodeUnavailable)

	m.SyncAssignments(map[string]cluster.Assignment{}, nil)
	wantCodes(t, "listed, no assignment", everyCall(t, sc, "s"), connect.CodeNotFound)

	m.AssignmentsStale()
	wantCodes(t, "watch ended", everyCall(t, sc, "s"), connect.CodeUnavailable)

	// A stream with a copy on this broker, then a restart: the copy is on
	// disk, the assignment not read yet.
	m.SyncAssignments(map[string]cluster.Assignment{"kept": {Stream: "kept", Epoch: 1, Owner: "b1"}}, nil)
	clustertest.Eventually(t, 10*time.Second, "the owner of kept confirms a publish", func() error {
		_, err := sc.Publish(context.Background(), connect.NewRequest(&strandv1.PublishRequest{Stream: "kept", Records: []*strandv1.Record{{Payload: []byte("r0")}}}))
		return err
	})
	stop()
	m, sc, _ = startService(t, dir)
	wantCodes(t, "restarted, copy on disk, not listed", everyCall(t, sc, "kept"), connect.CodeUnavailable)
	m.SyncAssignments(map[string]cluster.Assignment{"kept": {Stream: "kept", Epoch: 1, Owner: "b1"}}, nil)
	clustertest.Eventually(t, 10*time.Second, "the restarted owner serves reads", func() error {
		res, err := sc.Read(context.Background(), connect.NewRequest(&strandv1.ReadRequest{Stream: "kept"}))
		if err == nil && len(res.Msg.GetRecords()) != 1 {
			return fmt.Errorf("read %d records, want 1", len(res.Msg.GetRecords()))
		}
		return err
	})
	wantCodes(t, "restarted, listed, another stream", everyCall(t, sc, "other"), connect.CodeNotFound)
}
