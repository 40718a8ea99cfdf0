package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

func TestParseInterspersed(t *testing.T) {
	for _, c := range []struct {
		args   []string
		pos    []string
		copies uint
		json   bool
	}{
		{[]string{"demo", "--copies", "3"}, []string{"demo"}, 3, false},
		{[]string{"--copies", "3", "demo"}, []string{"demo"}, 3, false},
		{[]string{"demo", "--json", "x", "--copies=2"}, []string{"demo", "x"}, 2, true},
		{[]string{"demo", "--", "--copies", "5"}, []string{"demo", "--copies", "5"}, 1, false},
		{[]string{}, nil, 1, false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		copies := fs.Uint("copies", 1, "")
		js := fs.Bool("json", false, "")
		pos, err := parseInterspersed(fs, c.args)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !slices.Equal(pos, c.pos) || *copies != c.copies || *js != c.json {
			t.Errorf("%v: pos %v copies %d json %v; want %v %d %v", c.args, pos, *copies, *js, c.pos, c.copies, c.json)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for _, c := range []struct {
		in    string
		nodes uint
		want  *strandv1.ConfirmPolicy
	}{
		{"majority_durable", 0, &strandv1.ConfirmPolicy{Name: "majority_durable"}},
		{"local_durable", 0, &strandv1.ConfirmPolicy{Name: "local_durable"}},
		{"replica_durable", 2, &strandv1.ConfirmPolicy{Name: "replica_durable", Nodes: 2}},
		{"replica_accepted:2", 0, &strandv1.ConfirmPolicy{Name: "replica_accepted", Nodes: 2}},
		{"replica_durable(3)", 3, &strandv1.ConfirmPolicy{Name: "replica_durable", Nodes: 3}},
	} {
		got, err := parsePolicy(c.in, c.nodes)
		if err != nil || got.GetName() != c.want.GetName() || got.GetNodes() != c.want.GetNodes() {
			t.Errorf("parsePolicy(%q, %d) = %v, %v; want %v", c.in, c.nodes, got, err, c.want)
		}
	}
	for _, c := range []struct {
		in    string
		nodes uint
	}{
		{"bogus", 0}, {"replica_durable", 0}, {"majority_durable", 2}, {"replica_durable:x", 0}, {"replica_durable:2", 3},
	} {
		if _, err := parsePolicy(c.in, c.nodes); err == nil {
			t.Errorf("parsePolicy(%q, %d): want an error", c.in, c.nodes)
		} else if !errors.As(err, new(usageError)) {
			t.Errorf("parsePolicy(%q, %d): %v is not a usage error", c.in, c.nodes, err)
		}
	}
}

func TestSubscribeStart(t *testing.T) {
	for _, c := range []struct {
		from, cursor string
		start        strandv1.StartPosition
		offset       uint64
	}{
		{"", "", strandv1.StartPosition_START_POSITION_EARLIEST, 0},
		{"", "c", strandv1.StartPosition_START_POSITION_CURSOR, 0},
		{"latest", "c", strandv1.StartPosition_START_POSITION_LATEST, 0},
		{"42", "", strandv1.StartPosition_START_POSITION_OFFSET, 42},
	} {
		o, err := subscribeStart(c.from, c.cursor)
		if err != nil || o.Start != c.start || o.Offset != c.offset {
			t.Errorf("subscribeStart(%q, %q) = %+v, %v", c.from, c.cursor, o, err)
		}
	}
	if _, err := subscribeStart("soon", ""); err == nil {
		t.Error("subscribeStart(soon): want an error")
	}
}

// Usage errors exit 2 before anything is dialled; a missing cluster is a
// runtime error (1).
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("STRAND_CONTROLLER", "")
	t.Setenv("STRAND_BROKER", "")
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"nosuch"}, 2, "unknown command"},
		{[]string{"stream", "create"}, 2, "missing NAME"},
		{[]string{"stream", "create", "Bad/Name"}, 2, "stream name"},
		{[]string{"stream", "create", "ok", "--copies", "9"}, 2, "--copies"},
		{[]string{"stream", "create", "ok", "--nope"}, 2, "flag provided but not defined"},
		{[]string{"accept-loss", "s"}, 2, "--why is required"},
		{[]string{"cursor", "commit", "s", "c", "x"}, 2, "not a number"},
		{[]string{"subscribe", "s", "--commit-every", "5"}, 2, "--commit-every needs --cursor"},
		{[]string{"bench", "--streams", "0"}, 2, "--streams must be 1.."},
		{[]string{"bench", "--streams", "-5"}, 2, "--streams must be 1.."},
		{[]string{"bench", "--idle-window", "-1s"}, 2, "--idle-window"},
		{[]string{"bench", "--etcd", "127.0.0.1:1"}, 2, "--etcd is for a running cluster"},
		{[]string{"stream", "get", "s"}, 1, "no cluster to talk to"},
		{[]string{"stream", "create", "-h"}, 0, ""},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append(c.args, "--data-dir", dir), strings.NewReader(""), &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errb.String(), c.code, c.msg)
		}
	}
}

func TestParseZones(t *testing.T) {
	if z, err := parseZones(""); err != nil || z != nil {
		t.Fatalf("empty: %v %v", z, err)
	}
	if z, err := parseZones("a,b,eu-1c"); err != nil || !slices.Equal(z, []string{"a", "b", "eu-1c"}) {
		t.Fatalf("a,b,eu-1c: %v %v", z, err)
	}
	for _, bad := range []string{"a,,b", "a,", "a b", "a,/x"} {
		var u usageError
		if _, err := parseZones(bad); !errors.As(err, &u) || !strings.Contains(err.Error(), "--zones") {
			t.Errorf("parseZones(%q) = %v, want a usage error naming --zones", bad, err)
		}
	}
}

// What failover prints: without --to it says the owner may well come back
// (the furthest sealed copy is promoted); with --to it names the owner the
// move committed, and says so when that is not the target.
func TestPrintFailover(t *testing.T) {
	rec := &strandv1.Recovery{FromEpoch: 3, FenceEpoch: 4, OldOwner: "b1", ProposedOwner: "b2", TransitionId: "t1"}
	for _, c := range []struct {
		name, to string
		asg      *strandv1.Assignment
		want     string
	}{
		{"no target", "", nil, "the recoverer promotes the furthest sealed copy, b2 or the owner b1 if it is as far"},
		{"handed over", "b2", &strandv1.Assignment{Epoch: 4, Owner: "b2"}, "handed s over from b1 to b2 at epoch 4"},
		{"another owner committed", "b2", &strandv1.Assignment{Epoch: 4, Owner: "b1"}, "with owner b1, not b2"},
		{"not committed yet", "b2", nil, "not committed yet"},
	} {
		var b strings.Builder
		printFailover(&b, "s", c.to, &strandv1.FailoverResponse{Recovery: rec, Assignment: c.asg})
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("%s: printed %q, want it to contain %q", c.name, b.String(), c.want)
		}
	}
}
