package cluster

import (
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RecoveryGuards are what a recovery commit compares: the mod revisions
// the writer read the stream's keys at, and the compares that make it the
// writer allowed to commit.
type RecoveryGuards struct {
	// AssignmentRev, RecoveryRev and HistoryRev are the mod revisions the
	// assignment, the pending recovery and the history starts were read
	// at; 0 for a key that was absent, which must then still be absent.
	AssignmentRev, RecoveryRev, HistoryRev int64
	// Writer holds the compares the writer's authority rests on, added
	// as they are: the recoverer's leader key create revision. It is nil
	// for a writer whose own transaction carries them (the controller's
	// term wraps every write it makes in its election guard).
	Writer []clientv3.Cmp
}

// RecoveryCommit returns the compares and operations of the one guarded
// etcd transaction that ends a stream's pending recovery by moving the
// stream (docs/protocol.md, "Stream failover", step 5, and "Accepting
// owner loss"): it writes next, deletes the pending recovery and its seal
// refusals (they describe only the recovery pending beside them), and
// writes starts, the history starts with the new epoch's appended. starts
// nil leaves the history starts as they are (an accepted loss whose new
// owner published no tails records no start).
//
// It compares every revision in g, so exactly one writer wins: a racing
// recoverer, a controller change or an operator action between the read
// and the write fails the compares and the loser reads again; with the
// writer's guard, a deposed leader cannot commit at all. Both writers that
// move a recovering stream build their transaction here, so the recoverer's
// promotion and the controller's accepted owner loss cannot come to guard
// different keys.
func RecoveryCommit(schema Schema, g RecoveryGuards, next Assignment, starts HistoryStarts) ([]clientv3.Cmp, []clientv3.Op) {
	aKey, rKey, hKey := schema.AssignmentKey(next.Stream), schema.RecoveryKey(next.Stream), schema.HistoryKey(next.Stream)
	cmps := make([]clientv3.Cmp, 0, 3+len(g.Writer))
	cmps = append(cmps, readAt(aKey, g.AssignmentRev), readAt(rKey, g.RecoveryRev), readAt(hKey, g.HistoryRev))
	cmps = append(cmps, g.Writer...)
	ops := []clientv3.Op{
		clientv3.OpPut(aKey, Encode(next)),
		clientv3.OpDelete(rKey),
		clientv3.OpDelete(schema.RefusalsKey(next.Stream)),
	}
	if starts != nil {
		ops = append(ops, clientv3.OpPut(hKey, Encode(starts)))
	}
	return cmps, ops
}

// readAt compares key against the mod revision it was read at, or, when it
// was absent (rev 0), against its still being absent.
func readAt(key string, rev int64) clientv3.Cmp {
	if rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}
