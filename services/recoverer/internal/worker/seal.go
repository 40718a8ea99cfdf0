package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/services/recoverer/internal/pick"
)

// Why a copy is left out of a seal round.
var (
	errNotRegistered = errors.New("worker: broker not registered")
	errNoAnswer      = errors.New("worker: no seal answer in time")
	errWrongFence    = errors.New("worker: seal answered another fence epoch")
	errWrongNode     = errors.New("worker: seal answered by another node")
)

type sealResult struct {
	node   string
	answer pick.Answer
	err    error
}

// sealRound sends Seal(stream, fence epoch, transition id) to every copy of
// the old assignment at once (each through its broker's sealSender, which
// carries the seals of every round in flight to that broker in one
// SealMany) and gathers the answers until every copy has
// answered or failed, or the seal timeout passes. Copies that fail to answer
// in time are left out (docs/protocol.md, "Stream failover"). Sealing fences each copy
// at the fence epoch first, so its tail cannot grow from the old owner while
// the recovery decides (docs/protocol.md, "Safety argument").
//
// Once the answers in hand already decide a promotion, the round waits only
// QuorumGrace more for stragglers: sealing more than R copies only adds
// followers, and the furthest of any R is correct. A round whose answers are
// below R or below the confirmed prefix waits the full timeout, since the
// missing copy may be the one it needs.
func (t *term) sealRound(snap snapshot) (answers []pick.Answer, failed map[string]error) {
	ctx, cancel := context.WithTimeout(t.ctx, t.w.cfg.SealTimeout)
	defer cancel()

	members := unique(snap.recovery.OldMembers())
	results := make(chan sealResult, len(members))
	for _, node := range members {
		go func() { results <- t.seal(ctx, snap, node) }()
	}

	failed = map[string]error{}
	answered := map[string]bool{}
	var grace <-chan time.Time
collect:
	for len(answered) < len(members) {
		select {
		case r := <-results:
			answered[r.node] = true
			if r.err != nil {
				failed[r.node] = r.err
				continue
			}
			answers = append(answers, r.answer)
			if grace == nil && pick.Decide(snap.assignment, snap.history, answers).Verdict == pick.Promote {
				timer := time.NewTimer(t.w.cfg.QuorumGrace)
				defer timer.Stop()
				grace = timer.C
			}
		case <-grace:
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	for _, node := range members {
		if !answered[node] {
			failed[node] = errNoAnswer
		}
	}
	return answers, failed
}

// seal asks one copy to seal. The answer must be for the fence epoch asked
// and from the node asked: a broker sealed at another epoch, or a node id
// that does not match its registration, reports tails that do not belong to
// this recovery.
func (t *term) seal(ctx context.Context, snap snapshot, node string) sealResult {
	addr, ok := snap.brokers[node]
	if !ok {
		return sealResult{node: node, err: errNotRegistered}
	}
	rec := snap.recovery
	m, err := t.sender(addr).seal(ctx, &strandv1.SealRequest{
		Stream:       snap.stream,
		FenceEpoch:   rec.FenceEpoch,
		TransitionId: rec.TransitionID,
		Incarnation:  snap.assignment.Incarnation,
	})
	if err != nil {
		return sealResult{node: node, err: fmt.Errorf("worker: seal %s at %s: %w", node, addr, err)}
	}
	if m.GetFenceEpoch() != rec.FenceEpoch {
		return sealResult{node: node, err: fmt.Errorf("%w: %d, want %d", errWrongFence, m.GetFenceEpoch(), rec.FenceEpoch)}
	}
	if m.GetNode() != "" && m.GetNode() != node {
		return sealResult{node: node, err: fmt.Errorf("%w: %q, want %q", errWrongNode, m.GetNode(), node)}
	}
	return sealResult{node: node, answer: pick.Answer{
		Node:            node,
		RecordTail:      m.GetRecordTail(),
		CursorEventTail: m.GetCursorEventTail(),
	}}
}

// unique returns nodes without repeats, in their first order.
func unique(nodes []string) []string {
	var out []string
	for _, n := range nodes {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
