package worker

import (
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// snapshot is what one recovery attempt reads: the assignment, the pending
// recovery and the history starts at ONE etcd revision, with the mod
// revisions the guarded commit compares. The starts must come from the same
// snapshot the commit checks, or a start recorded in between could be
// missed (docs/protocol.md, "The confirmed prefix").
type snapshot struct {
	stream string
	// rev is the revision everything was read at.
	rev int64

	assignment    cluster.Assignment
	assignmentRev int64 // mod revision; 0 when there is no assignment
	recovery      cluster.Recovery
	recoveryRev   int64 // mod revision; 0 when no recovery is pending
	history       cluster.HistoryStarts
	historyRev    int64 // mod revision; 0 when the stream has no starts yet

	// refusals is the seal refusals the last round recorded, with its mod
	// revision (0 when absent). Only attention reads it: an unreadable
	// record counts as absent and is overwritten, never withholding a commit.
	refusals    cluster.SealRefusals
	refusalsRev int64

	// brokers maps registered node ids to their addresses. Addresses only
	// say where to send seals, so they carry no safety weight, but reading
	// them here costs nothing. Read only: the snapshots of one gathered
	// read share it.
	brokers map[string]string
}

func (s snapshot) hasRecovery() bool   { return s.recoveryRev != 0 }
func (s snapshot) hasAssignment() bool { return s.assignmentRev != 0 }

// snapshotOpsPerStream is how many gets snapshotOps makes.
const snapshotOpsPerStream = 4

// snapshotOps are the gets of one stream's own keys, in the order
// snapshotOf decodes them: the assignment, the pending recovery, the
// history starts and the seal refusals.
func snapshotOps(schema cluster.Schema, stream string, opts ...clientv3.OpOption) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(schema.AssignmentKey(stream), opts...),
		clientv3.OpGet(schema.RecoveryKey(stream), opts...),
		clientv3.OpGet(schema.HistoryKey(stream), opts...),
		clientv3.OpGet(schema.RefusalsKey(stream), opts...),
	}
}

// snapshotOf decodes the responses to snapshotOps(stream), read at rev. An
// undecodable assignment, recovery or history starts fails this stream's
// snapshot alone.
func snapshotOf(stream string, rev int64, brokers map[string]string, resps []*etcdserverpb.ResponseOp) (snapshot, error) {
	snap := snapshot{stream: stream, rev: rev, brokers: brokers}
	var err error
	if kvs := resps[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
		if snap.assignment, err = cluster.Decode[cluster.Assignment](kvs[0].Value); err != nil {
			return snapshot{}, fmt.Errorf("worker: assignment of %s: %w", stream, err)
		}
		snap.assignmentRev = kvs[0].ModRevision
	}
	if kvs := resps[1].GetResponseRange().GetKvs(); len(kvs) == 1 {
		if snap.recovery, err = cluster.Decode[cluster.Recovery](kvs[0].Value); err != nil {
			return snapshot{}, fmt.Errorf("worker: recovery of %s: %w", stream, err)
		}
		snap.recoveryRev = kvs[0].ModRevision
	}
	if kvs := resps[2].GetResponseRange().GetKvs(); len(kvs) == 1 {
		// An unreadable list withholds the commit: without it the confirmed
		// prefix cannot be checked (docs/protocol.md, "Copies with a longer tail").
		if snap.history, err = cluster.Decode[cluster.HistoryStarts](kvs[0].Value); err != nil {
			return snapshot{}, fmt.Errorf("worker: history starts of %s: %w", stream, err)
		}
		snap.historyRev = kvs[0].ModRevision
	}
	if kvs := resps[3].GetResponseRange().GetKvs(); len(kvs) == 1 {
		snap.refusalsRev = kvs[0].ModRevision
		if r, err := cluster.Decode[cluster.SealRefusals](kvs[0].Value); err == nil {
			snap.refusals = r
		}
	}
	return snap, nil
}

// brokersOf maps the registrations under the brokers prefix to their
// addresses.
func brokersOf(schema cluster.Schema, kvs []*mvccpb.KeyValue) map[string]string {
	brokers := map[string]string{}
	for _, kv := range kvs {
		node, err := cluster.NameIn(schema.BrokersDir(), string(kv.Key))
		if err != nil {
			continue
		}
		info, err := cluster.Decode[cluster.BrokerInfo](kv.Value)
		if err != nil || info.Address == "" {
			// A broker we cannot reach simply does not answer its seal.
			continue
		}
		brokers[node] = info.Address
	}
	return brokers
}
