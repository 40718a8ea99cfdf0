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
		failoverTo string
		catchUp    time.Duration
		drainWait  bool
		drainLimit time.Duration
		dryRun     bool
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
				t := newTable(e.stdout, "NODE", "ADDRESS", "ZONE", "LIVE", "STATE", "COPIES", "OWNED", "STARTED")
				for _, b := range res.GetBrokers() {
					started := "-"
					if b.GetStartTime() != nil {
						started = b.GetStartTime().AsTime().Local().Format(time.DateTime)
					}
					t.row(b.GetNode(), dash(b.GetAddress()), dash(b.GetZone()), yesNo(b.GetLive()), brokerState(b),
						fmt.Sprint(b.GetCopies()), fmt.Sprint(b.GetOwned()), started)
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
			name: "failover", args: "NAME", summary: "move a stream's ownership through recovery now (--to: hand it to a chosen in-sync follower)",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&failoverWy, "why", "operator failover", "reason, recorded with who ran it")
				fs.StringVar(&failoverTo, "to", "", "hand the stream over to this in-sync follower: the owner pauses, the follower catches up, and the move commits at the next epoch")
				fs.DurationVar(&catchUp, "catch-up", 0, "with --to: how long the follower may take to catch up before the handover is abandoned (default: the controller's, 2s)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				if catchUp < 0 || catchUp > 30*time.Second {
					return usagef("--catch-up must be between 0 and 30s, got %v", catchUp)
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.Failover, &strandv1.FailoverRequest{Stream: args[0], Who: who(), Why: failoverWy,
					To: failoverTo, CatchUpMs: uint32(catchUp / time.Millisecond)})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				printFailover(e.stdout, args[0], failoverTo, res)
				return nil
			},
		},
		{
			name: "broker", args: "drain|undrain NODE", summary: "drain a broker (its streams and copies move elsewhere), or end a drain",
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&drainWait, "wait", false, "drain: return once the broker holds no copy and no stream is under-replicated")
				fs.DurationVar(&drainLimit, "wait-timeout", 15*time.Minute, "drain --wait: give up waiting after this long and exit 1 with what is left (the drain itself goes on)")
				fs.StringVar(&why, "why", "", "reason, recorded with who ran it")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 2, 2, "drain|undrain NODE"); err != nil {
					return err
				}
				var b *strandv1.Broker
				switch args[0] {
				case "drain":
					if drainWait && drainLimit <= 0 {
						return usagef("--wait-timeout must be above 0")
					}
					res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.DrainBroker, &strandv1.DrainBrokerRequest{Node: args[1], Who: who(), Why: why})
					if err != nil {
						return err
					}
					b = res.GetBroker()
					if drainWait {
						if b, err = waitDrained(ctx, e, args[1], drainLimit); err != nil {
							return err
						}
					}
				case "undrain":
					if drainWait {
						return usagef("--wait is for drain")
					}
					res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.UndrainBroker, &strandv1.UndrainBrokerRequest{Node: args[1], Who: who(), Why: why})
					if err != nil {
						return err
					}
					b = res.GetBroker()
				default:
					return usagef("want drain or undrain, got %q", args[0])
				}
				if e.g.json {
					return printMessage(e.stdout, b)
				}
				fmt.Fprintf(e.stdout, "broker %s: %s, %d copies, owns %d\n", b.GetNode(), brokerState(b), b.GetCopies(), b.GetOwned())
				return nil
			},
		},
		{
			name: "rebalance", summary: "show the owner moves the controller's balancing would make (--dry-run)",
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&dryRun, "dry-run", false, "only show the plan (required: the controller balances on its own)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 0, "no arguments"); err != nil {
					return err
				}
				if !dryRun {
					return usagef("--dry-run is required: the controller moves owners itself, at --rebalance-rate, a --rebalance-delay after the brokers last changed")
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.GetRebalancePlan, &strandv1.GetRebalancePlanRequest{})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				if len(res.GetMoves()) == 0 {
					fmt.Fprintln(e.stdout, "owners are balanced: nothing to move")
					return nil
				}
				t := newTable(e.stdout, "STREAM", "FROM", "TO")
				for _, m := range res.GetMoves() {
					t.row(m.GetStream(), m.GetFrom(), m.GetTo())
				}
				t.flush()
				return nil
			},
		},
	}
}

// brokerState is a broker's drain state in words.
func brokerState(b *strandv1.Broker) string {
	switch {
	case b.GetDrained():
		return "drained"
	case b.GetDraining():
		return "draining"
	}
	return "-"
}

// printFailover says what a failover did. Without a target the recoverer
// promotes the furthest sealed copy, which for a live owner is usually
// that owner: the stream then comes back to it at the next epoch.
func printFailover(w io.Writer, stream, to string, res *strandv1.FailoverResponse) {
	r := res.GetRecovery()
	if to == "" {
		fmt.Fprintf(w, "failover of %s recorded: from epoch %d to %d (transition %s); the recoverer promotes the furthest sealed copy, %s or the owner %s if it is as far (a live owner usually is); use --to NODE to move the stream to a chosen follower\n",
			stream, r.GetFromEpoch(), r.GetFenceEpoch(), r.GetTransitionId(), dash(r.GetProposedOwner()), dash(r.GetOldOwner()))
		return
	}
	a := res.GetAssignment()
	switch {
	case a == nil:
		fmt.Fprintf(w, "handover of %s to %s recorded (fence epoch %d, transition %s); not committed yet: see strandctl stream get %s\n",
			stream, to, r.GetFenceEpoch(), r.GetTransitionId(), stream)
	case a.GetOwner() == to:
		fmt.Fprintf(w, "handed %s over from %s to %s at epoch %d\n", stream, dash(r.GetOldOwner()), to, a.GetEpoch())
	default:
		fmt.Fprintf(w, "handover of %s committed at epoch %d with owner %s, not %s: that copy was further when sealed\n", stream, a.GetEpoch(), a.GetOwner(), to)
	}
}

// waitDrained polls the brokers and the attention list until node holds no
// copy and no stream is under-replicated, for at most limit. Past it, the
// error says what was still left at the last look: the drain goes on in
// the controller, only the wait ends.
func waitDrained(ctx context.Context, e *env, node string, limit time.Duration) (*strandv1.Broker, error) {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	left := "no answer yet"
	for {
		b, under, err := drainState(wctx, e, node)
		switch {
		case err != nil && wctx.Err() == nil:
			return nil, err
		case err == nil && (b == nil || b.GetDrained()) && under == 0:
			if b == nil {
				b = &strandv1.Broker{Node: node, Draining: true, Drained: true}
			}
			return b, nil
		case err == nil && under < 0:
			left = fmt.Sprintf("%d copies on it", b.GetCopies())
		case err == nil:
			left = fmt.Sprintf("%d copies on it, %d streams under-replicated", b.GetCopies(), under)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wctx.Done():
			return nil, fmt.Errorf("broker %s not drained after %s (%s); the drain goes on: run broker drain %s --wait again, or broker undrain %s to end it", node, limit, left, node, node)
		case <-tick.C:
		}
	}
}

// drainState is node's broker entry (nil once it is gone from the list) and
// how many streams attention lists as under-replicated. The attention list
// (a walk of every stream on the controller) is asked for only once the
// broker is drained; before, under is -1.
func drainState(ctx context.Context, e *env, node string) (*strandv1.Broker, int, error) {
	res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListBrokers, &strandv1.ListBrokersRequest{})
	if err != nil {
		return nil, 0, err
	}
	var b *strandv1.Broker
	for _, x := range res.GetBrokers() {
		if x.GetNode() == node {
			b = x
		}
	}
	if b != nil && !b.GetDrained() {
		return b, -1, nil
	}
	att, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListAttention, &strandv1.ListAttentionRequest{})
	if err != nil {
		return nil, 0, err
	}
	under := 0
	for _, a := range att.GetEntries() {
		if a.GetKind() == "under_replicated" {
			under++
		}
	}
	return b, under, nil
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
