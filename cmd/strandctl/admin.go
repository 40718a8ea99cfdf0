package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
)

// who names the operator in AcceptOwnerLoss, WithdrawRecovery and Failover.
func who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	if host == "" {
		return "strandctl:" + name
	}
	return "strandctl:" + name + "@" + host
}

func adminCommands() []*command {
	var (
		node       string
		why        string
		failoverWy string
	)
	return []*command{
		{
			name: "brokers", summary: "list brokers and whether they are live",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 0, "no arguments"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListBrokers, &strandv1.ListBrokersRequest{})
				if err != nil {
					return err
				}
				if e.g.json {
					return printEach(e.stdout, res.GetBrokers())
				}
				t := newTable(e.stdout, "NODE", "ADDRESS", "ZONE", "LIVE", "STARTED")
				for _, b := range res.GetBrokers() {
					started := "-"
					if b.GetStartTime() != nil {
						started = b.GetStartTime().AsTime().Local().Format(time.DateTime)
					}
					t.row(b.GetNode(), dash(b.GetAddress()), dash(b.GetZone()), yesNo(b.GetLive()), started)
				}
				t.flush()
				return nil
			},
		},
		{
			name: "attention", summary: "list what needs an operator's attention",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 0, "no arguments"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListAttention, &strandv1.ListAttentionRequest{})
				if err != nil {
					return err
				}
				if e.g.json {
					return printEach(e.stdout, res.GetEntries())
				}
				if len(res.GetEntries()) == 0 {
					fmt.Fprintln(e.stdout, "nothing needs attention")
					return nil
				}
				printAttention(e.stdout, res.GetEntries(), true)
				return nil
			},
		},
		{
			name: "accept-loss", args: "NAME", summary: "move a stream to a live copy without sealing, accepting what the lost owner held",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&node, "node", "", "copy to promote (default: the best live copy)")
				fs.StringVar(&why, "why", "", "reason, recorded with who ran it (required)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				if strings.TrimSpace(why) == "" {
					return usagef("--why is required: say why the loss is accepted")
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.AcceptOwnerLoss, &strandv1.AcceptOwnerLossRequest{Stream: args[0], Node: node, Who: who(), Why: why})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				a := res.GetAssignment()
				fmt.Fprintf(e.stdout, "stream %s now at epoch %d, owner %s, followers %s\n", args[0], a.GetEpoch(), dash(a.GetOwner()), dash(strings.Join(a.GetFollowers(), ",")))
				if s := res.GetStart(); s != nil {
					fmt.Fprintf(e.stdout, "history start: epoch %d at record tail %d, cursor event tail %d (%s)\n", s.GetEpoch(), s.GetRecordTail(), s.GetCursorEventTail(), s.GetNode())
				} else {
					fmt.Fprintln(e.stdout, "no history start recorded: the new owner had published no tails")
				}
				return nil
			},
		},
		{
			name: "withdraw-recovery", args: "NAME", summary: "remove a stream's pending recovery (the controller records a new one)",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&why, "why", "", "reason, recorded with who ran it (required)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				if strings.TrimSpace(why) == "" {
					return usagef("--why is required: say why the recovery is withdrawn")
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.WithdrawRecovery, &strandv1.WithdrawRecoveryRequest{Stream: args[0], Who: who(), Why: why})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				fmt.Fprintf(e.stdout, "withdrew the pending recovery of %s\n", args[0])
				return nil
			},
		},
		{
			name: "failover", args: "NAME", summary: "move a stream's ownership through recovery now",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&failoverWy, "why", "operator failover", "reason, recorded with who ran it")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.Failover, &strandv1.FailoverRequest{Stream: args[0], Who: who(), Why: failoverWy})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				r := res.GetRecovery()
				fmt.Fprintf(e.stdout, "failover of %s pending: from epoch %d, fence %d, proposed owner %s (transition %s)\n",
					args[0], r.GetFromEpoch(), r.GetFenceEpoch(), dash(r.GetProposedOwner()), r.GetTransitionId())
				return nil
			},
		},
	}
}

func printAttention(w io.Writer, entries []*strandv1.AttentionEntry, withStream bool) {
	header := []string{"KIND", "NODE", "MISSING", "START", "SINCE", "REASON", "ACTION"}
	if withStream {
		header = append([]string{"STREAM"}, header...)
	}
	t := newTable(w, header...)
	for _, a := range entries {
		start := "-"
		if a.GetStartNode() != "" || a.GetStartRecordTail() != 0 {
			start = fmt.Sprintf("%d@%s", a.GetStartRecordTail(), dash(a.GetStartNode()))
		}
		row := []any{a.GetKind(), dash(a.GetNode()), dash(strings.Join(a.GetMissing(), ",")), start, sinceString(a.GetSince()), dash(a.GetReason()), dash(a.GetAction())}
		if withStream {
			row = append([]any{dash(a.GetStream())}, row...)
		}
		t.row(row...)
	}
	t.flush()
}
