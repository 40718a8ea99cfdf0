package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/recoverer/internal/pick"
)

// A round that waits records one refusal per old copy whose broker is
// registered and whose seal failed, with the Connect code and bounded error
// text; copies whose broker is not registered are left to attention's
// broker_down.
func TestRefusalsOf(t *testing.T) {
	now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	earlier := now.Add(-time.Minute)
	refused := fmt.Errorf("worker: seal b3 at 127.0.0.1:9: %w",
		connect.NewError(connect.CodeFailedPrecondition, errors.New("replica: seal of another incarnation")))
	base := func() snapshot {
		return snapshot{
			stream:      stream,
			assignment:  cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}},
			recovery:    cluster.Recovery{Stream: stream, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t1", OldOwner: "b1", OldFollowers: []string{"b2", "b3"}},
			recoveryRev: 7,
			brokers:     map[string]string{"b2": "127.0.0.1:8", "b3": "127.0.0.1:9"},
		}
	}
	decide := func(s snapshot, sealed ...string) pick.Decision {
		var answers []pick.Answer
		for _, n := range sealed {
			answers = append(answers, pick.Answer{Node: n, RecordTail: 5})
		}
		return pick.Decide(s.assignment, s.history, answers)
	}
	brief := func(r *cluster.SealRefusals) string {
		if r == nil {
			return "none"
		}
		var parts []string
		for _, x := range r.Refusals {
			parts = append(parts, fmt.Sprintf("%s/%s/%s", x.Node, x.Code, x.Since.Format("15:04:05")))
		}
		return fmt.Sprintf("%s@%d r=%d sealed=%v %v", r.TransitionID, r.FenceEpoch, r.R, r.Sealed, parts)
	}
	cases := []struct {
		name   string
		snap   func() snapshot
		sealed []string
		failed map[string]error
		want   string
	}{
		{
			name:   "a live copy refuses, the owner is down",
			snap:   base,
			sealed: []string{"b2"},
			failed: map[string]error{"b1": errNotRegistered, "b3": refused},
			want:   "t1@4 r=2 sealed=[b2] [b3/failed_precondition/05:06:07]",
		},
		{
			name:   "no answer in time from a registered copy",
			snap:   base,
			sealed: []string{"b3"},
			failed: map[string]error{"b1": errNotRegistered, "b2": errNoAnswer},
			want:   "t1@4 r=2 sealed=[b3] [b2//05:06:07]",
		},
		{
			name:   "only copies that are not registered fail: nothing to record",
			snap:   base,
			sealed: []string{"b2"},
			failed: map[string]error{"b1": errNotRegistered, "b3": errNotRegistered},
			want:   "none",
		},
		{
			// The registration went away after the snapshot was read.
			name:   "a failure of a copy missing from the snapshot's brokers",
			snap:   base,
			sealed: []string{"b2", "b3"},
			failed: map[string]error{"b1": refused},
			want:   "none",
		},
		{
			name: "a refusal seen before keeps its time",
			snap: func() snapshot {
				s := base()
				s.refusalsRev = 9
				s.refusals = cluster.SealRefusals{Stream: stream, FenceEpoch: 4, TransitionID: "t1", R: 2,
					Refusals: []cluster.SealRefusal{{Node: "b3", Error: "old", Since: earlier}, {Node: "b2", Error: "gone", Since: earlier}}}
				return s
			},
			sealed: []string{"b2"},
			failed: map[string]error{"b1": errNotRegistered, "b3": refused},
			want:   "t1@4 r=2 sealed=[b2] [b3/failed_precondition/05:05:07]",
		},
		{
			name: "a refusal seen for another transition starts again",
			snap: func() snapshot {
				s := base()
				s.refusalsRev = 9
				s.refusals = cluster.SealRefusals{Stream: stream, FenceEpoch: 4, TransitionID: "t0", R: 2,
					Refusals: []cluster.SealRefusal{{Node: "b3", Error: "old", Since: earlier}}}
				return s
			},
			sealed: []string{"b2"},
			failed: map[string]error{"b1": errNotRegistered, "b3": refused},
			want:   "t1@4 r=2 sealed=[b2] [b3/failed_precondition/05:06:07]",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.snap()
			got := refusalsOf(s, decide(s, c.sealed...), c.failed, now)
			if brief(got) != c.want {
				t.Fatalf("got %s\nwant %s", brief(got), c.want)
			}
			if got != nil && got.Refusals[0].Node == "b3" && !strings.Contains(got.Refusals[0].Error, "another incarnation") {
				t.Fatalf("error text %q does not say what the copy answered", got.Refusals[0].Error)
			}
		})
	}

	s := base()
	long := fmt.Errorf("worker: seal b3: %w", connect.NewError(connect.CodeFailedPrecondition, errors.New(strings.Repeat("é", 400))))
	got := refusalsOf(s, decide(s, "b2"), map[string]error{"b3": long}, now)
	if got == nil || len(got.Refusals) != 1 {
		t.Fatalf("long refusal recorded as %s", brief(got))
	}
	if e := got.Refusals[0].Error; len(e) > cluster.MaxRefusalError || len(e) < cluster.MaxRefusalError-utf8.UTFMax || !utf8.ValidString(e) {
		t.Fatalf("long error kept as %d bytes (valid UTF-8 %v), want at most %d", len(e), utf8.ValidString(e), cluster.MaxRefusalError)
	}
}

func TestTruncate(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"}, // é is two bytes: never split
		{"éé", 3, "é"},
		{"é", 0, ""},
	} {
		if got := truncate(c.in, c.n); got != c.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// The refusals are written guarded like the commit: only while the
// recovery, the assignment and the refusals read are unchanged and the
// leader key holds, and only when they change. The commit deletes them.
func TestWriteRefusalsGuarded(t *testing.T) {
	ctx := context.Background()
	want := func(snap snapshot, errText string) *cluster.SealRefusals {
		return &cluster.SealRefusals{Stream: stream, FenceEpoch: snap.recovery.FenceEpoch, TransitionID: snap.recovery.TransitionID, R: 2,
			Sealed:   []string{"b2"},
			Refusals: []cluster.SealRefusal{{Node: "b3", Code: "failed_precondition", Error: errText, Since: time.Unix(100, 0).UTC()}}}
	}
	f := newFixture(t, true)
	session, leader := campaign(t, f.cli)
	read := func() snapshot {
		t.Helper()
		snap, err := readSnapshot(ctx, f.cli, schema, stream)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	write := func(snap snapshot, l Leader, r *cluster.SealRefusals) bool {
		t.Helper()
		ok, err := writeRefusals(ctx, f.cli, schema, snap, l, r)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	snap := read()
	if !write(snap, leader, want(snap, "refused")) {
		t.Fatal("first refusals not written")
	}
	snap = read()
	if snap.refusalsRev == 0 || snap.refusals.Refusals[0].Error != "refused" {
		t.Fatalf("stored refusals %+v at %d", snap.refusals, snap.refusalsRev)
	}
	if write(snap, leader, want(snap, "refused")) {
		t.Fatal("unchanged refusals written again")
	}
	if write(snap, leader, nil) != true || read().refusalsRev != 0 {
		t.Fatal("nil did not delete the refusals")
	}
	if write(read(), leader, nil) {
		t.Fatal("deleting absent refusals reported a write")
	}

	// A recovery rewritten since the read: nothing written.
	stale := read()
	f.put(t, schema.RecoveryKey(stream), f.recovery)
	if write(stale, leader, want(stale, "refused")) || read().refusalsRev != 0 {
		t.Fatal("refusals written for a recovery that changed since the read")
	}
	// Refusals written by someone else since the read: nothing written.
	stale = read()
	f.put(t, schema.RefusalsKey(stream), *want(stale, "other"))
	if write(stale, leader, want(stale, "refused")) || read().refusals.Refusals[0].Error != "other" {
		t.Fatal("refusals overwrote a write made since the read")
	}

	// The commit deletes them with the recovery.
	snap = read()
	next, starts := f.promotion()
	if ok, _, err := commit(ctx, f.cli, schema, snap, leader, next, starts); !ok || err != nil {
		t.Fatalf("commit: %v %v", ok, err)
	}
	if after := read(); after.refusalsRev != 0 || after.hasRecovery() {
		t.Fatalf("refusals left after the commit: %+v", after.refusals)
	}

	// A deposed leader writes nothing.
	f.put(t, schema.RecoveryKey(stream), f.recovery)
	snap = read()
	if err := session.Close(); err != nil {
		t.Fatal(err)
	}
	if write(snap, leader, want(snap, "refused")) || read().refusalsRev != 0 {
		t.Fatal("a deposed leader recorded refusals")
	}
}
