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
// transaction, at or past the revision every read names when all name one
// (cluster.ReadAtLeast: serializable first, so a copy taking its role
// after a mass failover does not wait for a read index behind the raft
// log's backlog, which was most of the time from a recovery's commit to
// the new role), linearizably otherwise. A missing key is an empty list;
// an unreadable one fails its stream alone, so that copy withholds its
// role change; a failed read fails every stream with its error.
func readHistories(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, reads []historyRead) []gather.Result[cluster.HistoryStarts] {
	out := make([]gather.Result[cluster.HistoryStarts], len(reads))
	atLeast := cluster.AtLeastAll(reads, func(r historyRead) int64 { return r.atLeast })
	resp, err := cluster.ReadAtLeast(ctx, cli, atLeast, func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, len(reads))
		for i, r := range reads {
			ops[i] = clientv3.OpGet(schema.HistoryKey(r.stream), opts...)
		}
		return ops
	})
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
