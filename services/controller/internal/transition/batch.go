package transition

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// TxnLimit is what one etcd transaction may carry.
type TxnLimit struct {
	// Ops bounds its compares, and its operations: etcd's --max-txn-ops
	// counts the larger of a transaction's compares and either branch.
	Ops int
	// Bytes bounds the keys and values it writes.
	Bytes int
}

// DefaultTxnLimit fits etcd's defaults: --max-txn-ops 128, and a quarter of
// --max-request-bytes (1.5 MiB), leaving room for the request's framing.
var DefaultTxnLimit = TxnLimit{Ops: 128, Bytes: 384 << 10}

// termTxnOps is what a term's Txn takes of the limit around the compares
// and operations it is given: the outer transaction's leader guard and
// nested transaction count 1, and etcd checks a nested transaction against
// --max-txn-ops less its parent's count.
const termTxnOps = 1

// TxnSize is what one stream's part of a batched transaction costs: its
// compares, its operations and the bytes of its keys and values.
type TxnSize struct {
	Cmps  int
	Ops   int
	Bytes int
}

// Batches splits parts, in their order, into runs that each fit one of a
// term's transactions under limit, and returns where each run ends: run i
// is parts[ends[i-1]:ends[i]]. A run's compares, and its operations, plus
// the term's own stay within limit.Ops, and its bytes within limit.Bytes.
// A part over the limit on its own still forms a run of one: written alone
// it fails as it would have without batching, and no other stream's write
// goes with it.
func Batches(parts []TxnSize, limit TxnLimit) (ends []int) {
	var cmps, ops, bytes int
	for i, p := range parts {
		if i > 0 && (termTxnOps+max(cmps+p.Cmps, ops+p.Ops) > limit.Ops || bytes+p.Bytes > limit.Bytes) {
			ends = append(ends, i)
			cmps, ops, bytes = 0, 0, 0
		}
		cmps += p.Cmps
		ops += p.Ops
		bytes += p.Bytes
	}
	if len(parts) > 0 {
		ends = append(ends, len(parts))
	}
	return ends
}

// RecoveryWrite is one stream's pending recovery to record, with the mod
// revision of the assignment it was proposed from.
type RecoveryWrite struct {
	AsgModRev int64
	Rec       cluster.Recovery
}

// recoveryTxn is one stream's part of a recovery write: the compares and
// operations WriteRecovery describes, the same alone or in a batch.
func (c Committer) recoveryTxn(w RecoveryWrite, extra ...clientv3.Op) ([]clientv3.Cmp, []clientv3.Op, TxnSize) {
	recKey, refKey := c.Schema.RecoveryKey(w.Rec.Stream), c.Schema.RefusalsKey(w.Rec.Stream)
	value := cluster.Encode(w.Rec)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(c.Schema.AssignmentKey(w.Rec.Stream)), "=", w.AsgModRev),
		clientv3.Compare(clientv3.CreateRevision(recKey), "=", 0),
	}
	ops := append([]clientv3.Op{
		clientv3.OpPut(recKey, value),
		clientv3.OpDelete(refKey),
	}, extra...)
	size := TxnSize{Cmps: len(cmps), Ops: len(ops), Bytes: len(c.Schema.AssignmentKey(w.Rec.Stream)) + 2*len(recKey) + len(value) + len(refKey)}
	return cmps, ops, size
}

// RecoverySize is what w costs in a batch (Batches).
func (c Committer) RecoverySize(w RecoveryWrite) TxnSize {
	_, _, size := c.recoveryTxn(w)
	return size
}

// WriteRecoveries records the pending recoveries of several streams in one
// transaction, each stream with exactly the compares WriteRecovery makes for
// it. An etcd transaction is all or nothing: one stream whose assignment
// moved, or whose recovery is pending already, fails the whole batch with
// ErrConflict and none is recorded. The caller writes such a batch again
// one stream at a time, so only the streams that changed wait. Batches
// keeps a batch within the transaction limits. rev is the revision the
// write made: a snapshot older than it does not show the recoveries yet.
func (c Committer) WriteRecoveries(ctx context.Context, writes []RecoveryWrite) (rev int64, err error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, w := range writes {
		wc, wo, _ := c.recoveryTxn(w)
		cmps = append(cmps, wc...)
		ops = append(ops, wo...)
	}
	resp, err := c.Term.Txn(ctx, cmps, ops, nil)
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: recoveries of %d streams", ErrConflict, len(writes))
	}
	return resp.Header.GetRevision(), nil
}
