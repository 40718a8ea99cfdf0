package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// Txn commits one etcd transaction. The controller passes its term's
// (leader.Term.Txn), so a deposed leader writes nothing; the bootstrap
// (strandctl token create --bootstrap) passes a plain one (PlainTxn).
type Txn func(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error)

// PlainTxn is Txn on kv without a guard of its own.
func PlainTxn(kv clientv3.KV) Txn {
	return func(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
		return kv.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	}
}

// ErrNotCommitted is returned when a guarded write did not commit (the
// guard failed: another write raced it, or the leader lost its term).
var ErrNotCommitted = errors.New("auth: write did not commit; retry")

// ErrBootstrapped is returned by Bootstrap when a principal already holds
// admin on "*": the cluster has an admin, who creates tokens through the
// controller.
var ErrBootstrapped = errors.New("auth: the cluster already has an admin on \"*\"; create tokens with an admin token instead of --bootstrap")

// Store reads and writes tokens and grants in etcd.
type Store struct {
	KV     clientv3.KV
	Schema cluster.Schema
	Txn    Txn
	// Now defaults to time.Now.
	Now func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// CreateToken stores a new token of principal and returns it with its
// secret, which nothing stores.
func (s *Store) CreateToken(ctx context.Context, principal string) (TokenRecord, string, error) {
	op, rec, secret, err := s.tokenOp(principal)
	if err != nil {
		return TokenRecord{}, "", err
	}
	resp, err := s.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.Schema.TokenKey(rec.ID)), "=", 0)}, []clientv3.Op{op}, nil)
	if err != nil {
		return TokenRecord{}, "", err
	}
	if !resp.Succeeded {
		return TokenRecord{}, "", ErrNotCommitted
	}
	return rec, secret, nil
}

func (s *Store) tokenOp(principal string) (clientv3.Op, TokenRecord, string, error) {
	if err := ValidatePrincipal(principal); err != nil {
		return clientv3.Op{}, TokenRecord{}, "", err
	}
	secret, err := NewSecret()
	if err != nil {
		return clientv3.Op{}, TokenRecord{}, "", err
	}
	hash := HashSecret(secret)
	rec := TokenRecord{ID: TokenID(hash), Principal: principal, SHA256: hash, Created: s.now()}
	return clientv3.OpPut(s.Schema.TokenKey(rec.ID), cluster.Encode(rec)), rec, secret, nil
}

// Bootstrap creates the first admin: a token of principal and a grant of
// admin on "*", in one transaction, written straight to etcd by someone who
// can write there (docs/operating.md, "Security"). It refuses once a
// principal holds admin on "*".
func (s *Store) Bootstrap(ctx context.Context, principal string) (TokenRecord, string, error) {
	grants, err := s.Grants(ctx, "")
	if err != nil {
		return TokenRecord{}, "", err
	}
	for _, g := range grants {
		if g.Permission == Admin && g.Streams == All {
			return TokenRecord{}, "", fmt.Errorf("%w (%s holds it)", ErrBootstrapped, g.Principal)
		}
	}
	op, rec, secret, err := s.tokenOp(principal)
	if err != nil {
		return TokenRecord{}, "", err
	}
	g := GrantRecord{Principal: principal, Permission: Admin, Streams: All, Created: rec.Created}
	resp, err := s.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.Schema.TokenKey(rec.ID)), "=", 0)},
		[]clientv3.Op{op, clientv3.OpPut(s.Schema.GrantKey(principal, string(Admin), All), cluster.Encode(g))}, nil)
	if err != nil {
		return TokenRecord{}, "", err
	}
	if !resp.Succeeded {
		return TokenRecord{}, "", ErrNotCommitted
	}
	return rec, secret, nil
}

// BootstrapPrincipal is Bootstrap for a principal that authenticates with a
// client certificate (strand://client/PRINCIPAL, CertPrincipal): it grants
// principal admin on "*" and creates no token. It refuses with
// ErrBootstrapped once another principal holds admin on "*", and keeps the
// grant (reporting it) when principal holds it already, so a dev cluster
// that starts again over its own data bootstraps again harmlessly.
func (s *Store) BootstrapPrincipal(ctx context.Context, principal string) (GrantRecord, error) {
	if err := ValidatePrincipal(principal); err != nil {
		return GrantRecord{}, err
	}
	grants, err := s.Grants(ctx, "")
	if err != nil {
		return GrantRecord{}, err
	}
	for _, g := range grants {
		if g.Permission == Admin && g.Streams == All && g.Principal != principal {
			return GrantRecord{}, fmt.Errorf("%w (%s holds it)", ErrBootstrapped, g.Principal)
		}
	}
	return s.Grant(ctx, principal, Admin, All)
}

// RevokeTokens deletes the token id, or every token of principal (exactly
// one of them non-empty), and returns those it deleted.
func (s *Store) RevokeTokens(ctx context.Context, id, principal string) ([]TokenRecord, error) {
	var victims []TokenRecord
	if id != "" {
		if err := ValidateTokenID(id); err != nil {
			return nil, err
		}
		resp, err := s.KV.Get(ctx, s.Schema.TokenKey(id))
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			rec, err := cluster.Decode[TokenRecord](kv.Value)
			if err != nil {
				// Deleted all the same: an unreadable token admits no one.
				rec = TokenRecord{ID: id}
			}
			victims = append(victims, rec)
		}
	} else {
		all, err := s.Tokens(ctx, principal)
		if err != nil {
			return nil, err
		}
		victims = all
	}
	if len(victims) == 0 {
		return nil, nil
	}
	ops := make([]clientv3.Op, 0, len(victims))
	for _, v := range victims {
		ops = append(ops, clientv3.OpDelete(s.Schema.TokenKey(v.ID)))
	}
	resp, err := s.Txn(ctx, nil, ops, nil)
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, ErrNotCommitted
	}
	var out []TokenRecord
	for i, r := range resp.Responses {
		if r.GetResponseDeleteRange().GetDeleted() > 0 {
			out = append(out, victims[i])
		}
	}
	return out, nil
}

// Tokens lists the tokens of principal (every token when empty), by id.
// Tokens that do not decode are left out.
func (s *Store) Tokens(ctx context.Context, principal string) ([]TokenRecord, error) {
	resp, err := s.KV.Get(ctx, s.Schema.TokensDir(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []TokenRecord
	for _, kv := range resp.Kvs {
		rec, err := cluster.Decode[TokenRecord](kv.Value)
		if err != nil || (principal != "" && rec.Principal != principal) {
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// Grant stores a grant; granting what is granted already keeps the first
// grant (and its time) and reports it.
func (s *Store) Grant(ctx context.Context, principal string, perm Permission, pattern string) (GrantRecord, error) {
	if err := validateGrant(principal, perm, pattern); err != nil {
		return GrantRecord{}, err
	}
	key := s.Schema.GrantKey(principal, string(perm), pattern)
	g := GrantRecord{Principal: principal, Permission: perm, Streams: pattern, Created: s.now()}
	resp, err := s.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(key, cluster.Encode(g))}, []clientv3.Op{clientv3.OpGet(key)})
	if err != nil {
		return GrantRecord{}, err
	}
	if resp.Succeeded {
		return g, nil
	}
	if len(resp.Responses) == 1 {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			if old, err := cluster.Decode[GrantRecord](kvs[0].Value); err == nil {
				return old, nil
			}
		}
	}
	// The else branch did not run: a guard of Txn's own (the leader's
	// term) failed.
	return GrantRecord{}, ErrNotCommitted
}

// Revoke deletes a grant and reports whether there was one.
func (s *Store) Revoke(ctx context.Context, principal string, perm Permission, pattern string) (bool, error) {
	if err := validateGrant(principal, perm, pattern); err != nil {
		return false, err
	}
	resp, err := s.Txn(ctx, nil, []clientv3.Op{clientv3.OpDelete(s.Schema.GrantKey(principal, string(perm), pattern))}, nil)
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		return false, ErrNotCommitted
	}
	return resp.Responses[0].GetResponseDeleteRange().GetDeleted() > 0, nil
}

// Grants lists the grants of principal (every grant when empty), ordered
// by principal, permission and streams.
func (s *Store) Grants(ctx context.Context, principal string) ([]GrantRecord, error) {
	dir := s.Schema.GrantsDir()
	if principal != "" {
		dir = s.Schema.PrincipalGrantsDir(principal)
	}
	resp, err := s.KV.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []GrantRecord
	for _, kv := range resp.Kvs {
		if g, err := cluster.Decode[GrantRecord](kv.Value); err == nil {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b GrantRecord) int {
		return strings.Compare(a.Principal+"/"+string(a.Permission)+"/"+a.Streams, b.Principal+"/"+string(b.Permission)+"/"+b.Streams)
	})
	return out, nil
}

func validateGrant(principal string, perm Permission, pattern string) error {
	if err := ValidatePrincipal(principal); err != nil {
		return err
	}
	if _, err := ParsePermission(string(perm)); err != nil {
		return err
	}
	return ValidatePattern(pattern)
}
