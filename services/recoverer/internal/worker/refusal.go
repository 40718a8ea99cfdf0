package worker

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/recoverer/internal/pick"
)

// refusalsOf returns the seal refusals a round that leaves the recovery in
// snap waiting records, or nil when there are none: one per old copy that
// did not seal although its broker is registered, in the old assignment's
// order. A copy whose broker is not registered is not listed: attention
// already shows it down, and it cannot answer until it registers again.
//
// A copy that refused in the round recorded before, for the same
// transition, keeps the time it was first seen refusing, so an unchanged
// refusal rewrites nothing.
func refusalsOf(snap snapshot, d pick.Decision, failed map[string]error, now time.Time) *cluster.SealRefusals {
	rec := snap.recovery
	var prev map[string]time.Time
	if snap.refusalsRev != 0 && snap.refusals.TransitionID == rec.TransitionID && snap.refusals.FenceEpoch == rec.FenceEpoch {
		prev = map[string]time.Time{}
		for _, r := range snap.refusals.Refusals {
			prev[r.Node] = r.Since
		}
	}
	var refusals []cluster.SealRefusal
	for _, node := range d.Missing {
		err := failed[node]
		if _, registered := snap.brokers[node]; !registered || err == nil || errors.Is(err, errNotRegistered) {
			continue
		}
		r := cluster.SealRefusal{Node: node, Error: truncate(err.Error(), cluster.MaxRefusalError), Since: now.UTC()}
		var ce *connect.Error
		if errors.As(err, &ce) {
			r.Code = ce.Code().String()
		}
		if since, ok := prev[node]; ok {
			r.Since = since
		}
		refusals = append(refusals, r)
	}
	if len(refusals) == 0 {
		return nil
	}
	return &cluster.SealRefusals{
		Stream:       snap.stream,
		FenceEpoch:   rec.FenceEpoch,
		TransitionID: rec.TransitionID,
		R:            d.R,
		Sealed:       d.Sealed,
		Refusals:     refusals,
	}
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// writeRefusals makes the stored seal refusals of snap's stream want (nil
// deletes them), unless they already are. The write compares the mod
// revisions snap read for the recovery, the assignment and the refusals,
// and the leader key, as the commit does: refusals recorded for a recovery
// that has since been committed, withdrawn or replaced would describe a
// wait that is over. A failed compare writes nothing and is not an error;
// the next attempt reads again.
func writeRefusals(ctx context.Context, cli *clientv3.Client, schema cluster.Schema, snap snapshot, leader Leader, want *cluster.SealRefusals) (written bool, err error) {
	switch {
	case want == nil && snap.refusalsRev == 0:
		return false, nil
	case want != nil && snap.refusalsRev != 0 && cluster.Encode(*want) == cluster.Encode(snap.refusals):
		return false, nil
	}
	fKey := schema.RefusalsKey(snap.stream)
	refusals := clientv3.Compare(clientv3.ModRevision(fKey), "=", snap.refusalsRev)
	if snap.refusalsRev == 0 {
		refusals = clientv3.Compare(clientv3.CreateRevision(fKey), "=", 0)
	}
	op := clientv3.OpDelete(fKey)
	if want != nil {
		op = clientv3.OpPut(fKey, cluster.Encode(*want))
	}
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(schema.RecoveryKey(snap.stream)), "=", snap.recoveryRev),
		clientv3.Compare(clientv3.ModRevision(schema.AssignmentKey(snap.stream)), "=", snap.assignmentRev),
		refusals,
		leader.guard(),
	).Then(op).Commit()
	if err != nil {
		return false, fmt.Errorf("worker: seal refusals of %s: %w", snap.stream, err)
	}
	return resp.Succeeded, nil
}
