package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/rpcerr"
)

// loss is how a fakeAdmin fails an attempt.
type loss int

const (
	// lostAfterApplying applies the request, then answers Unavailable:
	// the answer was lost.
	lostAfterApplying loss = iota
	// timedOutAfterApplying applies the request, then holds the answer
	// until the client's attempt times out.
	timedOutAfterApplying
	// redirectedToLeader answers as a controller that does not lead
	// (docs/api.md, "Controller leadership"), applying nothing.
	redirectedToLeader
)

// fakeAdmin is an AdminService over real loopback HTTP that keeps streams
// as the controller does (services/controller/internal/admin: CreateStream
// answers AlreadyExists for a name it holds and gives the stream a new
// incarnation, DeleteStream NotFound for one it does not and
// FailedPrecondition for another incarnation than the request's, GetStream
// reports the spec with the defaults filled in and the incarnation) and
// fails the first lose CreateStream and DeleteStream attempts as how says.
// It records what it answered each create and delete it applied.
type fakeAdmin struct {
	strandv1connect.UnimplementedAdminServiceHandler
	how    loss
	leader string // named by redirectedToLeader
	lose   atomic.Int32
	// meanwhile, when set, runs with mu held after an attempt whose answer
	// is lost has been applied: what others do before the client retries.
	meanwhile func()

	mu           sync.Mutex
	specs        map[string]*strandv1.StreamSpec
	incarnations map[string]string
	born         int      // incarnations given so far
	answered     []string // "ok" or the code, per create or delete applied
	gets         int
}

func startAdmin(t *testing.T, f *fakeAdmin) string {
	t.Helper()
	f.specs = make(map[string]*strandv1.StreamSpec)
	f.incarnations = make(map[string]string)
	return serveAdmin(t, f)
}

// store keeps spec as a new life of its name; f.mu must be held.
func (f *fakeAdmin) store(spec *strandv1.StreamSpec) {
	f.born++
	f.specs[spec.GetName()] = spec
	f.incarnations[spec.GetName()] = fmt.Sprintf("inc-%d", f.born)
}

// assignment is the assignment of the stream called name; f.mu must be held.
func (f *fakeAdmin) assignment(name string) *strandv1.Assignment {
	spec := f.specs[name]
	return &strandv1.Assignment{Stream: name, Epoch: 1, Owner: "b1", Policy: spec.GetPolicy(), Incarnation: f.incarnations[name]}
}

func (f *fakeAdmin) CreateStream(ctx context.Context, req *connect.Request[strandv1.CreateStreamRequest]) (*connect.Response[strandv1.CreateStreamResponse], error) {
	return lossy(ctx, f, func() (*strandv1.CreateStreamResponse, error) {
		m := req.Msg
		if _, ok := f.specs[m.GetName()]; ok {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("stream %q already exists", m.GetName()))
		}
		spec := &strandv1.StreamSpec{Name: m.GetName(), Copies: max(1, m.GetCopies()), Policy: m.GetPolicy(), Retention: m.GetRetention()}
		if spec.Policy.GetName() == "" {
			spec.Policy = &strandv1.ConfirmPolicy{Name: "majority_durable"}
		}
		if spec.Retention == nil {
			spec.Retention = &strandv1.Retention{}
		}
		f.store(spec)
		return &strandv1.CreateStreamResponse{Spec: spec, Assignment: f.assignment(m.GetName())}, nil
	})
}

func (f *fakeAdmin) DeleteStream(ctx context.Context, req *connect.Request[strandv1.DeleteStreamRequest]) (*connect.Response[strandv1.DeleteStreamResponse], error) {
	return lossy(ctx, f, func() (*strandv1.DeleteStreamResponse, error) {
		name := req.Msg.GetName()
		if _, ok := f.specs[name]; !ok {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no such stream: %q", name))
		}
		if want := req.Msg.GetIncarnation(); want != "" && f.incarnations[name] != want {
			return nil, rpcerr.FieldPrecondition("incarnation", rpcerr.PreconditionIncarnation, "stream %q is incarnation %q, not %q", name, f.incarnations[name], want)
		}
		delete(f.specs, name)
		delete(f.incarnations, name)
		return &strandv1.DeleteStreamResponse{}, nil
	})
}

func (f *fakeAdmin) GetStream(_ context.Context, req *connect.Request[strandv1.GetStreamRequest]) (*connect.Response[strandv1.GetStreamResponse], error) {
	if f.how == redirectedToLeader && f.lose.Add(-1) >= 0 {
		// A controller that does not lead refuses every call.
		return nil, rpcerr.NotLeader(f.leader)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	spec, ok := f.specs[req.Msg.GetName()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no such stream: %q", req.Msg.GetName()))
	}
	return connect.NewResponse(&strandv1.GetStreamResponse{Spec: spec, Assignment: f.assignment(req.Msg.GetName())}), nil
}

// lossy applies a create or delete unless this attempt is redirected, and
// loses its answer if this attempt is one to lose.
func lossy[Res any](ctx context.Context, f *fakeAdmin, apply func() (*Res, error)) (*connect.Response[Res], error) {
	lost := f.lose.Add(-1) >= 0
	if lost && f.how == redirectedToLeader {
		return nil, rpcerr.NotLeader(f.leader)
	}
	f.mu.Lock()
	res, err := apply()
	answer := "ok"
	if err != nil {
		answer = connect.CodeOf(err).String()
	}
	f.answered = append(f.answered, answer)
	if lost && f.meanwhile != nil {
		f.meanwhile()
	}
	f.mu.Unlock()
	switch {
	case !lost && err != nil:
		return nil, err
	case !lost:
		return connect.NewResponse(res), nil
	case f.how == timedOutAfterApplying:
		<-ctx.Done()
		return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return nil, connect.NewError(connect.CodeUnavailable, errors.New("fake: answer lost"))
}

// answers is what f answered the creates and deletes it applied, and how
// many GetStream calls it served.
func (f *fakeAdmin) answers() (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.answered), f.gets
}

// put stores a stream as if someone else had created it.
func (f *fakeAdmin) put(req *strandv1.CreateStreamRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.putLocked(req)
}

// putLocked is put with f.mu held.
func (f *fakeAdmin) putLocked(req *strandv1.CreateStreamRequest) {
	f.store(&strandv1.StreamSpec{Name: req.GetName(), Copies: req.GetCopies(), Policy: req.GetPolicy(), Retention: req.GetRetention()})
}

// incarnation is the incarnation of the stream called name, "" when there
// is none.
func (f *fakeAdmin) incarnation(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.incarnations[name]
}

// adminVia is the Admin of a client whose controller is at addr.
func adminVia(t *testing.T, addr string) strandv1connect.AdminServiceClient {
	t.Helper()
	return newTestClient(t, Config{Controller: addr, AttemptTimeout: 200 * time.Millisecond}).Admin()
}

// createRequest sets every field to a value other than its default, so
// that a comparison that skipped one would be seen.
func createRequest(name string) *strandv1.CreateStreamRequest {
	return &strandv1.CreateStreamRequest{
		Name: name, Copies: 3,
		Policy:    &strandv1.ConfirmPolicy{Name: "replica_durable", Nodes: 2},
		Retention: &strandv1.Retention{MaxRecords: 1000, MaxBytes: 1 << 20, MaxAge: durationpb.New(time.Hour)},
	}
}

// A CreateStream whose first attempt created the stream but lost its
// answer is a success: the retry, answered AlreadyExists, finds the stream
// the call asked for. The caller was told AlreadyExists before the mend.
func TestCreateStreamSucceedsWhenItsAnswerWasLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		how  loss
		req  *strandv1.CreateStreamRequest
	}{
		{"unavailable after applying", lostAfterApplying, createRequest("s")},
		{"attempt timed out after applying", timedOutAfterApplying, createRequest("s")},
		// Defaults the controller fills in match fields left unset.
		{"defaults", lostAfterApplying, &strandv1.CreateStreamRequest{Name: "s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAdmin{how: tc.how}
			f.lose.Store(1)
			res, err := adminVia(t, startAdmin(t, f)).CreateStream(context.Background(), connect.NewRequest(tc.req))
			if err != nil {
				t.Fatalf("create whose first answer was lost: %v, want success", err)
			}
			// The scenario happened: the first attempt created the
			// stream and the retry was answered AlreadyExists.
			if got, _ := f.answers(); got != "[ok already_exists]" {
				t.Fatalf("controller answered %s, want [ok already_exists]", got)
			}
			f.mu.Lock()
			spec, asg := f.specs["s"], f.assignment("s")
			f.mu.Unlock()
			if !proto.Equal(res.Msg.GetSpec(), spec) || !proto.Equal(res.Msg.GetAssignment(), asg) {
				t.Fatalf("response %v, want the stream's spec %v and assignment", res.Msg, spec)
			}
		})
	}
}

// AlreadyExists stays AlreadyExists when the stream that exists is not the
// one asked for, or when no attempt of the call can have created it.
func TestCreateStreamKeepsAlreadyExists(t *testing.T) {
	for _, tc := range []struct {
		name   string
		how    loss
		lose   int32
		change func(*strandv1.CreateStreamRequest) // the stream someone else created
		field  string                              // named in the error; "" when not compared
	}{
		// The first attempt may have been applied, but the stream that
		// exists differs from the request in one field.
		{"other copies", lostAfterApplying, 1, func(r *strandv1.CreateStreamRequest) { r.Copies = 1 }, "copies"},
		{"other policy", lostAfterApplying, 1, func(r *strandv1.CreateStreamRequest) { r.Policy.Nodes = 3 }, "policy"},
		{"other max_records", lostAfterApplying, 1, func(r *strandv1.CreateStreamRequest) { r.Retention.MaxRecords = 5 }, "retention.max_records"},
		{"other max_bytes", timedOutAfterApplying, 1, func(r *strandv1.CreateStreamRequest) { r.Retention.MaxBytes = 5 }, "retention.max_bytes"},
		{"other max_age", lostAfterApplying, 1, func(r *strandv1.CreateStreamRequest) { r.Retention.MaxAge = nil }, "retention.max_age"},
		// The first attempt was answered AlreadyExists.
		{"first attempt", lostAfterApplying, 0, func(*strandv1.CreateStreamRequest) {}, ""},
		// The first attempt went to a controller that does not lead,
		// which applies nothing: the stream that exists, though it is
		// just what was asked for, is someone else's.
		{"redirected by a follower", redirectedToLeader, 1, func(*strandv1.CreateStreamRequest) {}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leader := &fakeAdmin{how: tc.how}
			leader.lose.Store(tc.lose)
			addr := startAdmin(t, leader)
			if tc.how == redirectedToLeader {
				// The client is pointed at a follower that names the
				// leader; the leader loses nothing.
				leader.lose.Store(0)
				follower := &fakeAdmin{how: redirectedToLeader, leader: addr}
				follower.lose.Store(1 << 20)
				addr = startAdmin(t, follower)
			}
			existing := createRequest("s")
			tc.change(existing)
			leader.put(existing)
			_, err := adminVia(t, addr).CreateStream(context.Background(), connect.NewRequest(createRequest("s")))
			if connect.CodeOf(err) != connect.CodeAlreadyExists {
				t.Fatalf("create of a stream that exists: %v, want AlreadyExists", err)
			}
			// Every attempt that reached the leader found the stream.
			answered, gets := leader.answers()
			want := "[already_exists]"
			if tc.lose > 0 && tc.how != redirectedToLeader {
				want = "[already_exists already_exists]"
			}
			if answered != want {
				t.Fatalf("controller answered %s, want %s", answered, want)
			}
			if tc.field == "" {
				if gets != 0 {
					t.Fatalf("%d GetStream calls after an AlreadyExists no attempt of the call can have caused, want 0", gets)
				}
				return
			}
			if !strings.Contains(err.Error(), "has a "+tc.field+" other") {
				t.Fatalf("create of a stream that exists: %q, want the field that differs named: %q", err, tc.field)
			}
		})
	}
}

// A DeleteStream whose first attempt deleted the stream but lost its
// answer is a success; a NotFound no attempt of the call can have caused
// stays NotFound.
func TestDeleteStreamSucceedsWhenItsAnswerWasLost(t *testing.T) {
	for _, how := range []loss{lostAfterApplying, timedOutAfterApplying} {
		f := &fakeAdmin{how: how}
		f.lose.Store(1)
		admin := adminVia(t, startAdmin(t, f))
		f.put(createRequest("s"))
		if _, err := admin.DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s"})); err != nil {
			t.Fatalf("loss %d: delete whose first answer was lost: %v, want success", how, err)
		}
		if got, _ := f.answers(); got != "[ok not_found]" {
			t.Fatalf("loss %d: controller answered %s, want [ok not_found]", how, got)
		}
		_, err := admin.DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s"}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("loss %d: delete of a stream that is not there: %v, want NotFound", how, err)
		}
	}
	leader := &fakeAdmin{}
	follower := &fakeAdmin{how: redirectedToLeader, leader: startAdmin(t, leader)}
	follower.lose.Store(1 << 20)
	_, err := adminVia(t, startAdmin(t, follower)).DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("delete of a stream that never was, after a leader redirect: %v, want NotFound", err)
	}
	// The look-up above answers NotFound before any delete is sent; with an
	// incarnation there is no look-up, and the redirected delete itself
	// must not count as an attempt that may have applied.
	leader = &fakeAdmin{}
	follower = &fakeAdmin{how: redirectedToLeader, leader: startAdmin(t, leader)}
	follower.lose.Store(1 << 20)
	_, err = adminVia(t, startAdmin(t, follower)).DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s", Incarnation: "x"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("delete of an incarnation that never was, after a leader redirect: %v, want NotFound", err)
	}
	if got, gets := leader.answers(); got != "[not_found]" || gets != 0 {
		t.Fatalf("the leader answered %s after %d look-ups, want [not_found] to the delete alone", got, gets)
	}
}

// A DeleteStream whose first attempt deleted the stream and lost its answer
// must not delete, on its retry, a stream created under the same name
// meanwhile: the retry names the incarnation the call found, is answered
// FailedPrecondition, and the call succeeds, the new stream left alone.
func TestRetriedDeleteStreamLeavesARecreatedStreamAlone(t *testing.T) {
	for _, how := range []loss{lostAfterApplying, timedOutAfterApplying} {
		f := &fakeAdmin{how: how}
		f.lose.Store(1)
		f.meanwhile = func() { f.putLocked(createRequest("s")) }
		admin := adminVia(t, startAdmin(t, f))
		f.put(createRequest("s"))
		first := f.incarnation("s")
		if _, err := admin.DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s"})); err != nil {
			t.Fatalf("loss %d: delete whose first answer was lost and whose stream was created again: %v, want success", how, err)
		}
		if got, _ := f.answers(); got != "[ok failed_precondition]" {
			t.Fatalf("loss %d: controller answered %s, want [ok failed_precondition]", how, got)
		}
		if now := f.incarnation("s"); now == "" || now == first {
			t.Fatalf("loss %d: stream s is incarnation %q after the delete, want the one created meanwhile (not %q)", how, now, first)
		}
	}
}

// A DeleteStream that names an incarnation is sent as it is, without a
// look-up, and one of an incarnation the stream does not have, answered to
// the first attempt, is FailedPrecondition: the stream is not deleted.
func TestDeleteStreamOfAnIncarnation(t *testing.T) {
	f := &fakeAdmin{}
	admin := adminVia(t, startAdmin(t, f))
	f.put(createRequest("s"))
	_, err := admin.DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s", Incarnation: "other"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("delete of another incarnation: %v, want FailedPrecondition", err)
	}
	inc := f.incarnation("s")
	if inc == "" {
		t.Fatal("delete of another incarnation deleted the stream")
	}
	if _, err := admin.DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "s", Incarnation: inc})); err != nil {
		t.Fatalf("delete of the stream's incarnation: %v", err)
	}
	if answered, gets := f.answers(); answered != "[failed_precondition ok]" || gets != 0 {
		t.Fatalf("controller answered %s after %d GetStream calls, want [failed_precondition ok] after none", answered, gets)
	}
}

// createMismatch compares only the fields a request sets, reading them as
// the controller does.
func TestCreateMismatch(t *testing.T) {
	spec := &strandv1.StreamSpec{
		Name: "s", Copies: 3,
		Policy:    &strandv1.ConfirmPolicy{Name: "replica_durable", Nodes: 2},
		Retention: &strandv1.Retention{MaxRecords: 1000, MaxBytes: 1 << 20, MaxAge: durationpb.New(time.Hour)},
	}
	for _, tc := range []struct {
		name   string
		change func(*strandv1.CreateStreamRequest)
		spec   *strandv1.StreamSpec
		want   string
	}{
		{"same", func(*strandv1.CreateStreamRequest) {}, spec, ""},
		{"policy unset takes the controller's default", func(r *strandv1.CreateStreamRequest) { r.Policy = nil }, spec, ""},
		{"policy empty takes the controller's default", func(r *strandv1.CreateStreamRequest) { r.Policy = &strandv1.ConfirmPolicy{} }, spec, ""},
		{"copies", func(r *strandv1.CreateStreamRequest) { r.Copies = 2 }, spec, "copies"},
		{"copies unset mean 1", func(r *strandv1.CreateStreamRequest) { r.Copies = 0 }, spec, "copies"},
		{"policy name", func(r *strandv1.CreateStreamRequest) { r.Policy.Name = "replica_accepted" }, spec, "policy"},
		{"policy nodes", func(r *strandv1.CreateStreamRequest) { r.Policy.Nodes = 1 }, spec, "policy"},
		{"retention unset is unbounded", func(r *strandv1.CreateStreamRequest) { r.Retention = nil }, spec, "retention.max_records"},
		{"max_records", func(r *strandv1.CreateStreamRequest) { r.Retention.MaxRecords = 11 }, spec, "retention.max_records"},
		{"max_bytes", func(r *strandv1.CreateStreamRequest) { r.Retention.MaxBytes = 21 }, spec, "retention.max_bytes"},
		{"max_age", func(r *strandv1.CreateStreamRequest) { r.Retention.MaxAge = durationpb.New(time.Minute) }, spec, "retention.max_age"},
		{"max_age unset is none", func(r *strandv1.CreateStreamRequest) { r.Retention.MaxAge = nil }, spec, "retention.max_age"},
		{"no spec", func(*strandv1.CreateStreamRequest) {}, nil, "spec"},
		{"defaults", func(r *strandv1.CreateStreamRequest) { r.Copies, r.Policy, r.Retention = 0, nil, nil },
			&strandv1.StreamSpec{Copies: 1, Policy: &strandv1.ConfirmPolicy{Name: "majority_durable"}, Retention: &strandv1.Retention{}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := createRequest("s")
			tc.change(req)
			if got := createMismatch(req, tc.spec); got != tc.want {
				t.Fatalf("createMismatch = %q, want %q", got, tc.want)
			}
		})
	}
}

// Only an answer that proves the controller did not apply an attempt says
// it was not applied.
func TestMayHaveApplied(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"leader redirect", rpcerr.NotLeader("127.0.0.1:1"), false},
		// The message alone is no hint: it may have come from anything.
		{"leader named in the message only", connect.NewError(connect.CodeUnavailable, errors.New("not the controller leader; leader is at 127.0.0.1:1")), true},
		{"connection refused", connect.NewError(connect.CodeUnavailable, fmt.Errorf("dial: %w", syscall.ECONNREFUSED)), false},
		{"conflict", connect.NewError(connect.CodeAborted, errors.New("conflict")), false},
		{"unavailable", connect.NewError(connect.CodeUnavailable, errors.New("coordination store unavailable")), true},
		{"no leader elected", rpcerr.NotLeader(""), true},
		{"attempt timeout", connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), true},
		{"canceled", connect.NewError(connect.CodeCanceled, context.Canceled), true},
		{"cut mid-response", connect.NewError(connect.CodeUnknown, io.ErrUnexpectedEOF), true},
	} {
		if got := mayHaveApplied(tc.err); got != tc.want {
			t.Errorf("%s: mayHaveApplied = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A delete's FailedPrecondition counts as the stream gone only with the
// controller's typed incarnation violation: the message alone, or a
// violation of another kind, leaves the stream there.
func TestGoneReadsTheTypedIncarnationViolation(t *testing.T) {
	req := &strandv1.DeleteStreamRequest{Name: "s", Incarnation: "inc-1"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"not found", connect.NewError(connect.CodeNotFound, errors.New("no such stream")), true},
		{"incarnation violation", rpcerr.FieldPrecondition("incarnation", rpcerr.PreconditionIncarnation, "stream %q is incarnation %q", "s", "inc-2"), true},
		{"incarnation in the message only", connect.NewError(connect.CodeFailedPrecondition, errors.New(`incarnation: stream "s" is incarnation "inc-2"`)), false},
		{"placement violation", rpcerr.FieldPrecondition("copies", rpcerr.PreconditionPlacement, "3 copies need 3 live brokers"), false},
		{"pending recovery", connect.NewError(connect.CodeFailedPrecondition, errors.New("transition: a recovery is already pending")), false},
	} {
		if got := gone(tc.err, req); got != tc.want {
			t.Errorf("%s: gone = %v, want %v", tc.name, got, tc.want)
		}
	}
	if gone(rpcerr.FieldPrecondition("incarnation", rpcerr.PreconditionIncarnation, "x"), &strandv1.DeleteStreamRequest{Name: "s"}) {
		t.Error("gone for a request without an incarnation, want false")
	}
}
