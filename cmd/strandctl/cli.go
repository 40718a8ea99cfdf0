package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// env is what a command runs with.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	g              globals
}

// globals are the flags every command takes.
type globals struct {
	controller string
	broker     string
	dataDir    string
	json       bool
	timeout    time.Duration
	token      string
	// certsDir and user dial a secure cluster with CERTS/ca.crt and
	// CERTS/client.USER.crt (strandctl cert); a secure dev cluster's
	// cluster.json names its own.
	certsDir string
	user     string
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.controller, "controller", os.Getenv("STRAND_CONTROLLER"), "controller address (env STRAND_CONTROLLER; default: from DIR/cluster.json)")
	fs.StringVar(&g.broker, "broker", os.Getenv("STRAND_BROKER"), "broker addresses, comma separated (env STRAND_BROKER; default: from DIR/cluster.json)")
	fs.StringVar(&g.dataDir, "data-dir", ".strand", "dev cluster data dir, where cluster.json is")
	fs.BoolVar(&g.json, "json", false, "machine output: protojson, one JSON object per line")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "deadline of a request, retries included")
	fs.StringVar(&g.token, "token", os.Getenv("STRAND_TOKEN"), "bearer token sent on every call (env STRAND_TOKEN; strandctl token create)")
	fs.StringVar(&g.certsDir, "certs-dir", os.Getenv("STRAND_CERTS_DIR"), "dial with TLS: ca.crt and client.USER.crt/.key of this dir (env STRAND_CERTS_DIR; default: a secure dev cluster's from cluster.json, else no TLS)")
	fs.StringVar(&g.user, "user", "admin", "client certificate of --certs-dir to present (client.USER.crt)")
}

// command is one strandctl subcommand.
type command struct {
	name    string
	args    string // positional arguments, for usage
	summary string
	flags   func(fs *flag.FlagSet) // the command's own flags
	run     func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) error
}

func commands() []*command {
	var cmds []*command
	cmds = append(cmds, devCommand())
	cmds = append(cmds, devControlCommands()...)
	cmds = append(cmds, certCommands()...)
	cmds = append(cmds, streamCommands()...)
	cmds = append(cmds, dataCommands()...)
	cmds = append(cmds, adminCommands()...)
	cmds = append(cmds, authCommands()...)
	cmds = append(cmds, benchCommand())
	return cmds
}

// run dispatches args to a command and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	cmds := commands()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(stdout, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	// Global flags may come before the command (`strandctl --json brokers`):
	// move them after it, where the command's flag set parses them.
	lead := flag.NewFlagSet("strandctl", flag.ContinueOnError)
	lead.SetOutput(io.Discard)
	var lg globals
	lg.register(lead)
	if err := lead.Parse(args); err != nil {
		fmt.Fprintf(stderr, "strandctl: %v\n", err)
		return 2
	}
	if n := len(args) - len(lead.Args()); n > 0 {
		args = append(slices.Clone(lead.Args()), args[:n]...)
		if len(lead.Args()) == 0 {
			printUsage(stderr, cmds)
			return 2
		}
	}
	cmd, rest := lookup(cmds, args)
	if cmd == nil {
		fmt.Fprintf(stderr, "strandctl: unknown command %q\n", strings.Join(args[:min(2, len(args))], " "))
		printUsage(stderr, cmds)
		return 2
	}
	fs := flag.NewFlagSet("strandctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.g.register(fs)
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	pos, err := parseInterspersed(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(stdout, cmd, fs)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "strandctl %s: %v\n", cmd.name, err)
		fmt.Fprintf(stderr, "run 'strandctl %s -h' for its flags\n", cmd.name)
		return 2
	}
	err = cmd.run(ctx, e, fs, pos)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "strandctl %s: %v\n", cmd.name, err)
		fmt.Fprintf(stderr, "usage: strandctl %s; run 'strandctl %s -h' for its flags\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.name)
		return 2
	default:
		fmt.Fprintf(stderr, "strandctl %s: %v\n", cmd.name, err)
		return 1
	}
}

// lookup finds the longest command name that prefixes args.
func lookup(cmds []*command, args []string) (*command, []string) {
	if len(args) >= 2 {
		for _, c := range cmds {
			if c.name == args[0]+" "+args[1] {
				return c, args[2:]
			}
		}
	}
	for _, c := range cmds {
		if c.name == args[0] {
			return c, args[1:]
		}
	}
	return nil, nil
}

// parseInterspersed parses flags anywhere among the positional arguments
// (`stream create demo --copies 3`); "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// fs.Parse stops at the first positional argument, or after "--".
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func printUsage(w io.Writer, cmds []*command) {
	fmt.Fprintln(w, "usage: strandctl COMMAND [ARGS] [FLAGS]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	sorted := append([]*command(nil), cmds...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, c := range sorted {
		fmt.Fprintf(w, "  %-40s %s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "global flags: --controller ADDR, --broker ADDR[,ADDR], --data-dir DIR (.strand), --json, --timeout D, --token T, --certs-dir DIR, --user NAME")
	fmt.Fprintln(w, "Without --controller/--broker (or STRAND_CONTROLLER/STRAND_BROKER), commands use DIR/cluster.json written by `strandctl dev`.")
	fmt.Fprintln(w, "`strandctl COMMAND -h` shows a command's flags.")
}

func printCommandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: strandctl %s [FLAGS]\n  %s\nflags:\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// needArgs checks the positional argument count.
func needArgs(args []string, min, max int, names string) error {
	if len(args) < min {
		return usagef("missing %s", names)
	}
	if max >= 0 && len(args) > max {
		return usagef("unexpected arguments %q (want %s)", args[max:], names)
	}
	return nil
}

// withTimeout bounds a request by --timeout.
func (e *env) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.g.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, e.g.timeout)
}
