package api

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// The fuzz targets of this package send what the fuzzer makes to a real
// broker: a replica manager over Badger in a temp dir, its StreamService
// and ReplicationService served over loopback as the broker serves them
// (Handler, with its read limits and publish codecs). Each checks that a
// refused request answers a code of its call's table naming the field it
// refuses (docs/errors.md) and stores nothing (docs/protocol.md: bad input
// changes no record tail, cursor event tail or seal).

// Names of the fuzz broker: it owns fuzzStream, followed by fuzzFollower
// on replica_durable:1 (W is 1: publishes confirm without the follower).
const (
	fuzzNode     = "b1"
	fuzzFollower = "b2"
	fuzzStream   = "s"
	fuzzCursor   = "c"
)

type fuzzBroker struct {
	m  *replica.Manager
	sc strandv1connect.StreamServiceClient
	rc strandv1connect.ReplicationServiceClient
	// incarnation of fuzzStream's assignment.
	incarnation string
	baseURL     string
}

// startFuzzBroker starts the broker with fuzzStream holding three records
// and fuzzCursor committed at 1.
func startFuzzBroker(tb testing.TB) *fuzzBroker {
	tb.Helper()
	m, baseURL := serveTestBroker(tb)
	b := &fuzzBroker{m: m, incarnation: "inc-1", baseURL: baseURL,
		sc: strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), baseURL),
		rc: strandv1connect.NewReplicationServiceClient(rpcserver.HTTPClient(), baseURL),
	}
	m.SyncAssignments(map[string]cluster.Assignment{fuzzStream: {Stream: fuzzStream, Epoch: 1, Owner: fuzzNode,
		Followers: []string{fuzzFollower}, Policy: cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}, Incarnation: b.incarnation}}, nil)
	ctx := context.Background()
	clustertest.Eventually(tb, 10*time.Second, "the fuzz broker confirms a publish", func() error {
		_, err := b.sc.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: fuzzStream,
			Records: []*strandv1.Record{{Payload: []byte("r0")}, {Payload: []byte("r1")}, {Payload: []byte("r2")}}}))
		return err
	})
	res, err := b.sc.CommitCursor(ctx, connect.NewRequest(&strandv1.CommitCursorRequest{Stream: fuzzStream, Cursor: fuzzCursor, Offset: 1}))
	if err != nil {
		tb.Fatal(err)
	}
	b.settleCursors(tb, res.Msg.GetCursorEventOffset()+1)
	return b
}

// serveTestBroker starts a broker named fuzzNode with no assignments: a
// replica manager over Badger in a temp dir, its StreamService and
// ReplicationService served over loopback as the broker serves them. It
// returns the manager and the base URL.
func serveTestBroker(tb testing.TB) (*replica.Manager, string) {
	tb.Helper()
	db, err := storage.Open(storage.Options{Dir: tb.TempDir(), Logger: zerolog.Nop()})
	if err != nil {
		tb.Fatal(err)
	}
	m, err := replica.NewManager(replica.Config{Node: fuzzNode, Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: 5 * time.Second,
		History: func(context.Context, string, int64) (cluster.HistoryStarts, error) { return nil, nil },
	})
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(NewStreamService(m, Limits{}, zerolog.Nop()).Handler(auth.Open()))
	mux.Handle(NewReplicationService(m, zerolog.Nop()).Handler())
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := rpcserver.Serve(ln, mux)
	tb.Cleanup(func() {
		_ = srv.Close()
		m.Close()
		_ = db.Close()
	})
	return m, rpcserver.BaseURL(srv.Addr())
}

// settleCursors waits until fuzzStream's durable cursor event tail is at
// least tail: a commit answers before its event is durable (cursor
// commits are not fsynced one by one, docs/limits.md), and a tail still
// moving would read as a later request's doing.
func (b *fuzzBroker) settleCursors(tb testing.TB, tail uint64) {
	tb.Helper()
	clustertest.Eventually(tb, 10*time.Second, "the cursor event is durable", func() bool {
		return b.m.Tails()[fuzzStream].CursorEventTail >= tail
	})
}

// fuzzState is what a refused request must leave as it was: every copy's
// tails (record tail, cursor event tail, head, seal) and the cursors
// named.
type fuzzState struct {
	tails   map[string]cluster.CopyTails
	cursors map[string]uint64
}

func (b *fuzzBroker) state(cursors ...string) fuzzState {
	st := fuzzState{tails: b.m.Tails(), cursors: map[string]uint64{}}
	for _, c := range append(cursors, fuzzCursor) {
		if validCursor(c, "cursor") != nil {
			continue
		}
		if pos, ok, err := b.m.Cursor(context.Background(), fuzzStream, c); err == nil && ok {
			st.cursors[c] = pos
		}
	}
	return st
}

// unchanged fails t if the broker's state differs from before.
func (b *fuzzBroker) unchanged(t *testing.T, call string, before fuzzState, cursors ...string) {
	t.Helper()
	after := b.state(cursors...)
	if !maps.Equal(before.tails, after.tails) {
		t.Errorf("%s: refused, yet the tails changed from %+v to %+v", call, before.tails, after.tails)
	}
	if !maps.Equal(before.cursors, after.cursors) {
		t.Errorf("%s: refused, yet the cursors changed from %v to %v", call, before.cursors, after.cursors)
	}
}

// fieldCodes are the codes that refuse a request field's value and so
// must name it (rpcerr.BadField).
var fieldCodes = []connect.Code{connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodeResourceExhausted}

// checkRefusal fails t unless err's code is one of allowed and, for a
// code refusing a field, err names the field in its message and its
// BadRequest detail.
func checkRefusal(t *testing.T, call string, err error, allowed ...connect.Code) {
	t.Helper()
	code := connect.CodeOf(err)
	if !slices.Contains(allowed, code) {
		t.Fatalf("%s: answered %v (%v), want one of %v", call, code, err, allowed)
	}
	if !slices.Contains(fieldCodes, code) || beforeDecoding(err) {
		return
	}
	fv := rpcerr.FieldViolations(err)
	if len(fv) != 1 || fv[0].GetField() == "" {
		t.Fatalf("%s: %v names no field (violations %v)", call, err, fv)
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) && !strings.HasPrefix(cerr.Message(), fv[0].GetField()+":") {
		t.Fatalf("%s: the message of %v does not start with its field %q", call, err, fv[0].GetField())
	}
}

// beforeDecoding reports whether err is connect-go's refusal of a request
// body before any field of it is read: one that does not decode, or one
// above the read limit (docs/errors.md: no detail).
func beforeDecoding(err error) bool {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return false
	}
	switch cerr.Code() {
	case connect.CodeInvalidArgument:
		return strings.HasPrefix(cerr.Message(), "unmarshal message:")
	case connect.CodeResourceExhausted:
		return strings.Contains(cerr.Message(), "larger than configured max")
	}
	return false
}

// fuzzCtx bounds one call: far beyond what one takes, so a call still
// running then hangs.
func fuzzCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
