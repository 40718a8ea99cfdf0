package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
)

func devCommand() *command {
	var (
		brokers  int
		portBase int
		binDir   string
		etcdOpts = etcdcfg.Defaults()
		restart  bool
		zones    string
		grace    time.Duration
		replace  time.Duration
		secure   bool
	)
	return &command{
		name: "dev", summary: "run a local cluster: embedded etcd, controller, recoverer and brokers as processes (Ctrl-C stops)",
		flags: func(fs *flag.FlagSet) {
			fs.IntVar(&brokers, "brokers", devcluster.DefaultBrokers, "number of brokers")
			fs.IntVar(&portBase, "port-base", devcluster.DefaultPortBase, "etcd on P, peer P+1, controller P+2, recoverer P+3, broker i on P+10+i")
			fs.StringVar(&binDir, "bin-dir", "", "where strand-broker, strand-controller and strand-recoverer are (default: next to strandctl, else PATH)")
			fs.StringVar(&etcdOpts.Mode, "etcd-auto-compaction-mode", etcdOpts.Mode, "embedded etcd's auto-compaction: periodic (retention is a duration) or revision (retention is a count of revisions); see docs/etcd.md")
			fs.StringVar(&etcdOpts.Retention, "etcd-auto-compaction-retention", etcdOpts.Retention, "history the embedded etcd keeps: a duration such as 5m (periodic) or a count such as 10000 (revision); 0 turns compaction off")
			fs.Int64Var(&etcdOpts.QuotaBytes, "etcd-quota-backend-bytes", etcdOpts.QuotaBytes, "embedded etcd's backend quota in bytes; past it etcd raises the NOSPACE alarm and refuses writes")
			fs.StringVar(&zones, "zones", "", "zones for the brokers, comma separated, given round-robin (--zones a,b,c: broker-1 in a, broker-2 in b, broker-3 in c, broker-4 in a); placement spreads each stream's copies over them. Empty: no zones")
			fs.DurationVar(&grace, "orphan-grace", 0, "the brokers' --orphan-grace: how long a copy no assignment includes is kept before it is deleted (0: the broker's default, 10m)")
			fs.DurationVar(&replace, "replace-after", 10*time.Minute, "the controller's --replace-after: how long a stream's copy may be missing before it is replaced on another broker (a stream that cannot confirm without it is replaced at once)")
			fs.BoolVar(&secure, "secure", false, "run with TLS: a CA, node certificates and an admin client certificate under DATA-DIR/certs (kept across starts), mutual TLS between the services, etcd on https; cluster.json names the admin's files, so strandctl needs no flags")
			fs.BoolVar(&restart, "restart", true, "restart a child that exits unexpectedly, after a back-off of 200ms doubling to 5s (--restart=false leaves it dead, e.g. to show a dead broker)")
		},
		run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
			if err := needArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			if brokers < 1 || brokers > 50 {
				return usagef("--brokers must be 1..50, got %d", brokers)
			}
			if portBase < 1024 || portBase+10+brokers > 65535 {
				return usagef("--port-base %d out of range", portBase)
			}
			if replace <= 0 {
				return usagef("--replace-after must be positive, got %s", replace)
			}
			if err := etcdOpts.Validate("etcd-"); err != nil {
				return usagef("%v", err)
			}
			zoneList, err := parseZones(zones)
			if err != nil {
				return err
			}
			if grace < 0 {
				return usagef("--orphan-grace must not be negative, got %v", grace)
			}
			var brokerArgs []string
			if grace > 0 {
				brokerArgs = append(brokerArgs, "--orphan-grace", grace.String())
			}
			fmt.Fprintf(e.stderr, "dev: starting etcd, controller, recoverer and %d brokers in %s\n", brokers, e.g.dataDir)
			if secure {
				fmt.Fprintf(e.stderr, "dev: secure: TLS everywhere, certificates in %s\n", filepath.Join(e.g.dataDir, devcluster.CertsDir))
			} else {
				fmt.Fprintln(e.stderr, "dev: insecure: no TLS, every service runs with --insecure (strandctl dev --secure runs with TLS)")
			}
			c, err := devcluster.Start(ctx, devcluster.Options{
				Dir: e.g.dataDir, Brokers: brokers, PortBase: portBase, BinDir: binDir, Log: e.stderr, Etcd: etcdOpts,
				Supervise: restart, Control: true, Zones: zoneList, BrokerArgs: brokerArgs, ReplaceAfter: replace, Secure: secure,
			})
			if err != nil {
				return err
			}
			info := c.Info()
			if e.g.json {
				_ = printJSON(e.stdout, info)
			} else {
				printDevInfo(e, c, info, brokers)
			}
			<-ctx.Done()
			fmt.Fprintln(e.stderr, "dev: stopping")
			if err := c.Close(); err != nil {
				return err
			}
			fmt.Fprintln(e.stderr, "dev: stopped; data kept in", c.Dir())
			return nil
		},
	}
}

// parseZones reads --zones: comma separated zone names, none empty.
func parseZones(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	zones := strings.Split(s, ",")
	for _, z := range zones {
		if z == "" {
			return nil, usagef("--zones %q: an empty zone name", s)
		}
		if err := cluster.ValidateZone(z); err != nil {
			return nil, usagef("--zones: %v", err)
		}
	}
	return zones, nil
}

func printDevInfo(e *env, c *devcluster.Cluster, info devcluster.Info, brokers int) {
	w := e.stdout
	fmt.Fprintf(w, "strand dev cluster is up (data in %s)\n", c.Dir())
	t := newTable(w, "  SERVICE", "ADDRESS", "PID")
	t.row("  etcd", info.Etcd[0], info.PID)
	t.row("  controller", info.Controller, info.ControllerPID)
	t.row("  recoverer", info.Recoverer, info.RecovererPID)
	for _, b := range info.Brokers {
		t.row("  "+b.Node, b.Address, b.PID)
	}
	t.flush()
	if info.TLS != nil {
		fmt.Fprintf(w, "logs in %s; endpoints in %s; TLS: CA %s, admin certificate %s\n", filepath.Join(c.Dir(), "logs"), filepath.Join(c.Dir(), devcluster.InfoFile), info.TLS.CA, info.TLS.Cert)
	} else {
		fmt.Fprintf(w, "logs in %s; endpoints in %s; peer token in %s\n", filepath.Join(c.Dir(), "logs"), filepath.Join(c.Dir(), devcluster.InfoFile), info.PeerTokenFile)
	}
	dirFlag := ""
	if e.g.dataDir != devcluster.DefaultDir && filepath.Clean(e.g.dataDir) != devcluster.DefaultDir {
		dirFlag = " --data-dir " + e.g.dataDir
	}
	fmt.Fprintf(w, "try: strandctl stream create demo --copies %d%s && strandctl publish demo hello%s && strandctl read demo --from 0%s\n",
		min(3, brokers), dirFlag, dirFlag, dirFlag)
	fmt.Fprintf(w, "strandctl dev stop NODE%s stops one (dev start NODE brings it back); Ctrl-C stops the cluster.\n", dirFlag)
}

// devControlCommands are `dev stop NODE` and `dev start NODE`: one child of
// the running dev cluster, through its control endpoint.
func devControlCommands() []*command {
	var cmds []*command
	for _, c := range []struct{ action, summary string }{
		{devcluster.ActionStop, "stop one child of the running dev cluster (SIGTERM: a broker revokes its lease, so its streams fail over now); it stays down until dev start"},
		{devcluster.ActionStart, "start a child of the running dev cluster that dev stop stopped (or that died), and wait until it is ready"},
	} {
		cmds = append(cmds, &command{
			name: "dev " + c.action, args: "NODE", summary: c.summary,
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NODE (controller, recoverer or broker-N)"); err != nil {
					return err
				}
				info, err := devcluster.ReadRunning(e.g.dataDir)
				if err != nil {
					return err
				}
				ctx, cancel := e.withTimeout(ctx)
				defer cancel()
				msg, err := devcluster.Control(ctx, info, c.action, args[0])
				if err != nil {
					return err
				}
				if e.g.json {
					return printJSON(e.stdout, map[string]string{"node": args[0], "action": c.action, "message": msg})
				}
				_, err = fmt.Fprintln(e.stdout, msg)
				return err
			},
		})
	}
	return cmds
}
