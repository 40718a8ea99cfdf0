package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// authCommands manage bearer tokens and permissions (docs/operating.md,
// "Security"). Every one but `token create --bootstrap` goes through the
// controller and needs a token with admin on "*" (--token).
func authCommands() []*command {
	var (
		bootstrap bool
		etcd      string
		prefix    string
		principal string
		etcdTLS   tlsconfig.Files
	)
	// etcdFlags are the flags of the commands that write straight to
	// etcd: the first admin, which no one can create through the
	// controller.
	etcdFlags := func(fs *flag.FlagSet, with string) {
		fs.StringVar(&etcd, "etcd", "http://127.0.0.1:2379", with+"etcd endpoints, comma separated")
		fs.StringVar(&prefix, "prefix", cluster.DefaultPrefix, with+"etcd key prefix")
		fs.StringVar(&etcdTLS.CAFile, "etcd-cacert", "", with+"CA bundle of the etcd servers (for https:// endpoints)")
		fs.StringVar(&etcdTLS.CertFile, "etcd-cert", "", with+"client certificate for etcd")
		fs.StringVar(&etcdTLS.KeyFile, "etcd-key", "", with+"client key for etcd")
	}
	return []*command{
		{
			name: "token create", args: "PRINCIPAL", summary: "make a bearer token for PRINCIPAL (its secret is shown once)",
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&bootstrap, "bootstrap", false, "write the token, and admin on \"*\" for PRINCIPAL, straight to etcd: the cluster's first admin")
				etcdFlags(fs, "with --bootstrap: ")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "PRINCIPAL"); err != nil {
					return err
				}
				if err := auth.ValidatePrincipal(args[0]); err != nil {
					return usagef("%v", err)
				}
				var res *strandv1.CreateTokenResponse
				if bootstrap {
					r, err := bootstrapToken(ctx, e, etcd, etcdTLS, prefix, args[0])
					if err != nil {
						return err
					}
					res = r
				} else {
					r, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.CreateToken, &strandv1.CreateTokenRequest{Principal: args[0]})
					if err != nil {
						return err
					}
					res = r
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				fmt.Fprintf(e.stdout, "token %s for %s:\n%s\n", res.GetToken().GetId(), res.GetToken().GetPrincipal(), res.GetSecret())
				fmt.Fprintln(e.stderr, "the secret above is shown once and stored nowhere; pass it as --token or STRAND_TOKEN")
				return nil
			},
		},
		{
			name: "token revoke", args: "[ID]", summary: "revoke a token by id, or every token of --principal",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&principal, "principal", "", "revoke every token of this principal instead of one by id")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 1, "ID, or --principal P"); err != nil {
					return err
				}
				req := &strandv1.RevokeTokenRequest{Principal: principal}
				if len(args) == 1 {
					req.Id = args[0]
				}
				if (req.Id == "") == (req.Principal == "") {
					return usagef("give a token ID or --principal P, not both")
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.RevokeToken, req)
				if err != nil {
					return err
				}
				if e.g.json {
					return printEach(e.stdout, res.GetRevoked())
				}
				if len(res.GetRevoked()) == 0 {
					return errors.New("no token matched; nothing revoked")
				}
				for _, t := range res.GetRevoked() {
					fmt.Fprintf(e.stdout, "revoked token %s of %s\n", t.GetId(), t.GetPrincipal())
				}
				return nil
			},
		},
		{
			name: "token list", args: "[PRINCIPAL]", summary: "list tokens (ids and principals, never secrets)",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 1, "[PRINCIPAL]"); err != nil {
					return err
				}
				req := &strandv1.ListTokensRequest{}
				if len(args) == 1 {
					req.Principal = args[0]
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListTokens, req)
				if err != nil {
					return err
				}
				if e.g.json {
					return printEach(e.stdout, res.GetTokens())
				}
				t := newTable(e.stdout, "ID", "PRINCIPAL", "CREATED")
				for _, tok := range res.GetTokens() {
					t.row(tok.GetId(), tok.GetPrincipal(), created(tok.GetCreated()))
				}
				t.flush()
				return nil
			},
		},
		{
			name: "acl grant", args: "PRINCIPAL PERMISSION STREAMS", summary: "grant publish, read or admin on a stream, a prefix (orders.*) or * (every stream)",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 3, 3, "PRINCIPAL PERMISSION STREAMS"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.GrantPermission,
					&strandv1.GrantPermissionRequest{Principal: args[0], Permission: args[1], Streams: args[2]})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res.GetGrant())
				}
				g := res.GetGrant()
				fmt.Fprintf(e.stdout, "granted %s %s on %s\n", g.GetPrincipal(), g.GetPermission(), g.GetStreams())
				return nil
			},
		},
		{
			name: "acl revoke", args: "PRINCIPAL PERMISSION STREAMS", summary: "revoke a grant made with acl grant",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 3, 3, "PRINCIPAL PERMISSION STREAMS"); err != nil {
					return err
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.RevokePermission,
					&strandv1.RevokePermissionRequest{Principal: args[0], Permission: args[1], Streams: args[2]})
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				if !res.GetRevoked() {
					return fmt.Errorf("%s has no %s grant on %s; nothing revoked", args[0], args[1], args[2])
				}
				fmt.Fprintf(e.stdout, "revoked %s %s on %s\n", args[0], args[1], args[2])
				return nil
			},
		},
		{
			name: "acl bootstrap", args: "PRINCIPAL", summary: "grant PRINCIPAL admin on * straight in etcd: the first admin, calling with its client certificate (no token)",
			flags: func(fs *flag.FlagSet) { etcdFlags(fs, "") },
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "PRINCIPAL"); err != nil {
					return err
				}
				if err := auth.ValidatePrincipal(args[0]); err != nil {
					return usagef("%v", err)
				}
				cli, err := etcdClient(etcd, etcdTLS)
				if err != nil {
					return err
				}
				defer func() { _ = cli.Close() }()
				ctx, cancel := e.withTimeout(ctx)
				defer cancel()
				st := &auth.Store{KV: cli, Schema: cluster.NewSchema(prefix), Txn: auth.PlainTxn(cli)}
				g, err := st.BootstrapPrincipal(ctx, args[0])
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, &strandv1.Grant{Principal: g.Principal, Permission: string(g.Permission), Streams: g.Streams, Created: timestamppb.New(g.Created)})
				}
				fmt.Fprintf(e.stdout, "granted %s %s on %s\n", g.Principal, g.Permission, g.Streams)
				return nil
			},
		},
		{
			name: "acl list", args: "[PRINCIPAL]", summary: "list grants",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 1, "[PRINCIPAL]"); err != nil {
					return err
				}
				req := &strandv1.ListPermissionsRequest{}
				if len(args) == 1 {
					req.Principal = args[0]
				}
				res, err := adminCall(ctx, e, strandv1connect.AdminServiceClient.ListPermissions, req)
				if err != nil {
					return err
				}
				if e.g.json {
					return printEach(e.stdout, res.GetGrants())
				}
				t := newTable(e.stdout, "PRINCIPAL", "PERMISSION", "STREAMS", "CREATED")
				for _, g := range res.GetGrants() {
					t.row(g.GetPrincipal(), g.GetPermission(), g.GetStreams(), created(g.GetCreated()))
				}
				t.flush()
				return nil
			},
		},
	}
}

func created(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Local().Format(time.DateTime)
}

// bootstrapToken writes the first admin straight to etcd: no principal
// can call the controller's CreateToken before one exists. It refuses once
// someone holds admin on "*" (auth.Store.Bootstrap).
func bootstrapToken(ctx context.Context, e *env, endpoints string, files tlsconfig.Files, prefix, principal string) (*strandv1.CreateTokenResponse, error) {
	cli, err := etcdClient(endpoints, files)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := e.withTimeout(ctx)
	defer cancel()
	st := &auth.Store{KV: cli, Schema: cluster.NewSchema(prefix), Txn: auth.PlainTxn(cli)}
	rec, secret, err := st.Bootstrap(ctx, principal)
	if err != nil {
		return nil, err
	}
	return &strandv1.CreateTokenResponse{Token: &strandv1.Token{Id: rec.ID, Principal: rec.Principal, Created: timestamppb.New(rec.Created)}, Secret: secret}, nil
}

// etcdClient is a client of etcd at endpoints, with TLS when files name a
// CA (a secure cluster's etcd wants a client certificate the CA signed).
func etcdClient(endpoints string, files tlsconfig.Files) (*clientv3.Client, error) {
	var cfg *tls.Config
	if files.CAFile != "" || files.CertFile != "" {
		c, err := etcdcfg.FilesTLS(files)
		if err != nil {
			return nil, usagef("--etcd-cacert, --etcd-cert, --etcd-key: %v", err)
		}
		cfg = c
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: splitList(endpoints), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: cfg})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return cli, nil
}
