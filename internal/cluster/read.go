package cluster

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadAtLeast sends the gets of ops as one read-only transaction whose
// answer is at or past revision atLeast: the rule of every read a watch
// event started (docs/etcd-schema.md, "Reads"). ops builds the gets, each
// with the options it is given.
//
// A reader woken by a watch event needs to see that event and what came
// before it, not etcd's newest state: whatever it then writes is a guarded
// commit comparing the mod revisions it read, which fails if anything it
// read changed since. So when atLeast is above 0 the transaction is first
// sent serializable, which the etcd member answers from what it has
// applied, without the read index a linearizable read waits for (after a
// mass failover, for the raft log's backlog of heartbeats and commits).
// That answer stands only if its revision is at or past atLeast; a member
// behind (another member served the watch) is read again linearizably.
// With atLeast 0 the read is linearizable: it sees every write made before
// the call.
//
// A serializable read that fails is not sent again linearizably: that
// would double the wait of every caller when etcd is slow or away, and
// each caller retries on its own.
func ReadAtLeast(ctx context.Context, kv clientv3.KV, atLeast int64, ops func(opts ...clientv3.OpOption) []clientv3.Op) (*clientv3.TxnResponse, error) {
	if atLeast > 0 {
		resp, err := readTxn(ctx, kv, ops(clientv3.WithSerializable()))
		if err != nil || resp.Header.GetRevision() >= atLeast {
			return resp, err
		}
	}
	return readTxn(ctx, kv, ops())
}

// readTxn is one read-only transaction of gets; etcd serves it without a
// read index when every get is serializable.
func readTxn(ctx context.Context, kv clientv3.KV, gets []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := kv.Txn(ctx).Then(gets...).Commit()
	if err == nil && len(resp.Responses) != len(gets) {
		return nil, fmt.Errorf("%d responses for %d gets", len(resp.Responses), len(gets))
	}
	return resp, err
}

// AtLeastAll is the revision one read for all of reqs must be at or past:
// the newest that rev gives, or 0 (linearizable) when any gives none.
func AtLeastAll[T any](reqs []T, rev func(T) int64) int64 {
	var atLeast int64
	for _, r := range reqs {
		n := rev(r)
		if n <= 0 {
			return 0
		}
		atLeast = max(atLeast, n)
	}
	return atLeast
}
