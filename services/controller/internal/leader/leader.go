// Package leader holds the controller's leadership: the etcd election it
// campaigns in, the current term, and the guard every leader write carries.
package leader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotLeader is returned by a write when this controller is not (or no
// longer) the leader. Writes compare the election key's create revision, so a
// deposed leader cannot change anything even before it notices.
var ErrNotLeader = errors.New("leader: not the controller leader")

// Term is one period of leadership: the election key this controller holds
// and the revision it was created at.
type Term struct {
	cli  *clientv3.Client
	key  string
	rev  int64
	done <-chan struct{}
}

// NewTerm describes leadership held through election key key created at rev;
// done is closed when the term ends.
func NewTerm(cli *clientv3.Client, key string, rev int64, done <-chan struct{}) *Term {
	return &Term{cli: cli, key: key, rev: rev, done: done}
}

// Done is closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.done }

// Guard is the comparison that holds only while this term's election key is
// the one it campaigned with.
func (t *Term) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)
}

// Txn commits If(cmps).Then(then).Else(els) only while the term holds. It
// returns the inner transaction's response, or ErrNotLeader.
func (t *Term) Txn(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := t.cli.Txn(ctx).
		If(t.Guard()).
		Then(clientv3.OpTxn(cmps, then, els)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("leader: txn: %w", err)
	}
	if !resp.Succeeded {
		return nil, ErrNotLeader
	}
	inner := resp.Responses[0].GetResponseTxn()
	// etcd fills in only the outer response's header: the caller learns
	// the revision its write made from that one.
	inner.Header = resp.Header
	return (*clientv3.TxnResponse)(inner), nil
}

// Gate tells request handlers whether this controller leads, and where the
// leader is when it does not.
type Gate struct {
	cli    *clientv3.Client
	prefix string

	mu   sync.Mutex
	term *Term
}

// NewGate returns a gate for the election at prefix.
func NewGate(cli *clientv3.Client, prefix string) *Gate {
	return &Gate{cli: cli, prefix: prefix}
}

// Set installs the current term (nil when not leading).
func (g *Gate) Set(t *Term) {
	g.mu.Lock()
	g.term = t
	g.mu.Unlock()
}

// Term returns the current term, or nil when this controller does not lead.
func (g *Gate) Term() *Term {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.term != nil {
		select {
		case <-g.term.done:
			return nil
		default:
		}
	}
	return g.term
}

// LeaderAddr reads the leader's advertise address, the value of the oldest
// key in the election ("" when nobody leads).
func (g *Gate) LeaderAddr(ctx context.Context) (string, error) {
	resp, err := g.cli.Get(ctx, g.prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("leader: read election: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
