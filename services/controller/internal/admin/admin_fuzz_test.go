package admin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/rpcerr"
)

// The fuzz targets of this package send what the fuzzer makes to the
// admin service of a leading controller over loopback, on an embedded
// etcd with three registered brokers (startFlood). Each checks that a
// refused request answers a code of the admin table, naming the field it
// refuses when it refuses a field's value (docs/errors.md), and writes
// nothing: etcd's revision is where it was.

// fuzzAdmin is the flood server with streams "one" (one copy) and "three"
// (three copies) created.
func fuzzAdmin(f *testing.F) *floodServer {
	f.Helper()
	srv := startFlood(f, Config{}, "b1", "b2", "b3")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, copies := range map[string]uint32{"one": 1, "three": 3} {
		if _, err := srv.admin.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: copies})); err != nil {
			f.Fatal(err)
		}
	}
	return srv
}

// revision is etcd's current revision: any write moves it.
func (f *floodServer) revision(t *testing.T) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := f.cli.Get(ctx, "revision-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// adminFieldCodes are the codes refusing a field's value, which name it.
var adminFieldCodes = []connect.Code{connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodeResourceExhausted}

// refusedCodes are the codes an admin call may refuse with here: no code
// of a fault (Internal, Unknown, Unavailable: etcd is up and the service
// leads).
var refusedCodes = []connect.Code{connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists,
	connect.CodeFailedPrecondition, connect.CodeAborted}

// call runs one admin call, and for a refusal checks its code and field
// and that etcd's revision did not move. It reports whether the call was
// answered.
func (f *floodServer) call(t *testing.T, name string, req proto.Message, do func(context.Context) error) bool {
	t.Helper()
	if _, err := proto.Marshal(req); err != nil {
		return false // not UTF-8: the client refuses to send it
	}
	before := f.revision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := do(ctx)
	if err == nil {
		return true
	}
	code := connect.CodeOf(err)
	if !slices.Contains(refusedCodes, code) {
		t.Fatalf("%s(%v): answered %v (%v), want one of %v", name, req, code, err, refusedCodes)
	}
	if slices.Contains(adminFieldCodes, code) {
		fv := rpcerr.FieldViolations(err)
		var cerr *connect.Error
		if len(fv) != 1 || !errors.As(err, &cerr) || !strings.HasPrefix(cerr.Message(), fv[0].GetField()+":") {
			t.Fatalf("%s(%v): %v does not name its field (violations %v)", name, req, err, fv)
		}
	}
	if after := f.revision(t); after != before {
		t.Fatalf("%s(%v): refused with %v, yet etcd moved from revision %d to %d", name, req, err, before, after)
	}
	return false
}

func FuzzCreateStream(f *testing.F) {
	srv := fuzzAdmin(f)
	f.Add("new", uint32(1), "", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("two", uint32(2), cluster.MajorityDurable, uint32(0), uint64(10), uint64(1<<20), int64(60), int32(0))
	f.Add("acc", uint32(3), cluster.ReplicaAccepted, uint32(2), uint64(0), uint64(0), int64(0), int32(5))
	f.Add("one", uint32(1), "", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("many", uint32(4), "", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("big", uint32(MaxCopies+1), "", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("pol", uint32(1), "", uint32(2), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("pol2", uint32(1), "fastest", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("age", uint32(1), "", uint32(0), uint64(0), uint64(0), int64(-1), int32(0))
	f.Add("age2", uint32(1), "", uint32(0), uint64(0), uint64(0), int64(1), int32(-2_000_000_000))
	f.Add("Bad", uint32(1), "", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Add("", uint32(1), "", uint32(0), uint64(0), uint64(0), int64(0), int32(0))
	f.Fuzz(func(t *testing.T, name string, copies uint32, policy string, nodes uint32, maxRecords, maxBytes uint64, ageSec int64, ageNanos int32) {
		req := &strandv1.CreateStreamRequest{Name: name, Copies: copies,
			Policy:    &strandv1.ConfirmPolicy{Name: policy, Nodes: nodes},
			Retention: &strandv1.Retention{MaxRecords: maxRecords, MaxBytes: maxBytes}}
		if ageSec != 0 || ageNanos != 0 {
			req.Retention.MaxAge = &durationpb.Duration{Seconds: ageSec, Nanos: ageNanos}
		}
		var res *connect.Response[strandv1.CreateStreamResponse]
		if !srv.call(t, "CreateStream", req, func(ctx context.Context) (err error) {
			res, err = srv.admin.CreateStream(ctx, connect.NewRequest(req))
			return err
		}) {
			return
		}
		a := res.Msg.GetAssignment()
		if want := max(1, int(copies)); 1+len(a.GetFollowers()) != want || a.GetEpoch() != 1 || res.Msg.GetSpec().GetName() != name {
			t.Fatalf("created %q with %d copies: %v", name, copies, res.Msg)
		}
	})
}

func FuzzDeleteStream(f *testing.F) {
	srv := fuzzAdmin(f)
	f.Add("one", "wrong-incarnation")
	f.Add("one", "")
	f.Add("three", "")
	f.Add("absent", "")
	f.Add("-x", "")
	f.Fuzz(func(t *testing.T, name, incarnation string) {
		req := &strandv1.DeleteStreamRequest{Name: name, Incarnation: incarnation}
		srv.call(t, "DeleteStream", req, func(ctx context.Context) error {
			_, err := srv.admin.DeleteStream(ctx, connect.NewRequest(req))
			return err
		})
	})
}

func FuzzGetStream(f *testing.F) {
	srv := fuzzAdmin(f)
	f.Add("one")
	f.Add("absent")
	f.Add(strings.Repeat("a", 129))
	f.Fuzz(func(t *testing.T, name string) {
		req := &strandv1.GetStreamRequest{Name: name}
		var res *connect.Response[strandv1.GetStreamResponse]
		if srv.call(t, "GetStream", req, func(ctx context.Context) (err error) {
			res, err = srv.admin.GetStream(ctx, connect.NewRequest(req))
			return err
		}) && res.Msg.GetSpec().GetName() != name {
			t.Fatalf("GetStream(%q) answered %v", name, res.Msg)
		}
	})
}

// FuzzListStreams: any page size and token is answered with at most the
// page size of streams, in name order, after the token's stream; or
// refused naming page_size or page_token.
func FuzzListStreams(f *testing.F) {
	srv := fuzzAdmin(f)
	f.Add(int32(0), "")
	f.Add(int32(1), "")
	f.Add(int32(1), encodePageToken("one"))
	f.Add(int32(-1), "")
	f.Add(int32(maxPageSize+1), "")
	f.Add(int32(5), "not a token")
	f.Add(int32(5), encodePageToken(""))
	f.Fuzz(func(t *testing.T, size int32, token string) {
		req := &strandv1.ListStreamsRequest{PageSize: size, PageToken: token}
		var res *connect.Response[strandv1.ListStreamsResponse]
		if !srv.call(t, "ListStreams", req, func(ctx context.Context) (err error) {
			res, err = srv.admin.ListStreams(ctx, connect.NewRequest(req))
			return err
		}) {
			return
		}
		limit := int(size)
		if limit == 0 {
			limit = defaultPageSize
		}
		after, _ := decodePageToken(token)
		names := []string{}
		for _, s := range res.Msg.GetStreams() {
			names = append(names, s.GetSpec().GetName())
		}
		if len(names) > limit || !slices.IsSorted(names) || (len(names) > 0 && after != "" && names[0] <= after) {
			t.Fatalf("ListStreams(%d, after %q) = %v", size, after, names)
		}
		if next := res.Msg.GetNextPageToken(); next != "" {
			if last, err := decodePageToken(next); err != nil || len(names) == 0 || last != names[len(names)-1] {
				t.Fatalf("next page token %q (%q, %v) after %v", next, last, err, names)
			}
		}
	})
}

// FuzzPageToken: decoding never panics, refuses what a response did not
// give naming page_token, and takes back every token a response gives.
func FuzzPageToken(f *testing.F) {
	f.Add("", "one")
	f.Add(encodePageToken("one"), "a.b-c")
	f.Add("YWZ0ZXI6", "x")
	f.Add("%%%", "")
	f.Fuzz(func(t *testing.T, token, name string) {
		last, err := decodePageToken(token)
		if err != nil {
			if fv := rpcerr.FieldViolations(err); len(fv) != 1 || fv[0].GetField() != "page_token" || connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("decodePageToken(%q) = %v, want InvalidArgument naming page_token", token, err)
			}
		} else if token == "" && last != "" {
			t.Fatalf("no token decodes to %q", last)
		}
		if name == "" {
			return
		}
		if got, err := decodePageToken(encodePageToken(name)); err != nil || got != name {
			t.Fatalf("the token of %q decodes to %q, %v", name, got, err)
		}
	})
}

func FuzzUpdateStream(f *testing.F) {
	srv := fuzzAdmin(f)
	f.Add("one", uint32(2), "", uint32(0))
	f.Add("three", uint32(0), cluster.ReplicaDurable, uint32(3))
	f.Add("three", uint32(1), "", uint32(0))
	f.Add("three", uint32(0), "bogus", uint32(0))
	f.Add("three", uint32(0), "", uint32(3))
	f.Add("one", uint32(MaxCopies+1), "", uint32(0))
	f.Add("absent", uint32(1), "", uint32(0))
	f.Add("", uint32(1), "", uint32(0))
	f.Fuzz(func(t *testing.T, name string, copies uint32, policy string, nodes uint32) {
		req := &strandv1.UpdateStreamRequest{Name: name, Copies: copies, Policy: &strandv1.ConfirmPolicy{Name: policy, Nodes: nodes}}
		srv.call(t, "UpdateStream", req, func(ctx context.Context) error {
			_, err := srv.admin.UpdateStream(ctx, connect.NewRequest(req))
			return err
		})
	})
}

// operatorSeeds are stream, node, who and why of operator actions: the
// streams here have live owners, so most are refused.
func operatorSeeds(f *testing.F) {
	f.Add("three", "", "ops", "drill")
	f.Add("three", "b2", "", "")
	f.Add("one", "", "", "")
	f.Add("absent", "", "", "")
	f.Add("three", "bad node!", "", "")
	f.Add("three", "", strings.Repeat("w", maxOperatorNote+1), "")
	f.Add("three", "", "", strings.Repeat("y", maxOperatorNote+1))
	f.Add("", "", "", "")
}

func FuzzAcceptOwnerLoss(f *testing.F) {
	srv := fuzzAdmin(f)
	operatorSeeds(f)
	f.Fuzz(func(t *testing.T, stream, node, who, why string) {
		req := &strandv1.AcceptOwnerLossRequest{Stream: stream, Node: node, Who: who, Why: why}
		srv.call(t, "AcceptOwnerLoss", req, func(ctx context.Context) error {
			_, err := srv.admin.AcceptOwnerLoss(ctx, connect.NewRequest(req))
			return err
		})
	})
}

func FuzzWithdrawRecovery(f *testing.F) {
	srv := fuzzAdmin(f)
	operatorSeeds(f)
	f.Fuzz(func(t *testing.T, stream, _, who, why string) {
		req := &strandv1.WithdrawRecoveryRequest{Stream: stream, Who: who, Why: why}
		srv.call(t, "WithdrawRecovery", req, func(ctx context.Context) error {
			_, err := srv.admin.WithdrawRecovery(ctx, connect.NewRequest(req))
			return err
		})
	})
}

func FuzzFailover(f *testing.F) {
	srv := fuzzAdmin(f)
	operatorSeeds(f)
	f.Fuzz(func(t *testing.T, stream, _, who, why string) {
		req := &strandv1.FailoverRequest{Stream: stream, Who: who, Why: why}
		srv.call(t, "Failover", req, func(ctx context.Context) error {
			_, err := srv.admin.Failover(ctx, connect.NewRequest(req))
			return err
		})
	})
}
