package rpcserver_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcserver"
)

// waitsForEver is a handler stuck on something that never answers (etcd
// while it is unreachable): it returns only when its context ends. It
// reports the deadline its context carried.
type waitsForEver struct {
	strandv1connect.UnimplementedAdminServiceHandler
	deadlines chan time.Time
}

func (w waitsForEver) ListStreams(ctx context.Context, _ *connect.Request[strandv1.ListStreamsRequest]) (*connect.Response[strandv1.ListStreamsResponse], error) {
	dl, _ := ctx.Deadline()
	w.deadlines <- dl
	<-ctx.Done()
	return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
}

// A call without a deadline of its own is cut at the server's default; a
// call with one keeps it.
func TestDefaultTimeoutBoundsCallsWithoutADeadline(t *testing.T) {
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux, _ := rpcserver.Mux(strandv1connect.AdminServiceName)
	h := waitsForEver{deadlines: make(chan time.Time, 2)}
	mux.Handle(strandv1connect.NewAdminServiceHandler(h, connect.WithInterceptors(rpcserver.DefaultTimeout(200*time.Millisecond))))
	srv := rpcserver.Serve(ln, mux)
	t.Cleanup(func() { _ = srv.Close() })
	c := strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(srv.Addr()))

	got := make(chan error, 1)
	go func() {
		_, err := c.ListStreams(context.Background(), connect.NewRequest(&strandv1.ListStreamsRequest{}))
		got <- err
	}()
	select {
	case err := <-got:
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
			t.Fatalf("a call without a deadline: %v, want deadline_exceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call without a deadline still waits after 10s")
	}

	if dl := <-h.deadlines; dl.IsZero() {
		t.Fatal("the handler of a call without a deadline saw none")
	}

	// A deadline of the caller's own, longer than the default, is kept:
	// the handler sees the caller's, not the default's.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	own, _ := ctx.Deadline()
	_, err = c.ListStreams(ctx, connect.NewRequest(&strandv1.ListStreamsRequest{}))
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("a call with its own deadline: %v, want deadline_exceeded", err)
	}
	// Connect sends the deadline as a timeout in milliseconds: the
	// handler's is the caller's, give or take the time in transit, and
	// far past where the 200 ms default would have put it.
	if dl := <-h.deadlines; dl.Before(own.Add(-500 * time.Millisecond)) {
		t.Fatalf("the handler saw deadline %v, the caller set %v: the default replaced it", dl, own)
	}
}
