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

// newHistoryReader gathers the History reads of the broker's copies (a
// role change after a seal, an effective tail in a seal answer:
// docs/protocol.md, "Copies with a longer tail") into read-only
// transactions of many gets. Each caller gets what its own linearizable
// Get would have given: its stream's starts at a revision read after its
// call began, or the error.
func newHistoryReader(cli *clientv3.Client, schema cluster.Schema) *gather.Gatherer[string, cluster.HistoryStarts] {
	return gather.New(maxHistoryBatch, historyReadsInFlight, func(ctx context.Context, streams []string) []gather.Result[cluster.HistoryStarts] {
		return readHistories(ctx, cli, schema, streams)
	})
}

// readHistories reads the history starts of streams in one read-only
// transaction. A missing key is an empty list; an unreadable one fails its
// stream alone, so that copy withholds its role change; a failed read
// fails every stream with its error.
func readHistories(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, streams []string) []gather.Result[cluster.HistoryStarts] {
	out := make([]gather.Result[cluster.HistoryStarts], len(streams))
	ops := make([]clientv3.Op, len(streams))
	for i, s := range streams {
		ops[i] = clientv3.OpGet(schema.HistoryKey(s))
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err == nil && len(resp.Responses) != len(ops) {
		err = fmt.Errorf("%d responses for %d gets", len(resp.Responses), len(ops))
	}
	if err != nil {
		for i, s := range streams {
			out[i].Err = fmt.Errorf("coord: history starts of %s: %w", s, err)
		}
		return out
	}
	for i, s := range streams {
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
