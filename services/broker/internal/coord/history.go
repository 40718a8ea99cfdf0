package coord

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/gather"
)

// Bounds of one gathered read of history starts.
const (
	// maxHistoryBatch is the most streams one read carries. etcd refuses a
	// transaction of more than --max-txn-ops (128 by default; docs/etcd.md
	// says not to lower it) operations, a read-only one too, and a stream
	// is one get. Half of that keeps the response small however the lists
	// grow: history starts cost some 80 bytes an epoch, so 64 streams
	// reach 1 MiB only once they average some 200 epochs each, far below
	// the client's receive limit (2 GiB, its default).
	maxHistoryBatch = 64
	// historyReadsInFlight bounds the gathered reads at once: the reads
	// asked for while they are all busy form the next ones, so a lone role
	// change reads at once and the thousands of copies taking a role after
	// a mass failover read in a few dozen transactions, not one each. With
	// four (256 streams a round), the read was most of the time a copy
	// took from the recovery's commit to its new role when 3,334 streams
	// failed over on a loaded two-core machine (a median 0.46 s, a tenth
	// over 1.1 s, against 0.03 s for the sync and 0.06 s for the epoch
	// advance): etcd serves concurrent linearizable reads with one read
	// index, so 16 cost little more than four and carry 1,024 streams.
	historyReadsInFlight = 16
)

// historyRead is one History read: a stream, and the revision the answer
// must be at or past (0: a linearizable read made after the call began).
type historyRead struct {
	stream  string
	atLeast int64
}

// newHistoryReader gathers the History reads of the broker's copies (a
// role change after a seal, an effective tail in a seal answer:
// docs/protocol.md, "Copies with a longer tail") into read-only
// transactions of many gets. Each caller gets what its own Get would have
// given: its stream's starts at a revision read after its call began
// (linearizable), or at or past the revision it names, or the error.
func newHistoryReader(cli *clientv3.Client, schema cluster.Schema) *gather.Gatherer[historyRead, cluster.HistoryStarts] {
	return gather.New(maxHistoryBatch, historyReadsInFlight, func(ctx context.Context, reads []historyRead) []gather.Result[cluster.HistoryStarts] {
		return readHistories(ctx, cli, schema, reads)
	})
}

// readHistories reads the history starts of reads in one read-only
// transaction. A missing key is an empty list; an unreadable one fails its
// stream alone, so that copy withholds its role change; a failed read
// fails every stream with its error.
//
// When every read names a revision, the transaction is first sent
// serializable: the etcd member answers from what it has applied, without
// the read index a linearizable read waits for, which after a mass
// failover queued each read behind the raft log's backlog of heartbeats
// and commits (a median copy waited 0.56 s for its history starts, most
// of the time from a recovery's commit to its new role). That answer
// stands only if its revision is at or past every named one: a member
// behind (another member of the cluster served the watch) is read again
// linearizably. A serializable read that fails is not sent again as a
// linearizable one: that would double the wait of every caller when etcd
// is slow or away, and each caller retries on its own (the copy's apply
// with its backoff).
func readHistories(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, reads []historyRead) []gather.Result[cluster.HistoryStarts] {
	out := make([]gather.Result[cluster.HistoryStarts], len(reads))
	var atLeast int64
	for _, r := range reads {
		if r.atLeast <= 0 {
			atLeast = 0
			break
		}
		atLeast = max(atLeast, r.atLeast)
	}
	var resp *clientv3.TxnResponse
	var err error
	if atLeast > 0 {
		resp, err = historyTxn(ctx, cli, schema, reads, clientv3.WithSerializable())
		if err == nil && resp.Header.GetRevision() < atLeast {
			resp = nil
		}
	}
	if resp == nil && err == nil {
		resp, err = historyTxn(ctx, cli, schema, reads)
	}
	if err != nil {
		for i, r := range reads {
			out[i].Err = fmt.Errorf("coord: history starts of %s: %w", r.stream, err)
		}
		return out
	}
	for i, r := range reads {
		s := r.stream
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue
		}
		if out[i].Value, out[i].Err = cluster.Decode[cluster.HistoryStarts](kvs[0].Value); out[i].Err != nil {
			out[i].Err = fmt.Errorf("coord: history starts of %s: %w", s, out[i].Err)
		}
	}
	return out
}

// historyTxn is one read-only transaction of a get per read, each with
// opts; etcd serves it without a read index when every get is
// serializable.
func historyTxn(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, reads []historyRead, opts ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
	ops := make([]clientv3.Op, len(reads))
	for i, r := range reads {
		ops[i] = clientv3.OpGet(schema.HistoryKey(r.stream), opts...)
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err == nil && len(resp.Responses) != len(ops) {
		err = fmt.Errorf("%d responses for %d gets", len(resp.Responses), len(ops))
	}
	return resp, err
}
