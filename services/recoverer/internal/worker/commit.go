package worker

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// commit writes a promotion with one guarded transaction (docs/protocol.md,
// "Stream failover": one guarded write commits the new assignment, clears
// the pending recovery and appends where the new owner's history starts).
// It also deletes the seal refusals recorded for the recovery. The
// transaction is cluster.RecoveryCommit's, the one the controller's
// accepted owner loss writes too.
//
// It compares the mod revisions snap was read at (the assignment, the
// recovery, and the history starts, which must still be absent if they
// were) and the leader key's create revision. So exactly one writer wins:
// a racing recoverer, a controller change or an operator action in between
// makes it fail, and the loser reads again; a deposed leader cannot commit.
//
// committed is false when a compare failed; err is errDeposed when the
// failed compare was the leader key's. rev is the commit's revision when
// committed.
func commit(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, snap snapshot, leader Leader, next cluster.Assignment, starts cluster.HistoryStarts) (committed bool, rev int64, err error) {
	cmps, ops := cluster.RecoveryCommit(schema, guardsOf(snap, []clientv3.Cmp{leader.guard()}), next, starts)
	resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Else(
		clientv3.OpGet(leader.Key),
	).Commit()
	if err != nil {
		return false, 0, fmt.Errorf("worker: commit %s: %w", snap.stream, err)
	}
	if resp.Succeeded {
		return true, resp.Header.GetRevision(), nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 || kvs[0].CreateRevision != leader.Rev {
		return false, 0, errDeposed
	}
	return false, 0, nil
}
