package bench

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/rpcserver"
)

// busyController answers CreateStream as a controller with no room does
// (Unavailable with a RetryInfo, docs/errors.md, "AdminService") for its
// first refuse calls, then creates; it records when each attempt came.
type busyController struct {
	strandv1connect.UnimplementedAdminServiceHandler
	refuse int
	delay  time.Duration

	mu       sync.Mutex
	attempts []time.Time
}

func (b *busyController) CreateStream(_ context.Context, req *connect.Request[strandv1.CreateStreamRequest]) (*connect.Response[strandv1.CreateStreamResponse], error) {
	b.mu.Lock()
	b.attempts = append(b.attempts, time.Now())
	n := len(b.attempts)
	b.mu.Unlock()
	if b.refuse < 0 || n <= b.refuse {
		err := connect.NewError(connect.CodeUnavailable, errors.New("too many concurrent admin calls; retry"))
		d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(b.delay)})
		if derr != nil {
			return nil, derr
		}
		err.AddDetail(d)
		return nil, err
	}
	return connect.NewResponse(&strandv1.CreateStreamResponse{Spec: &strandv1.StreamSpec{Name: req.Msg.GetName()}}), nil
}

func (b *busyController) times() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.attempts...)
}

// busyClient serves ctl over loopback HTTP and returns a client of it with
// the bench's interceptor, counting refusals into busy. The client's own
// backoff is 1-2 ms, so the waits the test sees are the interceptor's.
func busyClient(t *testing.T, ctl *busyController, busy *atomic.Int64) *client.Client {
	t.Helper()
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux, _ := rpcserver.Mux(strandv1connect.AdminServiceName)
	mux.Handle(strandv1connect.NewAdminServiceHandler(ctl))
	srv := rpcserver.Serve(ln, mux)
	t.Cleanup(func() { _ = srv.Close() })
	c, err := client.New(client.Config{Controller: srv.Addr(), Brokers: []string{srv.Addr()},
		BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond,
		Options: []connect.ClientOption{connect.WithInterceptors(waitRetryInfo(busy))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestCreateWaitsTheRetryInfoDelay(t *testing.T) {
	const delay = 80 * time.Millisecond
	ctl := &busyController{refuse: 3, delay: delay}
	var busy atomic.Int64
	c := busyClient(t, ctl, &busy)
	ctx, cancel := context.WithTimeout(withBusyCount(context.Background()), 10*time.Second)
	defer cancel()
	if _, err := c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "s", Copies: 1})); err != nil {
		t.Fatalf("create refused busy 3 times, then admitted: %v", err)
	}
	at := ctl.times()
	if len(at) != 4 {
		t.Fatalf("%d attempts, want 4 (3 refused, 1 admitted)", len(at))
	}
	// Without the interceptor the client asks again after its 1-2 ms
	// backoff; the controller said to wait delay.
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < delay {
			t.Errorf("attempt %d came %v after the refusal before it, want at least the RetryInfo delay %v", i+1, gap, delay)
		}
	}
	if busy.Load() != 3 {
		t.Errorf("busy refusals counted %d, want 3", busy.Load())
	}
}

func TestCreateRefusedBusyGivesUpAfterMaxAttempts(t *testing.T) {
	ctl := &busyController{refuse: -1, delay: time.Millisecond}
	var busy atomic.Int64
	c := busyClient(t, ctl, &busy)
	ctx, cancel := context.WithTimeout(withBusyCount(context.Background()), 20*time.Second)
	defer cancel()
	_, err := c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "s", Copies: 1}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("create always refused busy = %v, want ResourceExhausted after %d attempts", err, maxBusyAttempts)
	}
	if n := len(ctl.times()); n != maxBusyAttempts {
		t.Fatalf("%d attempts, want %d", n, maxBusyAttempts)
	}
	if ctx.Err() != nil {
		t.Fatalf("gave up by the deadline, not by the attempt bound")
	}
}
