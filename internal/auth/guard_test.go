package auth

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
)

// An entry whose call carries no marker, neither a guard's nor Open's (a
// service wired without either), is refused Internal naming what is
// missing, never let through unchecked.
func TestCheckEntryWithoutMarkerRefuses(t *testing.T) {
	entry := &strandv1.PublishRequest{Stream: "orders", Records: []*strandv1.Record{{Payload: []byte("x")}}}
	err := CheckEntry(context.Background(), "orders", entry)
	if connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "entry guard") {
		t.Fatalf("CheckEntry without a marker answered %v, want Internal naming the missing entry guard", err)
	}
}

// entryChecker answers PublishMany with CheckEntry's verdict on each entry.
type entryChecker struct {
	strandv1connect.UnimplementedStreamServiceHandler
}

func (entryChecker) PublishMany(ctx context.Context, req *connect.Request[strandv1.PublishManyRequest]) (*connect.Response[strandv1.PublishManyResponse], error) {
	out := &strandv1.PublishManyResponse{}
	for _, p := range req.Msg.GetPublishes() {
		res := &strandv1.PublishResult{Outcome: &strandv1.PublishResult_Response{Response: &strandv1.PublishResponse{}}}
		if err := CheckEntry(ctx, p.GetStream(), p); err != nil {
			res.Outcome = &strandv1.PublishResult_Error{Error: &strandv1.PublishError{Code: uint32(connect.CodeOf(err)), Message: err.Error()}}
		}
		out.Results = append(out.Results, res)
	}
	return connect.NewResponse(out), nil
}

// Over a real Connect call: a service run with Open (auth off) has its
// PublishMany entries let through, and one run with no interceptor at all
// has them refused Internal.
func TestOpenMarksEntriesAndNoneRefuses(t *testing.T) {
	req := &strandv1.PublishManyRequest{Publishes: []*strandv1.PublishRequest{
		{Stream: "a", Records: []*strandv1.Record{{Payload: []byte("x")}}},
		{Stream: "b", Records: []*strandv1.Record{{Payload: []byte("y")}}},
	}}
	for _, tc := range []struct {
		name string
		opts []connect.HandlerOption
		want connect.Code
	}{
		{"open", []connect.HandlerOption{Open()}, 0},
		{"no marker", nil, connect.CodeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, h := strandv1connect.NewStreamServiceHandler(entryChecker{}, tc.opts...)
			srv := clustertest.Serve(t, path, h)
			cli := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(srv.Addr()))
			res, err := cli.PublishMany(context.Background(), connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Msg.GetResults()) != len(req.GetPublishes()) {
				t.Fatalf("%d results for %d entries", len(res.Msg.GetResults()), len(req.GetPublishes()))
			}
			for i, r := range res.Msg.GetResults() {
				if got := connect.Code(r.GetError().GetCode()); got != tc.want {
					t.Errorf("entry %d answered %v, want code %v", i, r, tc.want)
				}
			}
		})
	}
}
