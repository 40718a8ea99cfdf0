package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/etcdcfg"
)

func devCommand() *command {
	var (
		brokers  int
		portBase int
		binDir   string
		etcdOpts = etcdcfg.Defaults()
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
			if err := etcdOpts.Validate("etcd-"); err != nil {
				return usagef("%v", err)
			}
			fmt.Fprintf(e.stderr, "dev: starting etcd, controller, recoverer and %d brokers in %s\n", brokers, e.g.dataDir)
			c, err := devcluster.Start(ctx, devcluster.Options{
				Dir: e.g.dataDir, Brokers: brokers, PortBase: portBase, BinDir: binDir, Log: e.stderr, Etcd: etcdOpts,
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
	fmt.Fprintf(w, "logs in %s; endpoints in %s\n", filepath.Join(c.Dir(), "logs"), filepath.Join(c.Dir(), devcluster.InfoFile))
	dirFlag := ""
	if e.g.dataDir != devcluster.DefaultDir && filepath.Clean(e.g.dataDir) != devcluster.DefaultDir {
		dirFlag = " --data-dir " + e.g.dataDir
	}
	fmt.Fprintf(w, "try: strandctl stream create demo --copies %d%s && strandctl publish demo hello%s && strandctl read demo --from 0%s\n",
		min(3, brokers), dirFlag, dirFlag, dirFlag)
	fmt.Fprintln(w, "Ctrl-C stops the cluster.")
}
