package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/strandhq/strand/internal/tlsconfig"
)

// certCommands are `cert create-ca`, `cert create-node NODE` and `cert
// create-client PRINCIPAL`: PEM files, mode 0600, in a certs dir, as
// `cockroach cert` writes them (docs/operating.md, "Security").
func certCommands() []*command {
	var (
		dir, outDir string
		hosts       string
		lifetime    time.Duration
		overwrite   bool
	)
	common := func(fs *flag.FlagSet) {
		fs.StringVar(&dir, "dir", tlsconfig.DefaultDir, "certs dir: the CA's ca.crt and ca.key, and what is issued unless --out-dir")
		fs.DurationVar(&lifetime, "lifetime", 0, "validity (default: 10 years for the CA, 5 for a certificate; never past the CA's)")
		fs.BoolVar(&overwrite, "overwrite", false, "replace files that exist (a renewal: services read the new files at their next connection)")
	}
	issued := func(e *env, kind, name, certPath string, p tlsconfig.PEMPair) error {
		if e.g.json {
			return printJSON(e.stdout, map[string]string{"kind": kind, "name": name, "cert": certPath, "serial": p.Serial.String()})
		}
		_, err := fmt.Fprintf(e.stdout, "%s certificate for %s written to %s (serial %s)\n", kind, name, certPath, p.Serial)
		return err
	}
	return []*command{
		{
			name: "cert create-ca", summary: "make a CA: ca.crt and ca.key in --dir (keep ca.key off the nodes)",
			flags: common,
			run: func(_ context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 0, 0, "no arguments"); err != nil {
					return err
				}
				ca, err := tlsconfig.CreateCA(dir, lifetime, overwrite)
				if err != nil {
					return err
				}
				path := filepath.Join(dir, tlsconfig.CAFile)
				if e.g.json {
					return printJSON(e.stdout, map[string]string{"kind": "ca", "cert": path, "serial": ca.Cert.SerialNumber.String()})
				}
				_, err = fmt.Fprintf(e.stdout, "CA written to %s and %s\n", path, filepath.Join(dir, tlsconfig.CAKeyFile))
				return err
			},
		},
		{
			name: "cert create-node", args: "NODE",
			summary: "issue a node certificate (strand://node/NODE; server and client auth) for a broker, the controller or the recoverer: node.crt and node.key",
			flags: func(fs *flag.FlagSet) {
				common(fs)
				fs.StringVar(&outDir, "out-dir", "", "write node.crt, node.key and a copy of ca.crt here (default: --dir)")
				fs.StringVar(&hosts, "hosts", "localhost,127.0.0.1", "DNS names and IPs the node is reached at, comma separated")
			},
			run: func(_ context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NODE (the broker's --node, or the controller's or recoverer's --name)"); err != nil {
					return err
				}
				if err := tlsconfig.ValidateName(args[0]); err != nil {
					return usagef("NODE: %v", err)
				}
				p, err := tlsconfig.CreateNode(dir, outDir, args[0], splitList(hosts), lifetime, overwrite)
				if err != nil {
					return err
				}
				return issued(e, "node", args[0], filepath.Join(orDir(outDir, dir), tlsconfig.NodeCert), p)
			},
		},
		{
			name: "cert create-client", args: "PRINCIPAL",
			summary: "issue a client certificate (strand://client/PRINCIPAL; client auth): client.PRINCIPAL.crt and .key",
			flags: func(fs *flag.FlagSet) {
				common(fs)
				fs.StringVar(&outDir, "out-dir", "", "write the certificate, key and a copy of ca.crt here (default: --dir)")
			},
			run: func(_ context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "PRINCIPAL (strandctl --user, e.g. admin)"); err != nil {
					return err
				}
				if err := tlsconfig.ValidateName(args[0]); err != nil {
					return usagef("PRINCIPAL: %v", err)
				}
				p, err := tlsconfig.CreateClient(dir, outDir, args[0], lifetime, overwrite)
				if err != nil {
					return err
				}
				return issued(e, "client", args[0], filepath.Join(orDir(outDir, dir), tlsconfig.ClientCert(args[0])), p)
			},
		},
	}
}

func orDir(dir, def string) string {
	if dir == "" {
		return def
	}
	return dir
}
