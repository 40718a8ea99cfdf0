package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// tourStep is what one command of the README's tour must do: exit 0 and
// print what the README says it prints. A long-running command (the live
// tail) runs until its stdout holds until, then gets SIGINT, as a user's
// Ctrl-C, and must still exit 0.
//
// before, when set, waits for what a user typing the tour by hand would
// have waited for without noticing, given the dev cluster's data dir.
type tourStep struct {
	before func(t *testing.T, dir string)
	until  string
	check  func(stdout, stderr string) error
}

// tourSteps are keyed by the command exactly as the README writes it
// (continuation lines joined, the trailing comment kept). A command added
// to the tour without a step here, or a step whose command left the tour,
// fails the test, so the two cannot drift apart.
var tourSteps = map[string]tourStep{
	"bin/strandctl brokers": {check: func(out, _ string) error {
		for i := 1; i <= 3; i++ {
			if !regexp.MustCompile(`(?m)^` + devcluster.BrokerNode(i) + `\s+127\.0\.0\.1:\d+\s+\S+\s+yes\s`).MatchString(out) {
				return fmt.Errorf("no live %s row", devcluster.BrokerNode(i))
			}
		}
		return nil
	}},
	"bin/strandctl stream create orders --copies 3 --policy majority_durable": {check: contains(
		"created stream orders: copies 3, policy majority_durable, epoch 1")},
	"bin/strandctl publish orders first second third": {check: contains("published 3 records at offsets 0..2")},
	"seq 1 1000 | bin/strandctl publish orders": {check: func(out, errOut string) error {
		if !strings.Contains(errOut, "published 1000 records") {
			return errors.New(`stderr lacks "published 1000 records"`)
		}
		if !strings.Contains(out, "..1002\n") {
			return errors.New("the last batch does not end at offset 1002")
		}
		return nil
	}},
	"bin/strandctl read orders --from 0 --max 5": {check: lines(
		`^OFFSET\s+PAYLOAD$`, `^0\s+first$`, `^1\s+second$`, `^2\s+third$`, `^3\s+1$`, `^4\s+2$`)},
	"bin/strandctl subscribe orders --from earliest": {until: "1002\t1000\n", check: func(out, _ string) error {
		if !strings.HasPrefix(out, "0\tfirst\n") {
			return errors.New("the subscription does not start at offset 0")
		}
		if n := strings.Count(out, "\n"); n != 1003 {
			return fmt.Errorf("%d records, want 1003", n)
		}
		return nil
	}},
	`bin/strandctl cursor commit orders billing 3`: {check: contains("cursor billing of orders at 3 ")},
	"bin/strandctl cursor get orders billing":      {check: lines(`^3$`)},
	"bin/strandctl subscribe orders --cursor billing": {until: "1002\t1000\n", check: func(out, _ string) error {
		if !strings.HasPrefix(out, "3\t1\n") {
			return errors.New("the subscription does not resume at the cursor's offset 3")
		}
		return nil
	}},
	"bin/strandctl stream get orders": {before: func(t *testing.T, dir string) {
		// The copies' tails come from their brokers' heartbeats, one a
		// second; the tour can reach this line sooner than that.
		clustertest.Eventually(t, 30*time.Second, "every copy's heartbeat at record tail 1003", func() bool {
			r := ctl(t, dir, "", "stream", "get", "orders", "--json")
			return r.code == 0 && strings.Count(r.stdout, `"record_tail":"1003"`) == 3
		})
	}, check: func(out, _ string) error {
		if !regexp.MustCompile(`(?m)^assignment epoch 1\s+owner broker-\d\s+followers broker-\d,broker-\d\s+policy majority_durable$`).MatchString(out) {
			return errors.New("no assignment line with an owner, two followers and the policy")
		}
		if n := len(regexp.MustCompile(`(?m)^broker-\d\s+(owner|follower)\s+yes\s+1\s+1003\s`).FindAllString(out, -1)); n != 3 {
			return fmt.Errorf("%d live copies at record tail 1003, want 3", n)
		}
		return nil
	}},
	"go tool etcdctl get --prefix /strand/assignments/": {check: lines(`^/strand/assignments/orders$`, `^\{"stream":"orders","epoch":1,"owner":"broker-\d"`)},
	`curl -s -H 'Content-Type: application/json' -d '{"stream":"orders","fromOffset":"0","maxRecords":2}' http://127.0.0.1:2390/strand.v1.StreamService/Read`: {
		// protojson: payloads in base64 ("first", "second"), 64-bit numbers
		// as strings, and zero values left out (offset 0). Its spacing is
		// randomised on purpose, so the answer is decoded, not compared.
		check: func(out, _ string) error {
			var resp struct {
				Records []struct {
					Offset  *string `json:"offset"`
					Epoch   string  `json:"epoch"`
					Payload string  `json:"payload"`
				} `json:"records"`
				NextOffset string `json:"nextOffset"`
			}
			if err := json.Unmarshal([]byte(out), &resp); err != nil {
				return fmt.Errorf("not JSON: %v", err)
			}
			if len(resp.Records) != 2 || resp.NextOffset != "2" {
				return fmt.Errorf("%d records, next offset %q; want 2 records, next offset 2", len(resp.Records), resp.NextOffset)
			}
			r0, r1 := resp.Records[0], resp.Records[1]
			if r0.Offset != nil || r0.Epoch != "1" || r0.Payload != "Zmlyc3Q=" {
				return fmt.Errorf("first record %+v, want offset left out (0), epoch 1, payload first", r0)
			}
			if r1.Offset == nil || *r1.Offset != "1" || r1.Epoch != "1" || r1.Payload != "c2Vjb25k" {
				return fmt.Errorf("second record %+v, want offset 1, epoch 1, payload second", r1)
			}
			return nil
		}},
	`curl -s http://127.0.0.1:2390/metrics | grep '^strand_broker_commit_sync_seconds_count'`: {check: lines(`^strand_broker_commit_sync_seconds_count [1-9]`)},
	"go tool grpcurl -plaintext 127.0.0.1:2390 list":                                          {check: contains("strand.v1.ReplicationService\n", "strand.v1.StreamService\n")},
	"bin/strandctl dev stop broker-1":                                                         {check: contains("broker-1")},
	// Whether or not broker-1 owned the stream, the publish confirms: the
	// client rides through the failover its stop made.
	"bin/strandctl publish orders after-stop": {check: lines(`^published at offset 1003$`)},
	"bin/strandctl dev start broker-1":        {check: contains("broker-1")},
}

func contains(want ...string) func(string, string) error {
	return func(out, _ string) error {
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("stdout lacks %q", w)
			}
		}
		return nil
	}
}

// lines checks that stdout's lines match the patterns, one each, in order.
func lines(patterns ...string) func(string, string) error {
	return func(out, _ string) error {
		got := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(got) != len(patterns) {
			return fmt.Errorf("%d lines, want %d", len(got), len(patterns))
		}
		for i, p := range patterns {
			if !regexp.MustCompile(p).MatchString(got[i]) {
				return fmt.Errorf("line %d %q does not match %s", i+1, got[i], p)
			}
		}
		return nil
	}
}

// readmeTour returns the commands of the README's tour: the first sh block
// after the "## A five-minute tour" heading, one command per line, with
// backslash continuations joined and trailing comments dropped.
func readmeTour(t *testing.T, readme string) []string {
	t.Helper()
	_, after, ok := strings.Cut(readme, "\n## A five-minute tour\n")
	if !ok {
		t.Fatal(`README.md has no "## A five-minute tour" section`)
	}
	_, after, ok = strings.Cut(after, "\n```sh\n")
	if !ok {
		t.Fatal("the tour has no ```sh block")
	}
	block, _, ok := strings.Cut(after, "\n```\n")
	if !ok {
		t.Fatal("the tour's sh block does not end")
	}
	var cmds []string
	cur := ""
	for _, line := range strings.Split(block, "\n") {
		if c, ok := strings.CutSuffix(line, `\`); ok {
			cur += strings.TrimSpace(c) + " "
			continue
		}
		cmds = append(cmds, stripComment(cur+strings.TrimSpace(line)))
		cur = ""
	}
	return cmds
}

// stripComment drops a trailing "  # ..." comment outside quotes.
func stripComment(cmd string) string {
	quote := byte(0)
	for i := 0; i < len(cmd); i++ {
		switch c := cmd[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && i > 0 && cmd[i-1] == ' ':
			return strings.TrimSpace(cmd[:i])
		}
	}
	return strings.TrimSpace(cmd)
}

func TestReadmeTourCommands(t *testing.T) {
	cmds := readmeTour(t, "x\n## A five-minute tour\ntext\n```sh\n"+
		"a --x 1                # a comment\n"+
		"curl -d '{\"k\":\"#v\"}' \\\n  http://h/p   # joined\n"+
		"seq 3 | b\n```\n## next\n```sh\nnot this\n```\n")
	want := []string{"a --x 1", `curl -d '{"k":"#v"}' http://h/p`, "seq 3 | b"}
	if strings.Join(cmds, "\n") != strings.Join(want, "\n") {
		t.Fatalf("readmeTour = %q, want %q", cmds, want)
	}
}

// TestReadmeTour runs the README's tour as a user would after `make run`,
// against a dev cluster of its own started by `strandctl dev` on a free
// port base.
//
// The commands run with bash from a directory that stands in for the
// checkout: bin/ holds the binaries TestMain built, .strand/ the dev
// cluster (so `bin/strandctl` finds it through .strand/cluster.json, as in
// the README), and go.mod, go.sum and third_party/ link to the
// repository's so that `go tool etcdctl` runs the pinned etcdctl.
//
// The README uses `make run`'s ports. The test maps them onto its own
// cluster: every 127.0.0.1:PORT of a service in cluster.json is written at
// the default port base (2379) in the README, so the command's
// 127.0.0.1:(PORT - base + 2379) becomes 127.0.0.1:PORT; etcdctl, which the
// README runs without flags against 2379, gets ETCDCTL_ENDPOINTS.
func TestReadmeTour(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeTour(t, string(readme))
	seen := map[string]bool{}
	for _, c := range cmds {
		if _, ok := tourSteps[c]; !ok {
			t.Errorf("the README's tour runs %q, which the test has no step for", c)
		}
		seen[c] = true
	}
	for c := range tourSteps {
		if !seen[c] {
			t.Errorf("the test has a step for %q, which the README's tour no longer runs", c)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	runReadmeTour(t, root, cmds)
}

// TestReadmeTourSecure runs every strandctl command of the README's tour,
// in order, against `strandctl dev --secure`: TLS and authentication on,
// and still no flags, as the admin certificate's principal (dev
// bootstrapped its admin grant). The tour's curl, grpcurl and etcdctl
// lines are the insecure cluster's, and are left out.
func TestReadmeTourSecure(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, c := range readmeTour(t, string(readme)) {
		if strings.HasPrefix(c, "bin/strandctl ") || strings.Contains(c, "| bin/strandctl ") {
			cmds = append(cmds, c)
		}
	}
	if len(cmds) < 10 {
		t.Fatalf("only %d strandctl commands in the README's tour: %q", len(cmds), cmds)
	}
	t.Logf("%d strandctl commands of the tour", len(cmds))
	runReadmeTour(t, root, cmds, "--secure")
}

// runReadmeTour runs cmds, each with its tourStep, against a dev cluster
// of three brokers started with devArgs.
func runReadmeTour(t *testing.T, root string, cmds []string, devArgs ...string) {
	t.Helper()
	work := t.TempDir()
	for _, l := range []struct{ name, target string }{
		{"bin", binDir},
		{"go.mod", filepath.Join(root, "go.mod")},
		{"go.sum", filepath.Join(root, "go.sum")},
		{"third_party", filepath.Join(root, "third_party")},
	} {
		target, err := filepath.Abs(l.target)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(work, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	const brokers = 3
	dir := filepath.Join(work, devcluster.DefaultDir)
	port := freePortBase(t, brokers)
	dev := startDev(t, dir, port, brokers, devArgs...)
	info, err := devcluster.ReadInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	ports := tourPorts(t, info, port)
	// `make run` prints its endpoints once every broker is up; a user starts
	// the tour after that, so the test waits for the same.
	clustertest.Eventually(t, 30*time.Second, "three live brokers", func() bool {
		r := ctl(t, dir, "", "brokers", "--json")
		return r.code == 0 && strings.Count(r.stdout, `"live":true`) == brokers
	})

	env := append(cleanEnv(), "ETCDCTL_ENDPOINTS="+info.Etcd[0])
	for _, readmeCmd := range cmds {
		step := tourSteps[readmeCmd]
		cmd := ports.Replace(readmeCmd)
		if step.before != nil {
			step.before(t, dir)
		}
		stdout, stderr, code := runTourCommand(t, work, env, cmd, step.until)
		if code != 0 {
			t.Fatalf("%s\n(run as %s): exit %d\nstdout:\n%s\nstderr:\n%s", readmeCmd, cmd, code, stdout, stderr)
		}
		if err := step.check(stdout, stderr); err != nil {
			t.Fatalf("%s\n(run as %s): %v\nstdout:\n%s\nstderr:\n%s", readmeCmd, cmd, err, stdout, stderr)
		}
	}
	dev.stop(t)
}

// tourPorts maps the addresses the README writes for `make run` (port base
// 2379) onto the test cluster's, from the addresses its cluster.json names.
func tourPorts(t *testing.T, info devcluster.Info, base int) *strings.Replacer {
	t.Helper()
	etcd := strings.TrimPrefix(strings.TrimPrefix(info.Etcd[0], "http://"), "https://")
	addrs := append([]string{etcd, info.Controller, info.Recoverer}, info.BrokerAddresses()...)
	var pairs []string
	for _, a := range addrs {
		host, p, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatalf("cluster.json address %q: %v", a, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("cluster.json address %q: %v", a, err)
		}
		pairs = append(pairs, net.JoinHostPort(host, strconv.Itoa(n-base+devcluster.DefaultPortBase)), a)
	}
	return strings.NewReplacer(pairs...)
}

// runTourCommand runs cmd with bash in dir. With until set it waits for
// stdout to hold it, then interrupts the command's process group as Ctrl-C
// would; every command is bounded in time.
func runTourCommand(t *testing.T, dir string, env []string, cmd, until string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Dir, c.Env = dir, env
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errb lockedBuffer
	c.Stdout, c.Stderr = &out, &errb
	if until == "" {
		err := c.Run()
		return out.String(), errb.String(), exitCode(t, cmd, err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = c.Wait()
		close(done)
	}()
	// A failure below must not leave the command running.
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	clustertest.Eventually(t, time.Minute, fmt.Sprintf("%s to print %q", cmd, until), func() bool {
		select {
		case <-done:
			t.Fatalf("%s ended before printing %q: %v\nstdout:\n%s\nstderr:\n%s", cmd, until, waitErr, out.String(), errb.String())
		default:
		}
		return strings.Contains(out.String(), until)
	})
	if err := syscall.Kill(-c.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30s of SIGINT\nstdout:\n%s", cmd, out.String())
	}
	return out.String(), errb.String(), exitCode(t, cmd, waitErr)
}

func exitCode(t *testing.T, cmd string, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("%s: %v", cmd, err)
	return 0
}
