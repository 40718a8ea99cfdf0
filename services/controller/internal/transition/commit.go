package transition

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// Committer writes transitions with guarded transactions, only while term
// leads.
type Committer struct {
	Term   *leader.Term
	Schema cluster.Schema
}

// WriteRecovery records a pending recovery, guarded by the assignment's mod
// revision (nothing moved since the proposal was made) and the recovery key
// being absent (one pending recovery per stream). It never moves the stream:
// the recoverer seals and commits (docs/protocol.md, "Stream failover"). Seal
// refusals left from an earlier recovery are deleted with it: every write
// that records or clears a recovery drops them, so they only ever describe
// the recovery pending beside them.
func (c Committer) WriteRecovery(ctx context.Context, asgModRev int64, rec cluster.Recovery, extra ...clientv3.Op) error {
	cmps, ops, _ := c.recoveryTxn(RecoveryWrite{AsgModRev: asgModRev, Rec: rec}, extra...)
	resp, err := c.Term.Txn(ctx, cmps, ops, nil)
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: recovery of %s", ErrConflict, rec.Stream)
	}
	return nil
}

// FastPath commits next in place of old when IsFastPath holds, keeping the
// epoch: nothing is sealed or fenced, and brokers apply the new follower set
// and policy from their assignment watch (docs/protocol.md, "The fast
// path"). It is guarded by the assignment's mod revision and by
// no recovery being pending, which would otherwise act on a stale member list.
func (c Committer) FastPath(ctx context.Context, old state.Versioned[cluster.Assignment], next cluster.Assignment, extra ...clientv3.Op) error {
	next.Epoch = old.Value.Epoch
	if !cluster.IsFastPath(old.Value, next) {
		return ErrNotFastPath
	}
	ops := append([]clientv3.Op{clientv3.OpPut(c.Schema.AssignmentKey(next.Stream), cluster.Encode(next))}, extra...)
	resp, err := c.Term.Txn(ctx, []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(c.Schema.AssignmentKey(next.Stream)), "=", old.ModRev),
		clientv3.Compare(clientv3.CreateRevision(c.Schema.RecoveryKey(next.Stream)), "=", 0),
	}, ops, nil)
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: assignment of %s", ErrConflict, next.Stream)
	}
	return nil
}

// AcceptLoss commits an accepted owner loss read from s: the new assignment,
// the start appended to the history starts (when there is one) and the
// cleared pending recovery with its seal refusals, in one transaction
// (cluster.RecoveryCommit, the one the recoverer's promotion writes too).
//
// It compares the mod revisions s read (the assignment, the pending
// recovery and the history starts, each still absent if it was), and the
// term's guard wraps it (leader.Term.Txn). So exactly one writer wins: a
// recoverer committing the same recovery, another controller write or a
// second operator call in between fails it with ErrConflict, and a deposed
// controller cannot commit (ErrNotLeader).
func (c Committer) AcceptLoss(ctx context.Context, s *state.Snapshot, out AcceptedLoss) error {
	stream := out.Assignment.Stream
	var starts cluster.HistoryStarts
	if out.Start != nil {
		starts = append(append(cluster.HistoryStarts{}, s.History[stream].Value...), *out.Start)
	}
	cmps, ops := cluster.RecoveryCommit(c.Schema, cluster.RecoveryGuards{
		AssignmentRev: s.Assignments[stream].ModRev,
		RecoveryRev:   s.Recoveries[stream].ModRev,
		HistoryRev:    s.History[stream].ModRev,
		// Writer: none here; the term's Txn carries the election guard.
	}, out.Assignment, starts)
	resp, err := c.Term.Txn(ctx, cmps, ops, nil)
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: accepted loss of %s", ErrConflict, stream)
	}
	return nil
}

// WithdrawRecovery deletes the pending recovery read in s and its seal
// refusals, guarded by its mod revision so a recovery recorded since is not
// withdrawn unseen.
func (c Committer) WithdrawRecovery(ctx context.Context, s *state.Snapshot, stream string) error {
	rv, ok := s.Recoveries[stream]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoRecovery, stream)
	}
	key := c.Schema.RecoveryKey(stream)
	resp, err := c.Term.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rv.ModRev)},
		[]clientv3.Op{clientv3.OpDelete(key), clientv3.OpDelete(c.Schema.RefusalsKey(stream))}, nil)
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: recovery of %s", ErrConflict, stream)
	}
	return nil
}
