package admin

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcerr"
)

// The token and permission calls (docs/operating.md, "Security"). They
// write only under <prefix>/auth/, through the leader's term like every
// other admin write, so a deposed leader changes nothing; the brokers'
// and controllers' credential caches pick the change up from their watch.
// They work whether or not the cluster checks credentials yet, so tokens
// and grants can be made while a cluster still runs --insecure.

// authStore returns the store writing through the current term, or the
// Unavailable a non-leader answers.
func (s *Service) authStore(ctx context.Context) (*auth.Store, error) {
	term := s.gate.Term()
	if term == nil {
		addr, err := s.gate.LeaderAddr(ctx)
		if err != nil {
			addr = ""
		}
		return nil, rpcerr.NotLeader(addr)
	}
	if s.kv == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this controller keeps no credentials"))
	}
	return &auth.Store{KV: s.kv, Schema: s.schema, Txn: term.Txn, Now: s.now}, nil
}

// authCall admits a call and hands it the store.
func (s *Service) authCall(ctx context.Context, fn func(*auth.Store) error) error {
	release, err := s.admit(ctx)
	if err != nil {
		return err
	}
	defer release()
	st, err := s.authStore(ctx)
	if err != nil {
		return err
	}
	if err := fn(st); err != nil {
		return s.toConnect(err)
	}
	return nil
}

func validPrincipal(field, p string) error {
	if err := auth.ValidatePrincipal(p); err != nil {
		return rpcerr.InvalidArgument(field, "%v", err)
	}
	return nil
}

func validGrant(principal, perm, streams string) (auth.Permission, error) {
	if err := validPrincipal("principal", principal); err != nil {
		return "", err
	}
	p, err := auth.ParsePermission(perm)
	if err != nil {
		return "", rpcerr.InvalidArgument("permission", "%v", err)
	}
	if err := auth.ValidatePattern(streams); err != nil {
		return "", rpcerr.InvalidArgument("streams", "%v", err)
	}
	return p, nil
}

func tokenToProto(t auth.TokenRecord) *strandv1.Token {
	return &strandv1.Token{Id: t.ID, Principal: t.Principal, Created: timestamppb.New(t.Created)}
}

func grantToProto(g auth.GrantRecord) *strandv1.Grant {
	return &strandv1.Grant{Principal: g.Principal, Permission: string(g.Permission), Streams: g.Streams, Created: timestamppb.New(g.Created)}
}

// CreateToken makes a token of the principal and answers its secret, the
// one time anything shows it.
func (s *Service) CreateToken(ctx context.Context, req *connect.Request[strandv1.CreateTokenRequest]) (*connect.Response[strandv1.CreateTokenResponse], error) {
	principal := req.Msg.GetPrincipal()
	if err := validPrincipal("principal", principal); err != nil {
		return nil, err
	}
	var out *strandv1.CreateTokenResponse
	err := s.authCall(ctx, func(st *auth.Store) error {
		rec, secret, err := st.CreateToken(ctx, principal)
		if err != nil {
			return err
		}
		s.log.Info().Str("principal", principal).Str("token_id", rec.ID).Msg("token created")
		out = &strandv1.CreateTokenResponse{Token: tokenToProto(rec), Secret: secret}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// RevokeToken deletes one token by id, or every token of a principal.
func (s *Service) RevokeToken(ctx context.Context, req *connect.Request[strandv1.RevokeTokenRequest]) (*connect.Response[strandv1.RevokeTokenResponse], error) {
	id, principal := req.Msg.GetId(), req.Msg.GetPrincipal()
	switch {
	case (id == "") == (principal == ""):
		return nil, rpcerr.InvalidArgument("id", "set exactly one of id and principal")
	case id != "":
		if err := auth.ValidateTokenID(id); err != nil {
			return nil, rpcerr.InvalidArgument("id", "%v", err)
		}
	default:
		if err := validPrincipal("principal", principal); err != nil {
			return nil, err
		}
	}
	out := &strandv1.RevokeTokenResponse{}
	err := s.authCall(ctx, func(st *auth.Store) error {
		gone, err := st.RevokeTokens(ctx, id, principal)
		if err != nil {
			return err
		}
		for _, t := range gone {
			s.log.Info().Str("principal", t.Principal).Str("token_id", t.ID).Msg("token revoked")
			out.Revoked = append(out.Revoked, tokenToProto(t))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// ListTokens lists tokens without their secrets, which nothing stores.
func (s *Service) ListTokens(ctx context.Context, req *connect.Request[strandv1.ListTokensRequest]) (*connect.Response[strandv1.ListTokensResponse], error) {
	principal := req.Msg.GetPrincipal()
	if principal != "" {
		if err := validPrincipal("principal", principal); err != nil {
			return nil, err
		}
	}
	out := &strandv1.ListTokensResponse{}
	err := s.authCall(ctx, func(st *auth.Store) error {
		all, err := st.Tokens(ctx, principal)
		for _, t := range all {
			out.Tokens = append(out.Tokens, tokenToProto(t))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// GrantPermission stores a grant (granting it again keeps the first).
func (s *Service) GrantPermission(ctx context.Context, req *connect.Request[strandv1.GrantPermissionRequest]) (*connect.Response[strandv1.GrantPermissionResponse], error) {
	m := req.Msg
	perm, err := validGrant(m.GetPrincipal(), m.GetPermission(), m.GetStreams())
	if err != nil {
		return nil, err
	}
	var out *strandv1.GrantPermissionResponse
	err = s.authCall(ctx, func(st *auth.Store) error {
		g, err := st.Grant(ctx, m.GetPrincipal(), perm, m.GetStreams())
		if err != nil {
			return err
		}
		s.log.Info().Str("principal", g.Principal).Str("permission", string(g.Permission)).Str(logging.Stream, g.Streams).Msg("permission granted")
		out = &strandv1.GrantPermissionResponse{Grant: grantToProto(g)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// RevokePermission deletes a grant; revoked says whether there was one.
func (s *Service) RevokePermission(ctx context.Context, req *connect.Request[strandv1.RevokePermissionRequest]) (*connect.Response[strandv1.RevokePermissionResponse], error) {
	m := req.Msg
	perm, err := validGrant(m.GetPrincipal(), m.GetPermission(), m.GetStreams())
	if err != nil {
		return nil, err
	}
	out := &strandv1.RevokePermissionResponse{}
	err = s.authCall(ctx, func(st *auth.Store) error {
		ok, err := st.Revoke(ctx, m.GetPrincipal(), perm, m.GetStreams())
		if ok {
			s.log.Info().Str("principal", m.GetPrincipal()).Str("permission", string(perm)).Str(logging.Stream, m.GetStreams()).Msg("permission revoked")
		}
		out.Revoked = ok
		return err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// ListPermissions lists grants.
func (s *Service) ListPermissions(ctx context.Context, req *connect.Request[strandv1.ListPermissionsRequest]) (*connect.Response[strandv1.ListPermissionsResponse], error) {
	principal := req.Msg.GetPrincipal()
	if principal != "" {
		if err := validPrincipal("principal", principal); err != nil {
			return nil, err
		}
	}
	out := &strandv1.ListPermissionsResponse{}
	err := s.authCall(ctx, func(st *auth.Store) error {
		all, err := st.Grants(ctx, principal)
		for _, g := range all {
			out.Grants = append(out.Grants, grantToProto(g))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}
