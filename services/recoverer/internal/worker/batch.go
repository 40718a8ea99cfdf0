package worker

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// Limits of one batched commit transaction (docs/protocol.md, "The guarded
// commit"). etcd refuses a transaction whose compares, or whose operations
// in either branch, number more than --max-txn-ops (128 by default; it
// takes the largest of the three, v3rpc checkTxnRequest): a stream's
// commit is three compares and at most four operations, so 31 streams
// make 94 compares with the leader guard and 124 operations. The bytes
// bound keeps a batch far below --max-request-bytes (1.5 MiB) however long
// the history starts grow.
const (
	maxCommitBatch      = 31
	maxCommitBatchBytes = 256 << 10
	// commitsInFlight bounds the batched transactions written at once:
	// etcd commits proposals that arrive together in one raft entry, and
	// requests queued while these are in flight form the next batches.
	// With four, a mass failover's attempts spent most of their time
	// waiting for a commit slot (the seals had answered); with eight, a
	// stream still waited 0.4 s (median) from its seals to its commit
	// when 3,300 streams failed over on a slow disk. 32 carry about 1,000
	// streams per raft entry: against 16 (with 32 snapshot reads and 64
	// recording batches at once, docs/limits.md), the streams of a
	// 10,000-stream failover all served again sooner in three of four
	// alternated pairs.
	commitsInFlight = 32
)

// commitReq is one stream's promotion waiting to be committed: what its
// attempt read and what it decided.
type commitReq struct {
	snap   snapshot
	next   cluster.Assignment
	starts cluster.HistoryStarts
	done   chan commitResult
}

type commitResult struct {
	committed bool
	// rev is the revision of the commit when committed.
	rev int64
	err error
}

// size is what the stream's part of a batch costs in values and keys.
func (r commitReq) size(schema cluster.Schema) int {
	n := len(cluster.Encode(r.next)) + 4*len(schema.AssignmentKey(r.snap.stream))
	if r.starts != nil {
		n += len(cluster.Encode(r.starts))
	}
	return n
}

// commitBatched hands the promotion to the term's committer and waits for
// its answer. The answer is the one commit would give for this stream
// alone: batching changes how many streams share a transaction, never
// which compares a stream's commit makes.
func (t *term) commitBatched(snap snapshot, next cluster.Assignment, starts cluster.HistoryStarts) (committed bool, rev int64, err error) {
	req := commitReq{snap: snap, next: next, starts: starts, done: make(chan commitResult, 1)}
	select {
	case t.commits <- req:
	case <-t.ctx.Done():
		return false, 0, t.ctx.Err()
	}
	select {
	case res := <-req.done:
		return res.committed, res.rev, res.err
	case <-t.ctx.Done():
		// The batch may still commit; the next term reads the outcome.
		return false, 0, t.ctx.Err()
	}
}

// runCommits is the term's committer: it gathers the promotions the
// streams' attempts decided into batches of up to maxCommitBatch and writes
// each batch in one transaction (commitBatch), up to commitsInFlight at
// once. It waits for nothing to fill a batch: a promotion decided while
// every slot is busy joins the next batch, so a lone failover commits at
// once and a mass failover writes a transaction per 31 streams
// instead of one per stream.
func (t *term) runCommits() {
	slots := make(chan struct{}, commitsInFlight)
	for {
		select {
		case slots <- struct{}{}:
		case <-t.ctx.Done():
			return
		}
		var batch []commitReq
		select {
		case r := <-t.commits:
			batch = append(batch, r)
		case <-t.ctx.Done():
			return
		}
		bytes := batch[0].size(t.w.cfg.Schema)
	fill:
		for len(batch) < maxCommitBatch {
			select {
			case r := <-t.commits:
				if n := r.size(t.w.cfg.Schema); bytes+n <= maxCommitBatchBytes {
					batch = append(batch, r)
					bytes += n
					continue
				}
				// Too large to join: it starts the next batch, written
				// alone now rather than held back.
				t.wg.Go(func() { t.answer([]commitReq{r}) })
			default:
				break fill
			}
		}
		t.wg.Go(func() {
			defer func() { <-slots }()
			t.answer(batch)
		})
	}
}

// answer commits batch and tells each stream's attempt how its commit went.
func (t *term) answer(batch []commitReq) {
	for i, res := range commitBatch(t.ctx, t.w.cfg.Client, t.w.cfg.Schema, t.leader, batch) {
		batch[i].done <- res
	}
}

// commitBatch writes the promotions of batch in one guarded transaction:
// every stream's compares exactly as commit makes them (the assignment's,
// the pending recovery's and the history starts' mod revisions its attempt
// read), and the leader guard once. A transaction is all or nothing, so a
// stream is committed only if every one of its own compares holds
// (docs/protocol.md, "The guarded commit"). When the batch is refused and
// the leader key still stands, some stream's state changed since its read:
// every stream of the batch is then committed alone, so only the streams
// that changed lose and read again, while the others commit. A failed
// write (a timeout, a limit) is written alone too: if the batch did reach
// etcd, each stream's compares now fail and its attempt reads the outcome.
func commitBatch(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, leader Leader, batch []commitReq) []commitResult {
	out := make([]commitResult, len(batch))
	if len(batch) == 1 {
		r := batch[0]
		out[0].committed, out[0].rev, out[0].err = commit(ctx, cli, schema, r.snap, leader, r.next, r.starts)
		return out
	}
	cmps := []clientv3.Cmp{leader.guard()}
	var ops []clientv3.Op
	for _, r := range batch {
		c, o := cluster.RecoveryCommit(schema, guardsOf(r.snap, nil), r.next, r.starts)
		cmps = append(cmps, c...)
		ops = append(ops, o...)
	}
	resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(leader.Key)).Commit()
	switch {
	case err == nil && resp.Succeeded:
		for i := range out {
			out[i].committed, out[i].rev = true, resp.Header.GetRevision()
		}
		return out
	case err == nil:
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != leader.Rev {
			for i := range out {
				out[i].err = errDeposed
			}
			return out
		}
	case ctx.Err() != nil:
		for i := range out {
			out[i].err = fmt.Errorf("worker: commit of %d streams: %w", len(batch), err)
		}
		return out
	}
	for i, r := range batch {
		out[i].committed, out[i].rev, out[i].err = commit(ctx, cli, schema, r.snap, leader, r.next, r.starts)
		if errors.Is(out[i].err, errDeposed) {
			for j := i + 1; j < len(out); j++ {
				out[j].err = errDeposed
			}
			break
		}
	}
	return out
}

// guardsOf are the compares of a commit of what snap read, with the
// writer's guard.
func guardsOf(snap snapshot, writer []clientv3.Cmp) cluster.RecoveryGuards {
	return cluster.RecoveryGuards{
		AssignmentRev: snap.assignmentRev,
		RecoveryRev:   snap.recoveryRev,
		HistoryRev:    snap.historyRev,
		Writer:        writer,
	}
}
