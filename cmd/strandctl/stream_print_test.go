package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// stream get prints a copy whose lag is unknown as "?", never 0, and a
// missing copy the assignment lacks, with since when.
func TestPrintStreamUnknownLagAndMissing(t *testing.T) {
	since := timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	var out bytes.Buffer
	printStream(&env{stdout: &out}, &strandv1.GetStreamResponse{
		Spec:       &strandv1.StreamSpec{Name: "s", Copies: 3},
		Assignment: &strandv1.Assignment{Stream: "s", Epoch: 2, Owner: "b2", Followers: []string{"b3"}},
		Copies: []*strandv1.CopyStatus{
			{Node: "b2", Role: "owner", Live: true, Epoch: 2, RecordTail: 9, Lag: proto.Uint64(0), InSync: true, State: "in_sync"},
			{Node: "b3", Role: "follower", Epoch: 1, State: "down", Since: since},
			{Node: "b1", Role: "owner", State: "missing", Since: since},
		},
		Attention: []*strandv1.AttentionEntry{{Stream: "s", Kind: "under_replicated", Missing: []string{"b3", "b1"}, Since: since,
			Reason: "1 of 3 copies live and in sync", Action: "nothing: every live broker holds a copy already"}},
	})
	lines := strings.Split(out.String(), "\n")
	var rows []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == "b1" || f[0] == "b2" || f[0] == "b3" || f[0] == "under_replicated") {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	want := []string{
		"b2 owner yes 2 9 0 0 - 0 yes in_sync -",
		"b3 follower no 1 0 0 0 - ? no down 2026-01-02T03:04:05Z",
		"b1 owner no 0 0 0 0 - ? no missing 2026-01-02T03:04:05Z",
		"under_replicated - b3,b1 - 2026-01-02T03:04:05Z 1 of 3 copies live and in sync nothing: every live broker holds a copy already",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stream get printed\n%s\nwant rows\n%s", out.String(), strings.Join(want, "\n"))
	}
}
