package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// The supervisor of `strandctl dev` and `dev stop|start NODE`, end to end:
// the real binaries TestMain built, each test on its own free port base.

// copyView is one copy of `stream get --json` (proto names; uint64 as
// strings, as protojson writes them).
type copyView struct {
	Node            string `json:"node"`
	Role            string `json:"role"`
	Epoch           string `json:"epoch"`
	RecordTail      string `json:"record_tail"`
	CursorEventTail string `json:"cursor_event_tail"`
	SealEpoch       string `json:"seal_epoch"`
	Live            bool   `json:"live"`
}

type streamStatus struct {
	streamView
	Copies []copyView `json:"copies"`
}

// getStream runs `stream get NAME --json`; an error while the cluster fails
// over is returned, not fatal.
func getStream(t *testing.T, dir, name string) (streamStatus, error) {
	t.Helper()
	r := ctl(t, dir, "", "stream", "get", name, "--json", "--timeout", "5s")
	var st streamStatus
	if r.code != 0 {
		return st, fmt.Errorf("stream get %s: exit %d: %s", name, r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		return st, fmt.Errorf("stream get %s --json: %w: %s", name, err, r.stdout)
	}
	return st, nil
}

func epochOf(t *testing.T, s streamStatus) uint64 {
	t.Helper()
	e, err := strconv.ParseUint(s.Assignment.Epoch, 10, 64)
	if err != nil {
		t.Fatalf("epoch %q: %v", s.Assignment.Epoch, err)
	}
	return e
}

func (s streamStatus) copyOf(node string) (copyView, bool) {
	for _, c := range s.Copies {
		if c.Node == node {
			return c, true
		}
	}
	return copyView{}, false
}

// inSync says why node's copy is not a follower at the assignment's epoch
// whose tails match the owner's (nil when it is).
func (s streamStatus) inSync(node string) error {
	a := s.Assignment
	if !slices.Contains(a.Followers, node) {
		return fmt.Errorf("%s not a follower in %+v", node, a)
	}
	own, ok := s.copyOf(a.Owner)
	if !ok {
		return fmt.Errorf("no copy of the owner %s in %+v", a.Owner, s.Copies)
	}
	c, ok := s.copyOf(node)
	if !ok || !c.Live || c.Role != "follower" || c.Epoch != a.Epoch || c.SealEpoch != "0" ||
		c.RecordTail != own.RecordTail || c.CursorEventTail != own.CursorEventTail {
		return fmt.Errorf("%s's copy %+v (present %v); the owner's %+v, assignment epoch %s", node, c, ok, own, a.Epoch)
	}
	return nil
}

// liveBrokers is `brokers --json`: node to live.
func liveBrokers(t *testing.T, dir string) map[string]bool {
	t.Helper()
	r := ctl(t, dir, "", "brokers", "--json", "--timeout", "5s")
	live := map[string]bool{}
	if r.code != 0 {
		return live
	}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var b struct {
			Node string `json:"node"`
			Live bool   `json:"live"`
		}
		if json.Unmarshal(sc.Bytes(), &b) == nil {
			live[b.Node] = b.Live
		}
	}
	return live
}

func waitLive(t *testing.T, dir string, nodes ...string) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, fmt.Sprintf("%v live", nodes), func() error {
		live := liveBrokers(t, dir)
		for _, n := range nodes {
			if !live[n] {
				return fmt.Errorf("brokers %v", live)
			}
		}
		return nil
	})
}

func brokerOf(t *testing.T, dir, node string) devcluster.BrokerInfo {
	t.Helper()
	info, err := devcluster.ReadRunning(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, ok := info.Broker(node)
	if !ok {
		t.Fatalf("no %s in cluster.json %+v", node, info)
	}
	return b
}

// devWithStream starts `strandctl dev` with three brokers, creates a 3-copy
// majority_durable stream and publishes a, b and c to it.
func devWithStream(t *testing.T, stream string) (string, *devProcess, streamStatus) {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	dir := t.TempDir()
	dev := startDev(t, dir, freePortBase(t, 3), 3)
	waitLive(t, dir, devcluster.BrokerNode(1), devcluster.BrokerNode(2), devcluster.BrokerNode(3))
	mustCtl(t, dir, "", "stream", "create", stream, "--copies", "3", "--policy", "majority_durable")
	mustCtl(t, dir, "", "publish", stream, "a", "b", "c")
	st, err := getStream(t, dir, stream)
	if err != nil {
		t.Fatal(err)
	}
	return dir, dev, st
}

// TestDevSupervisorRestartsAKilledBroker: a follower SIGKILLed under `strandctl
// dev` comes back by itself, as the same node on the same port with a new
// pid, and catches up with the records published while it was down.
func TestDevSupervisorRestartsAKilledBroker(t *testing.T) {
	const stream = "supervised"
	dir, dev, st := devWithStream(t, stream)
	victim := st.Assignment.Followers[0]
	before := brokerOf(t, dir, victim)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s (pid %d): %v", victim, before.PID, err)
	}
	line := fmt.Sprintf("dev: %s (pid %d) exited (signal: killed); restarting in %v", victim, before.PID, devcluster.RestartMin)
	var after devcluster.BrokerInfo
	clustertest.Eventually(t, 30*time.Second, victim+" restarted by the supervisor", func() error {
		if !strings.Contains(dev.out.String(), line) {
			return fmt.Errorf("no %q in the dev output", line)
		}
		after = brokerOf(t, dir, victim)
		if after.PID == 0 || after.PID == before.PID {
			return fmt.Errorf("cluster.json has %+v", after)
		}
		return nil
	})
	if after.Address != before.Address {
		t.Fatalf("%s came back on %s, was on %s", victim, after.Address, before.Address)
	}
	mustCtl(t, dir, "", "publish", stream, "d", "e", "f")
	clustertest.Eventually(t, 40*time.Second, victim+" back in sync", func() error {
		st, err := getStream(t, dir, stream)
		if err != nil {
			return err
		}
		if err := st.inSync(victim); err != nil {
			return err
		}
		if c, _ := st.copyOf(victim); c.RecordTail != "6" {
			return fmt.Errorf("%s's record tail %s, want 6", victim, c.RecordTail)
		}
		return nil
	})
	checkRecords(t, readJSON(t, dir, stream), []string{"a", "b", "c", "d", "e", "f"}, 0)
}

// TestDevStopStartFailover: `dev stop` of a 3-copy stream's owner is a clean
// stop that fails the stream over (a new owner at a higher epoch, publishes
// confirm) and keeps its copy as a follower; the supervisor leaves the
// stopped broker down; `dev start` brings it back and it catches up.
func TestDevStopStartFailover(t *testing.T) {
	const stream = "stop-start"
	dir, dev, st0 := devWithStream(t, stream)
	owner := st0.Assignment.Owner

	r := ctl(t, dir, "", "dev", "stop", "broker-9")
	if r.code != 1 || !strings.Contains(r.stderr, `no such node "broker-9"; the nodes are controller, recoverer, broker-1, broker-2, broker-3`) {
		t.Fatalf("dev stop of an unknown node: exit %d, stderr %q; want exit 1 naming the nodes", r.code, r.stderr)
	}

	oldPID := brokerOf(t, dir, owner).PID
	if out := mustCtl(t, dir, "", "dev", "stop", owner); !strings.Contains(out, owner+" stopped") {
		t.Fatalf("dev stop %s printed %q", owner, out)
	}
	if b := brokerOf(t, dir, owner); b.PID != 0 {
		t.Fatalf("cluster.json names pid %d for the stopped %s", b.PID, owner)
	}
	var st1 streamStatus
	clustertest.Eventually(t, 30*time.Second, "the stream failed over from the stopped owner", func() error {
		st, err := getStream(t, dir, stream)
		if err != nil {
			return err
		}
		// The stopped owner stays a member, as a follower, to rejoin
		// (docs/protocol.md, "Replacing a missing copy").
		if epochOf(t, st) <= epochOf(t, st0) || st.Assignment.Owner == owner || !slices.Contains(st.Assignment.Followers, owner) {
			return fmt.Errorf("assignment %+v, was %+v", st.Assignment, st0.Assignment)
		}
		st1 = st
		return nil
	})
	mustCtl(t, dir, "", "publish", stream, "d", "e")

	// Still down, past the failover (a restart would have come after
	// its first back-off), and a second stop says so.
	if out := dev.out.String(); strings.Contains(out, fmt.Sprintf("%s (pid %d) exited", owner, oldPID)) {
		t.Fatalf("the stop of %s was reported as an unexpected exit:\n%s", owner, out)
	}
	if b := brokerOf(t, dir, owner); b.PID != 0 {
		t.Fatalf("the stopped %s runs again (pid %d) before dev start", owner, b.PID)
	}
	if r := ctl(t, dir, "", "dev", "stop", owner); r.code != 1 || !strings.Contains(r.stderr, "already stopped") {
		t.Fatalf("second dev stop %s: exit %d, %q", owner, r.code, r.stderr)
	}

	if out := mustCtl(t, dir, "", "dev", "start", owner); !strings.Contains(out, owner+" started") {
		t.Fatalf("dev start %s printed %q", owner, out)
	}
	if r := ctl(t, dir, "", "dev", "start", owner); r.code != 1 || !strings.Contains(r.stderr, "already running") {
		t.Fatalf("dev start of the running %s: exit %d, %q", owner, r.code, r.stderr)
	}
	clustertest.Eventually(t, 40*time.Second, owner+" rejoined as a follower in sync", func() error {
		st, err := getStream(t, dir, stream)
		if err != nil {
			return err
		}
		if st.Assignment.Epoch != st1.Assignment.Epoch || st.Assignment.Owner != st1.Assignment.Owner {
			return fmt.Errorf("the rejoin moved the stream: %+v, was %+v", st.Assignment, st1.Assignment)
		}
		if err := st.inSync(owner); err != nil {
			return err
		}
		if c, _ := st.copyOf(owner); c.RecordTail != "5" {
			return fmt.Errorf("%s's record tail %s, want 5", owner, c.RecordTail)
		}
		return nil
	})
}

// TestDevRestartFalseLeavesAKilledChildDead: with --restart=false a killed
// broker stays dead, past the point its lease expired, until `dev start`.
func TestDevRestartFalseLeavesAKilledChildDead(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	dir := t.TempDir()
	dev := startDev(t, dir, freePortBase(t, 2), 2, "--restart=false")
	victim := devcluster.BrokerNode(1)
	waitLive(t, dir, victim, devcluster.BrokerNode(2))
	before := brokerOf(t, dir, victim)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("dev: %s (pid %d) exited: signal: killed; the rest keep running", victim, before.PID)
	clustertest.Eventually(t, 30*time.Second, "the killed broker reaped", func() bool {
		return strings.Contains(dev.out.String(), line)
	})
	// Its lease expires (seconds; a restart after the back-off would have
	// re-registered it long before) and nothing brought it back.
	clustertest.Eventually(t, 30*time.Second, victim+" no longer live", func() bool {
		return !liveBrokers(t, dir)[victim] && len(liveBrokers(t, dir)) > 0
	})
	if b := brokerOf(t, dir, victim); b.PID != 0 {
		t.Fatalf("cluster.json names pid %d for the dead %s", b.PID, victim)
	}
	if out := dev.out.String(); strings.Contains(out, "restarting") {
		t.Fatalf("--restart=false restarted a child:\n%s", out)
	}
	mustCtl(t, dir, "", "dev", "start", victim)
	waitLive(t, dir, victim)
}

// TestDevStaleClusterJSON: a cluster.json whose dev process is gone gets
// the same clear error from every command that would use it, rather than
// each waiting out its timeout on addresses nobody listens on.
func TestDevStaleClusterJSON(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	dir := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	pid := gone.Process.Pid
	raw, err := json.Marshal(devcluster.Info{
		PID: pid, Controller: "127.0.0.1:1", Control: "127.0.0.1:1",
		Brokers: []devcluster.BrokerInfo{{Node: devcluster.BrokerNode(1), Address: "127.0.0.1:1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, devcluster.InfoFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("dev cluster in %s is not running (pid %d gone): start it with make run, or pass --controller/--broker", dir, pid)
	for _, args := range [][]string{
		{"stream", "list"},
		{"publish", "x", "a"},
		{"brokers"},
		{"dev", "stop", devcluster.BrokerNode(1)},
		{"dev", "start", devcluster.BrokerNode(1)},
	} {
		// --timeout well under ctl's own 60 s: a command that tried the
		// addresses would fail with its deadline instead of this message.
		r := ctl(t, dir, "", append(args, "--timeout", "40s")...)
		if r.code != 1 || !strings.Contains(r.stderr, want) {
			t.Errorf("strandctl %v on a stale cluster.json: exit %d, stderr %q; want exit 1 with %q", args, r.code, r.stderr, want)
		}
	}
}

// TestDevPeerTokenLetsAHandStartedBrokerJoin: a broker started by hand with
// the token from the file cluster.json names replicates with dev's brokers
// (Follow and Seal refuse a peer with the wrong token, either way round).
func TestDevPeerTokenLetsAHandStartedBrokerJoin(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	dir := t.TempDir()
	port := freePortBase(t, 3) // broker-3's port is free: dev starts two
	startDev(t, dir, port, 2)
	info, err := devcluster.ReadRunning(dir)
	if err != nil {
		t.Fatal(err)
	}
	token, err := devcluster.ReadPeerToken(info)
	if err != nil || token == "" {
		t.Fatalf("peer token from %q: %q, %v", info.PeerTokenFile, token, err)
	}
	const node = "broker-hand"
	cmd := exec.Command(filepath.Join(binDir, devcluster.BrokerBin), "--node", node,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port+13), "--data-dir", filepath.Join(dir, node), "--etcd", info.Etcd[0], "--insecure")
	cmd.Env = append(cleanEnv(), "STRAND_PEER_TOKEN="+token)
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s's log:\n%s", node, log.String())
		}
	})
	waitLive(t, dir, devcluster.BrokerNode(1), devcluster.BrokerNode(2), node)
	const stream = "hand"
	mustCtl(t, dir, "", "stream", "create", stream, "--copies", "3", "--policy", "majority_durable")
	mustCtl(t, dir, "", "publish", stream, "a", "b")
	clustertest.Eventually(t, 30*time.Second, "every copy in sync", func() error {
		st, err := getStream(t, dir, stream)
		if err != nil {
			return err
		}
		for _, f := range st.Assignment.Followers {
			if err := st.inSync(f); err != nil {
				return err
			}
		}
		if c, _ := st.copyOf(node); len(st.Assignment.Followers) != 2 || c.RecordTail != "2" {
			return fmt.Errorf("assignment %+v; %s's copy %+v", st.Assignment, node, c)
		}
		return nil
	})
}
