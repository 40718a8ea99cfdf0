package worker

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/gather"
)

// Bounds of one gathered snapshot read (docs/protocol.md, "Stream
// failover").
const (
	// maxSnapshotBatch is the most streams one read carries. etcd refuses
	// a transaction of more than --max-txn-ops (128 by default; docs/etcd.md
	// says not to lower it) operations, read-only ones too: a stream's
	// snapshot is four gets and the brokers prefix is one get for the
	// whole batch, so 31 streams make 125. The request is keys only; the
	// response holds each stream's four values (an assignment, a pending
	// recovery and a refusal record of well under a KiB each, and the
	// history starts at some 80 bytes an epoch) and the registrations
	// once, so it stays under 1 MiB until the streams' history starts
	// average some 400 epochs each: far below the client's receive limit
	// (2 GiB, which we leave at its default), and no larger than what the
	// streams' reads one at a time fetched together.
	maxSnapshotBatch = (128 - 1) / snapshotOpsPerStream
	// snapshotReadsInFlight bounds the gathered reads at once: attempts
	// that read while they are all busy form the next reads, so a lone
	// failover reads at once and a mass failover's 1,024 attempts in
	// flight (DefaultMaxInFlight) read in a few transactions rather than
	// one each. etcd answers the linearizable reads waiting together with
	// one read index; with 4 in flight, the 3,300 streams of a killed
	// broker waited up to 5 s from their recording to their first read.
	// 32 carry about 1,000 streams at once (docs/limits.md).
	snapshotReadsInFlight = 32
)

// snapshotRead is one snapshot read: a stream, and the revision the answer
// must be at or past (0: a linearizable read made after the call began).
type snapshotRead struct {
	stream  string
	atLeast int64
}

// newSnapshotReader is a term's gatherer of snapshot reads.
func newSnapshotReader(cli *clientv3.Client, schema cluster.Schema) *gather.Gatherer[snapshotRead, snapshot] {
	return gather.New(maxSnapshotBatch, snapshotReadsInFlight, func(ctx context.Context, reads []snapshotRead) []gather.Result[snapshot] {
		return readSnapshots(ctx, cli, schema, reads)
	})
}

// readSnapshots reads the recovery state of every stream of reads in one
// read-only transaction: each stream's own keys, and the brokers prefix
// once for all. Everything is read at the transaction's one revision, so
// each stream's snapshot is of one revision, as the guarded commit's mod
// revision compares need (docs/protocol.md, "The guarded commit", "The
// confirmed prefix"), and each is the snapshot readSnapshot would have
// read at that revision. When every read names a revision (that of the
// watch event that woke its attempt) the answer is at or past the newest
// of them, read serializable first (cluster.ReadAtLeast); otherwise it is
// linearizable. Either way the commit compares what was read, so a read
// that missed a later change only loses its commit and reads again. A
// failed read fails every stream with its error, never as "no recovery
// pending": the attempt waits and reads again. An undecodable value fails
// its own stream only.
func readSnapshots(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, reads []snapshotRead) []gather.Result[snapshot] {
	out := make([]gather.Result[snapshot], len(reads))
	atLeast := cluster.AtLeastAll(reads, func(r snapshotRead) int64 { return r.atLeast })
	resp, err := cluster.ReadAtLeast(ctx, cli, atLeast, func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, 0, 1+snapshotOpsPerStream*len(reads))
		ops = append(ops, clientv3.OpGet(schema.BrokersDir(), append([]clientv3.OpOption{clientv3.WithPrefix()}, opts...)...))
		for _, r := range reads {
			ops = append(ops, snapshotOps(schema, r.stream, opts...)...)
		}
		return ops
	})
	if err != nil {
		// The text is the stream's read alone would give, whatever the
		// batch: an attempt logs a wait again only when its text changes.
		for i, r := range reads {
			out[i].Err = fmt.Errorf("worker: read %s: %w", r.stream, err)
		}
		return out
	}
	brokers := brokersOf(schema, resp.Responses[0].GetResponseRange().GetKvs())
	for i, r := range reads {
		lo := 1 + snapshotOpsPerStream*i
		out[i].Value, out[i].Err = snapshotOf(r.stream, resp.Header.Revision, brokers, resp.Responses[lo:lo+snapshotOpsPerStream])
	}
	return out
}
