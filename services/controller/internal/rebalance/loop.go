package rebalance

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// LoopConfig is what the drain and rebalancing loop needs.
type LoopConfig struct {
	View  *state.View
	Mover *Mover
	Log   zerolog.Logger
	// Rate bounds the moves a second, handovers and replacements together
	// (--rebalance-rate, default 2); Delay is how long owners are left
	// alone after the membership (live or draining brokers) last changed
	// before the loop balances them (--rebalance-delay, default 1 m). A
	// drain does not wait for Delay: the operator asked for it.
	Rate  float64
	Delay time.Duration
}

// Run passes over the view's snapshot once a second, and whenever it
// changes while a drain or a balance is under way, until ctx or the term
// ends: first the drains, then the balance.
//
// While no drain is under way and the last plan found nothing to move, it
// does not pass at every change, and does not plan again on the snapshot
// it found balanced: a plan counts every stream's owner (PlanOf), and
// taking the view's snapshot makes the view copy the part it changes
// next. At 10,000 streams planning at every change was a tenth of the
// controller's work while streams were created, and planning every second
// most of its work when idle (docs/architecture.md, "Coordination only
// through etcd"). A drain, or a balance that found a move, passes at every
// change, so it goes on at --rebalance-rate.
func Run(ctx context.Context, cfg LoopConfig, term *leader.Term) error {
	if cfg.Rate <= 0 {
		cfg.Rate = 2
	}
	if cfg.Delay <= 0 {
		cfg.Delay = time.Minute
	}
	l := &loop{cfg: cfg, term: term, lim: rate.NewLimiter(rate.Limit(cfg.Rate), 1)}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		snap, changed := cfg.View.Current()
		if snap != nil && !l.pass(ctx, snap) {
			changed = nil // waits for the tick
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-term.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

type loop struct {
	cfg  LoopConfig
	term *leader.Term
	lim  *rate.Limiter
	// members is the membership last seen, and since when it holds.
	members string
	since   time.Time
	// balanced is the snapshot the last plan ran on when it found nothing
	// to move (nil when it found a move): the same snapshot is not
	// planned on again (Run).
	balanced *state.Snapshot
}

// pass drains, then balances, and reports whether it is busy: a drain is
// under way or the plan found a move, so the next pass is due at the next
// change.
func (l *loop) pass(ctx context.Context, s *state.Snapshot) bool {
	if m := membership(s); m != l.members {
		l.members, l.since = m, time.Now()
	}
	if l.drain(ctx, s) {
		return true
	}
	if time.Since(l.since) < l.cfg.Delay || s == l.balanced {
		return false
	}
	moves, _ := PlanOf(s, 1)
	l.balanced = nil
	if len(moves) == 0 {
		l.balanced = s
	}
	for _, mv := range moves {
		if !l.take(ctx) {
			return true
		}
		if _, err := l.cfg.Mover.Handover(ctx, l.term, s, mv.Stream, mv.To, 0); err != nil {
			l.note(err, mv.Stream, mv.To, "rebalancing handover not made")
		}
	}
	return len(moves) > 0
}

// drain moves one thing off each draining broker per pass, at the rate
// bound: a stream it owns is handed over to an in-sync follower, else a
// copy it holds is replaced (Replace). It reports whether anything of a
// drain was left to do, so balancing waits for drains.
func (l *loop) drain(ctx context.Context, s *state.Snapshot) bool {
	busy := false
	nodes := make([]string, 0, len(s.Draining))
	for n := range s.Draining {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, node := range nodes {
		names := make([]string, 0)
		for name, av := range s.Assignments {
			if av.Value.Includes(node) {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			busy = true
			if _, pending := s.Recoveries[name]; pending {
				continue // moving already: judged again once committed
			}
			a := s.Assignments[name].Value
			if !l.take(ctx) {
				return true
			}
			var err error
			if a.Owner == node {
				targets := Targets(s, name)
				if len(targets) == 0 {
					continue // waits for a follower in sync
				}
				if _, err = l.cfg.Mover.Handover(ctx, l.term, s, name, best(s, targets), 0); err != nil {
					l.note(err, name, node, "drain: handover not made; trying again")
				}
			} else if _, err = l.cfg.Mover.Replace(ctx, l.term, s, name, node); err != nil {
				l.note(err, name, node, "drain: replacement not made; trying again")
			}
			if err == nil {
				// One move per pass: the next pass judges from a
				// snapshot that holds it. A move refused is tried again
				// on a later pass, after the other streams had theirs.
				return true
			}
		}
	}
	return busy
}

// best is the target owning fewest streams (then the lowest node id).
func best(s *state.Snapshot, targets []string) string {
	_, owned := s.CopyCounts()
	return slices.MinFunc(targets, func(a, b string) int {
		if d := owned[a] - owned[b]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
}

func (l *loop) take(ctx context.Context) bool {
	return l.lim.Wait(ctx) == nil
}

func (l *loop) note(err error, stream, node, msg string) {
	ev := l.cfg.Log.Info()
	if errors.Is(err, context.Canceled) {
		ev = l.cfg.Log.Debug()
	}
	ev.Err(err).Str(logging.Stream, stream).Str(logging.Node, node).Msg(msg)
}

// membership names the live and the draining brokers.
func membership(s *state.Snapshot) string {
	live := s.LiveBrokers()
	var d []string
	for n := range s.Draining {
		d = append(d, n)
	}
	slices.Sort(d)
	return strings.Join(live, ",") + "|" + strings.Join(d, ",")
}
