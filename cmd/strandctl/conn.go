package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// endpoints says where the cluster is: --controller/--broker (or their
// environment variables) when given, else DIR/cluster.json of a dev cluster.
func (e *env) endpoints() (controller string, brokers []string, err error) {
	cfg, err := e.cluster()
	return cfg.Controller, cfg.Brokers, err
}

// cluster is the client configuration of the cluster: endpoints as
// endpoints says, and TLS from --certs-dir, else from a secure dev
// cluster's cluster.json, else none.
func (e *env) cluster() (client.Config, error) {
	var cfg client.Config
	if e.g.controller != "" || e.g.broker != "" {
		cfg = client.Config{Controller: e.g.controller, Brokers: splitList(e.g.broker)}
	} else {
		// A cluster.json whose dev process is gone fails at once, rather than
		// every call waiting out its deadline on ports nobody serves.
		if _, err := devcluster.ReadRunning(e.g.dataDir); err != nil && !errors.Is(err, devcluster.ErrNoCluster) {
			return client.Config{}, err
		}
		var err error
		cfg, err = client.DevClusterConfig(e.g.dataDir)
		if errors.Is(err, client.ErrNoDevCluster) {
			return client.Config{}, fmt.Errorf("no cluster to talk to: pass --controller/--broker, set STRAND_CONTROLLER/STRAND_BROKER, or run `strandctl dev` (%w)", err)
		}
		if err != nil {
			return client.Config{}, err
		}
	}
	if e.g.certsDir != "" {
		r, err := tlsconfig.New(tlsconfig.ClientFiles(e.g.certsDir, e.g.user))
		if err != nil {
			return client.Config{}, fmt.Errorf("--certs-dir: %w", err)
		}
		cfg.TLS = r.ClientConfig()
	}
	return cfg, nil
}

// splitList splits a comma-separated flag into its non-empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// client builds a client for the cluster.
func (e *env) client(cfg client.Config) (*client.Client, error) {
	cl, err := e.cluster()
	if err != nil {
		return nil, err
	}
	cfg.Controller, cfg.Brokers, cfg.TLS = cl.Controller, cl.Brokers, cl.TLS
	if cfg.Token == "" {
		cfg.Token = e.g.token
	}
	return client.New(cfg)
}

// admin builds a client for admin commands, which need the controller.
func (e *env) admin() (*client.Client, error) {
	c, err := e.client(client.Config{})
	if err != nil {
		return nil, err
	}
	if controller, _, _ := e.endpoints(); controller == "" {
		return nil, errors.New("no controller address: pass --controller or set STRAND_CONTROLLER")
	}
	return c, nil
}

// adminCall makes one AdminService call on the controller leader within the
// command's timeout; rpc is the method, e.g.
// strandv1connect.AdminServiceClient.GetStream.
func adminCall[Req, Res any](ctx context.Context, e *env,
	rpc func(strandv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req,
) (*Res, error) {
	c, err := e.admin()
	if err != nil {
		return nil, err
	}
	ctx, cancel := e.withTimeout(ctx)
	defer cancel()
	res, err := rpc(c.Admin(), ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}
