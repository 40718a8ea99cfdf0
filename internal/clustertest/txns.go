package clustertest

import (
	"context"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TxnKinds wraps a client's KV and records each transaction sent through
// it by the kind of its gets: "serializable" when every get of its success
// branch is, else "linearizable" (a write counts as linearizable). Tests
// install it as cli.KV = &clustertest.TxnKinds{KV: cli.KV}.
type TxnKinds struct {
	clientv3.KV

	mu    sync.Mutex
	kinds []string
}

// Txn records the transaction at its Then.
func (k *TxnKinds) Txn(ctx context.Context) clientv3.Txn {
	return &recordedTxn{Txn: k.KV.Txn(ctx), k: k}
}

// Kinds returns what was recorded since the last call, comma separated,
// and starts again.
func (k *TxnKinds) Kinds() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := strings.Join(k.kinds, ",")
	k.kinds = nil
	return s
}

type recordedTxn struct {
	clientv3.Txn
	k *TxnKinds
}

func (t *recordedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	kind := "serializable"
	for _, op := range ops {
		if !op.IsGet() || !op.IsSerializable() {
			kind = "linearizable"
		}
	}
	if len(ops) == 0 {
		kind = "linearizable"
	}
	t.k.mu.Lock()
	t.k.kinds = append(t.k.kinds, kind)
	t.k.mu.Unlock()
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *recordedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *recordedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}
