package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
)

// policyFlags are --policy and --nodes.
type policyFlags struct {
	policy string
	nodes  uint
}

func (p *policyFlags) register(fs *flag.FlagSet, def string) {
	fs.StringVar(&p.policy, "policy", def, "confirm policy: local_durable, majority_durable, replica_durable or replica_accepted (also NAME:N)")
	fs.UintVar(&p.nodes, "nodes", 0, "copy count for replica_durable and replica_accepted")
}

// parse returns the policy, nil when none was given.
func (p *policyFlags) parse() (*strandv1.ConfirmPolicy, error) {
	if p.policy == "" {
		if p.nodes != 0 {
			return nil, usagef("--nodes needs --policy replica_durable or replica_accepted")
		}
		return nil, nil
	}
	return parsePolicy(p.policy, p.nodes)
}

// parsePolicy reads --policy by the one rule for a policy string
// (cluster.ParsePolicy), with the count from --nodes when --policy gives
// none; when both give one they must agree.
func parsePolicy(s string, nodes uint) (*strandv1.ConfirmPolicy, error) {
	spec := s
	if nodes != 0 && !strings.ContainsAny(s, ":(") {
		spec = fmt.Sprintf("%s:%d", s, nodes)
	}
	p, err := cluster.ParsePolicy(spec)
	if err != nil {
		return nil, usagef("--policy: %v", err)
	}
	if nodes != 0 && uint(p.Nodes) != nodes {
		return nil, usagef("--policy %q and --nodes %d disagree", s, nodes)
	}
	return &strandv1.ConfirmPolicy{Name: p.Name, Nodes: uint32(p.Nodes)}, nil
}

func policyString(p *strandv1.ConfirmPolicy) string {
	if p == nil {
		return "-"
	}
	return cluster.Policy{Name: p.GetName(), Nodes: int(p.GetNodes())}.String()
}

// listPageSize is how many streams stream list asks for per call.
const listPageSize = 500

// streamRows adds a row per stream to t.
func streamRows(t *table, streams []*strandv1.GetStreamResponse) {
	for _, s := range streams {
		a := s.GetAssignment()
		tail := uint64(0)
		for _, cp := range s.GetCopies() {
			if cp.GetNode() == a.GetOwner() {
				tail = cp.GetRecordTail()
			}
		}
		rec := "-"
		if r := s.GetPendingRecovery(); r != nil {
			rec = fmt.Sprintf("fence %d", r.GetFenceEpoch())
		}
		t.row(s.GetSpec().GetName(), s.GetSpec().GetCopies(), policyString(a.GetPolicy()), a.GetEpoch(),
			dash(a.GetOwner()), dash(strings.Join(a.GetFollowers(), ",")), tail, rec, len(s.GetAttention()))
	}
}

func streamCommands() []*command {
	var (
		copies    uint
		pol       policyFlags
		retRecs   uint64
		retBytes  uint64
		retAge    time.Duration
		updCopies uint
		updPol    policyFlags
		listLimit uint
	)
	return []*command{
		{
			name: "stream create", args: "NAME", summary: "create a stream",
			flags: func(fs *flag.FlagSet) {
				fs.UintVar(&copies, "copies", 1, "number of copies E (1..7)")
				pol.register(fs, "")
				fs.Uint64Var(&retRecs, "retention-records", 0, "keep at most this many records (0: unbounded)")
				fs.Uint64Var(&retBytes, "retention-bytes", 0, "keep at most this many bytes (0: unbounded)")
				fs.DurationVar(&retAge, "retention-age", 0, "drop records older than this (0: unbounded)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				if err := cluster.ValidateStreamName(args[0]); err != nil {
					return usagef("%v", err)
				}
				if copies < 1 || copies > 7 {
					return usagef("--copies must be 1..7, got %d", copies)
				}
				policy, err := pol.parse()
				if err != nil {
					return err
				}
				req := &strandv1.CreateStreamRequest{Name: args[0], Copies: uint32(copies), Policy: policy}
				if retRecs != 0 || retBytes != 0 || retAge != 0 {
					req.Retention = &strandv1.Retention{MaxRecords: retRecs, MaxBytes: retBytes}
					if retAge != 0 {
						req.Retention.MaxAge = durationpb.New(retAge)
					}
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.CreateStream, req)
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				a := res.GetAssignment()
				fmt.Fprintf(e.stdout, "created stream %s: copies %d, policy %s, epoch %d, owner %s, followers %s\n",
					res.GetSpec().GetName(), res.GetSpec().GetCopies(), policyString(a.GetPolicy()),
					a.GetEpoch(), dash(a.GetOwner()), dash(strings.Join(a.GetFollowers(), ",")))
				return nil
			},
		},
		{
			name: "stream delete", args: "NAME", summary: "delete a stream and its data",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.DeleteStream, &strandv1.DeleteStreamRequest{Name: args[0]})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				fmt.Fprintf(e.stdout, "deleted stream %s\n", args[0])
				return nil
			},
		},
		{
			name: "stream get", args: "NAME", summary: "show a stream: assignment, copies, pending recovery, history starts, attention",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.GetStream, &strandv1.GetStreamRequest{Name: args[0]})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				printStream(e, res)
				return nil
			},
		},
		{
			name: "stream list", summary: "list streams, ordered by name",
			flags: func(fs *flag.FlagSet) {
				fs.UintVar(&listLimit, "limit", 0, "list at most this many streams (0: all)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 0, "no arguments"); err != nil {
					return err
				}
				t := newTable(e.stdout, "NAME", "COPIES", "POLICY", "EPOCH", "OWNER", "FOLLOWERS", "RECORD_TAIL", "RECOVERY", "ATTENTION")
				// The controller answers a page at a time; each page is
				// its own call, so a long listing is not one call's
				// deadline.
				req := &strandv1.ListStreamsRequest{}
				for listed := uint(0); ; {
					req.PageSize = listPageSize
					if left := listLimit - listed; listLimit != 0 && left < listPageSize {
						req.PageSize = int32(left)
					}
					res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListStreams, req)
					if err != nil {
						return err
					}
					listed += uint(len(res.GetStreams()))
					if e.g.json {
						if err := printEach(e.stdout, res.GetStreams()); err != nil {
							return err
						}
					} else {
						streamRows(t, res.GetStreams())
					}
					if res.GetNextPageToken() == "" || (listLimit != 0 && listed >= listLimit) {
						break
					}
					req.PageToken = res.GetNextPageToken()
				}
				if !e.g.json {
					t.flush()
				}
				return nil
			},
		},
		{
			name: "stream update", args: "NAME", summary: "change a stream's copies or confirm policy",
			flags: func(fs *flag.FlagSet) {
				fs.UintVar(&updCopies, "copies", 0, "new number of copies (0: unchanged)")
				updPol.register(fs, "")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				if updCopies > 7 {
					return usagef("--copies must be 1..7, got %d", updCopies)
				}
				policy, err := updPol.parse()
				if err != nil {
					return err
				}
				if updCopies == 0 && policy == nil {
					return usagef("nothing to update: give --copies or --policy")
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.UpdateStream, &strandv1.UpdateStreamRequest{Name: args[0], Copies: uint32(updCopies), Policy: policy})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				a := res.GetAssignment()
				how := "through recovery"
				if res.GetFastPath() {
					how = "fast path"
				}
				fmt.Fprintf(e.stdout, "updated stream %s (%s): epoch %d, owner %s, followers %s, policy %s\n",
					args[0], how, a.GetEpoch(), dash(a.GetOwner()), dash(strings.Join(a.GetFollowers(), ",")), policyString(a.GetPolicy()))
				return nil
			},
		},
	}
}

func printStream(e *env, s *strandv1.GetStreamResponse) {
	w := e.stdout
	spec, a := s.GetSpec(), s.GetAssignment()
	fmt.Fprintf(w, "stream     %s\n", spec.GetName())
	fmt.Fprintf(w, "copies     %d   policy %s\n", spec.GetCopies(), policyString(spec.GetPolicy()))
	if r := spec.GetRetention(); r != nil && (r.GetMaxRecords() != 0 || r.GetMaxBytes() != 0 || r.GetMaxAge() != nil) {
		fmt.Fprintf(w, "retention  records %s  bytes %s  age %v\n", orDash(r.GetMaxRecords()), orDash(r.GetMaxBytes()), r.GetMaxAge().AsDuration())
	}
	fmt.Fprintf(w, "assignment epoch %d   owner %s   followers %s   policy %s\n",
		a.GetEpoch(), dash(a.GetOwner()), dash(strings.Join(a.GetFollowers(), ",")), policyString(a.GetPolicy()))
	if len(s.GetCopies()) > 0 {
		fmt.Fprintln(w)
		t := newTable(w, "COPY", "ROLE", "LIVE", "EPOCH", "RECORD_TAIL", "CURSOR_EVENT_TAIL", "CONFIRM_WATERMARK", "SEAL", "LAG", "IN_SYNC", "STATE", "SINCE")
		for _, c := range s.GetCopies() {
			// A copy whose lag cannot be measured (its broker is down, or
			// it is not placed) shows "?", never 0.
			lag := "?"
			if c.Lag != nil {
				lag = strconv.FormatUint(c.GetLag(), 10)
			}
			t.row(dash(c.GetNode()), dash(c.GetRole()), yesNo(c.GetLive()), c.GetEpoch(), c.GetRecordTail(), c.GetCursorEventTail(),
				c.GetConfirmWatermark(), orDash(c.GetSealEpoch()), lag, yesNo(c.GetInSync()), dash(c.GetState()), sinceString(c.GetSince()))
		}
		t.flush()
	}
	if r := s.GetPendingRecovery(); r != nil {
		fmt.Fprintf(w, "\npending recovery  from epoch %d, fence %d, transition %s\n", r.GetFromEpoch(), r.GetFenceEpoch(), r.GetTransitionId())
		fmt.Fprintf(w, "  old owner %s, old followers %s, proposed owner %s, added %s\n",
			dash(r.GetOldOwner()), dash(strings.Join(r.GetOldFollowers(), ",")), dash(r.GetProposedOwner()), dash(strings.Join(r.GetAddedMembers(), ",")))
		fmt.Fprintf(w, "  reason: %s\n", dash(r.GetReason()))
	}
	if len(s.GetHistory()) > 0 {
		fmt.Fprintln(w, "\nhistory starts")
		t := newTable(w, "  EPOCH", "RECORD_TAIL", "CURSOR_EVENT_TAIL", "NODE")
		for _, h := range s.GetHistory() {
			t.row(fmt.Sprintf("  %d", h.GetEpoch()), h.GetRecordTail(), h.GetCursorEventTail(), dash(h.GetNode()))
		}
		t.flush()
	}
	if len(s.GetAttention()) > 0 {
		fmt.Fprintln(w, "\nattention")
		printAttention(w, s.GetAttention(), false)
	}
}
