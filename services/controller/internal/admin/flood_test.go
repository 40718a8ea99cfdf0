package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// floodServer is the admin service of a controller that leads, served over
// loopback HTTP as the controller serves it, on an embedded etcd with
// registered brokers.
type floodServer struct {
	cli    *clientv3.Client
	schema cluster.Schema
	addr   string
	admin  strandv1connect.AdminServiceClient
	view   *state.View
	live   []string
}

// startFlood starts the service with cfg's admission bounds and registers
// brokers; the service holds a term of its own (an election key it wrote).
func startFlood(t testing.TB, cfg Config, brokers ...string) *floodServer {
	t.Helper()
	e := etcdtest.Start(t)
	cli := e.Client(t)
	schema := cluster.NewSchema("")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	key := schema.ControllerElection() + "/flood"
	resp, err := cli.Put(ctx, key, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	gate := leader.NewGate(cli, schema.ControllerElection())
	gate.Set(leader.NewTerm(cli, key, resp.Header.Revision, make(chan struct{})))
	for _, n := range brokers {
		info := cluster.BrokerInfo{Node: n, Address: "127.0.0.1:1", StartTime: time.Now().UTC()}
		if _, err := cli.Put(ctx, schema.BrokerKey(n), cluster.Encode(info)); err != nil {
			t.Fatal(err)
		}
	}
	view := state.NewView(cli, schema, zerolog.Nop())
	viewDone := make(chan struct{})
	go func() {
		defer close(viewDone)
		_ = view.Run(ctx)
	}()
	t.Cleanup(func() { <-viewDone })
	t.Cleanup(cancel)

	cfg.View, cfg.Schema, cfg.Gate, cfg.Log = view, schema, gate, zerolog.Nop()
	if cfg.DefaultPolicy == (cluster.Policy{}) {
		cfg.DefaultPolicy = cluster.DefaultPolicy
	}
	// As the controller serves it: calls without a deadline get one.
	path, h := strandv1connect.NewAdminServiceHandler(New(cfg), connect.WithInterceptors(rpcserver.DefaultTimeout(30*time.Second)))
	srv := clustertest.Serve(t, path, h)
	return &floodServer{
		cli: cli, schema: schema, addr: srv.Addr(), view: view, live: slices.Sorted(slices.Values(brokers)),
		admin: strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(srv.Addr())),
	}
}

// floodDeadline bounds every call of a flood: far beyond what one takes,
// so a call still running then is one that hangs.
const floodDeadline = 2 * time.Minute

// createAll sends one CreateStream per name, at most workers at once (all
// at once when workers is 0), and returns each call's error.
func createAll(ctx context.Context, adm strandv1connect.AdminServiceClient, names []string, copies uint32, workers int) map[string]error {
	if workers <= 0 {
		workers = len(names)
	}
	out := make(map[string]error, len(names))
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan string)
	for range min(workers, len(names)) {
		wg.Go(func() {
			for name := range next {
				cctx, cancel := context.WithTimeout(ctx, floodDeadline)
				_, err := adm.CreateStream(cctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: copies}))
				cancel()
				mu.Lock()
				out[name] = err
				mu.Unlock()
			}
		})
	}
	for _, n := range names {
		next <- n
	}
	close(next)
	wg.Wait()
	return out
}

// refusedBusy reports whether err is the admission's refusal (ErrBusy),
// told by its RetryInfo detail, which nothing else the service answers
// carries.
func refusedBusy(err error) bool {
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeUnavailable {
		return false
	}
	for _, d := range cerr.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*errdetails.RetryInfo); ok {
				return true
			}
		}
	}
	return false
}

// stored reads every spec and assignment from etcd, and fails t unless
// they are whole: the same names in both, each assignment at epoch 1 with
// an incarnation, as many distinct live members as its spec has copies.
func (f *floodServer) stored(t testing.TB) map[string]cluster.Assignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	specs := map[string]cluster.StreamSpec{}
	asgs := map[string]cluster.Assignment{}
	for dir, into := range map[string]func(name string, v []byte) error{
		f.schema.StreamsDir(): func(name string, v []byte) error {
			s, err := cluster.Decode[cluster.StreamSpec](v)
			specs[name] = s
			return err
		},
		f.schema.AssignmentsDir(): func(name string, v []byte) error {
			a, err := cluster.Decode[cluster.Assignment](v)
			asgs[name] = a
			return err
		},
	} {
		resp, err := f.cli.Get(ctx, dir, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			name, err := cluster.NameIn(dir, string(kv.Key))
			if err != nil {
				t.Fatal(err)
			}
			if err := into(name, kv.Value); err != nil {
				t.Fatalf("%s: %v", kv.Key, err)
			}
		}
	}
	for name, s := range specs {
		a, ok := asgs[name]
		if !ok {
			t.Errorf("stream %s has a spec and no assignment", name)
			continue
		}
		m := a.Members()
		if a.Stream != name || s.Name != name || a.Epoch != 1 || a.Incarnation == "" || len(m) != s.Copies {
			t.Errorf("stream %s stored half made: spec %+v, assignment %+v", name, s, a)
		}
		for i, n := range m {
			if !slices.Contains(f.live, n) || slices.Contains(m[:i], n) {
				t.Errorf("stream %s placed on %v: %s is not a distinct live broker", name, m, n)
			}
		}
	}
	for name := range asgs {
		if _, ok := specs[name]; !ok {
			t.Errorf("stream %s has an assignment and no spec", name)
		}
	}
	return asgs
}

// A flood of concurrent CreateStream calls, far more than the service
// serves or queues at once, is answered: each call creates its stream or
// is refused Unavailable, and none hangs. What was answered OK is stored
// whole, what was refused for want of room is not stored at all, nothing
// is stored half made, and refused calls made again through the Go client
// (which retries Unavailable) create their streams.
//
// 2000 calls with 4 served and 32 queued at once exercise the bound as
// 10000 would, in a few seconds under -race on two cores;
// BenchmarkCreateFlood runs the 10000.
func TestCreateFloodIsAnsweredAndAllOrNothing(t *testing.T) {
	const n = 2000
	f := startFlood(t, Config{MaxCalls: 4, MaxQueued: 32, QueueWait: time.Second}, "b1", "b2", "b3", "b4")
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("flood-%05d", i)
	}
	ctx := context.Background()
	got := createAll(ctx, f.admin, names, 3, 0)

	var ok, busy, unavailable []string
	for _, name := range names {
		switch err := got[name]; {
		case err == nil:
			ok = append(ok, name)
		case refusedBusy(err):
			busy = append(busy, name)
		case connect.CodeOf(err) == connect.CodeUnavailable:
			unavailable = append(unavailable, name)
		default:
			t.Errorf("create %s: %v (code %v), want OK or Unavailable", name, err, connect.CodeOf(err))
		}
	}
	t.Logf("%d calls: %d created, %d refused busy, %d other Unavailable", n, len(ok), len(busy), len(unavailable))
	if len(ok) == 0 || len(busy) == 0 {
		t.Fatalf("%d created and %d refused busy: the flood should see both", len(ok), len(busy))
	}
	asgs := f.stored(t)
	for _, name := range ok {
		if _, found := asgs[name]; !found {
			t.Errorf("stream %s was answered created and is not stored", name)
		}
	}
	for _, name := range busy {
		if _, found := asgs[name]; found {
			t.Errorf("stream %s was refused busy and is stored", name)
		}
	}
	// Another Unavailable may have come after the transaction committed:
	// stored whole (checked above) or not at all, either is right.
	if len(asgs) > len(ok)+len(unavailable) {
		t.Errorf("%d streams stored, but only %d calls were answered created or may have applied", len(asgs), len(ok)+len(unavailable))
	}

	// The Go client retries Unavailable, and reads an AlreadyExists after
	// one as success when the stream is the one asked for.
	cl, err := client.New(client.Config{Controller: f.addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	// Every call that may have applied is made again, and enough refused
	// ones to keep the bound busy (all of them would only take longer).
	retry := slices.Concat(unavailable, busy[:min(len(busy), 300)])
	again := createAll(ctx, cl.Admin(), retry, 3, 16)
	for name, err := range again {
		if err != nil {
			t.Errorf("create %s again through the Go client: %v", name, err)
		}
	}
	if asgs, want := f.stored(t), len(ok)+len(retry); len(asgs) != want {
		t.Errorf("%d streams stored after the retries, want %d", len(asgs), want)
	}
}

// Concurrent creations of one name race on the same guarded transaction:
// one creates the stream, every other is told AlreadyExists (having read
// the winner's write on its next attempt), and the stream is stored once,
// whole.
func TestCreateFloodOfOneName(t *testing.T) {
	const n = 200
	f := startFlood(t, Config{}, "b1", "b2", "b3")
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range errs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), floodDeadline)
			defer cancel()
			_, errs[i] = f.admin.CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "contested", Copies: 2}))
		})
	}
	wg.Wait()
	created := 0
	for i, err := range errs {
		switch connect.CodeOf(err) {
		case connect.CodeAlreadyExists:
		default:
			if err == nil {
				created++
				continue
			}
			t.Errorf("create %d of the same name: %v, want OK once and AlreadyExists otherwise", i, err)
		}
	}
	if created != 1 {
		t.Errorf("%d creations of one name succeeded, want 1", created)
	}
	if asgs := f.stored(t); len(asgs) != 1 {
		t.Errorf("%d streams stored, want 1", len(asgs))
	}
}

// BenchmarkCreateFlood creates 10000 streams of 3 copies on 4 brokers with
// 64 calls in flight at once and the service's default bounds, and reports
// the rate. A run:
//
//	go test -run '^$' -bench CreateFlood -benchtime 1x ./services/controller/internal/admin/
func BenchmarkCreateFlood(b *testing.B) {
	const n, workers = 10000, 64
	for i := range b.N {
		b.StopTimer()
		f := startFlood(b, Config{}, "b1", "b2", "b3", "b4")
		names := make([]string, n)
		for j := range names {
			names[j] = fmt.Sprintf("bench-%d-%05d", i, j)
		}
		b.StartTimer()
		start := time.Now()
		got := createAll(context.Background(), f.admin, names, 3, workers)
		el := time.Since(start)
		b.StopTimer()
		for name, err := range got {
			if err != nil {
				b.Fatalf("create %s: %v", name, err)
			}
		}
		b.ReportMetric(float64(n)/el.Seconds(), "streams/s")
		b.ReportMetric(el.Seconds(), "s/10000-streams")
		asgs := f.stored(b)
		if len(asgs) != n {
			b.Fatalf("%d streams stored, want %d", len(asgs), n)
		}
		copies, owned := map[string]int{}, map[string]int{}
		for _, a := range asgs {
			tally(copies, owned, a, 1)
		}
		b.Logf("copies per broker %v, owned %v", copies, owned)
		b.StartTimer()
	}
}
