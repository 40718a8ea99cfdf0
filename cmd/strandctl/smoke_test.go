package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// The smoke test runs the real binaries: TestMain builds them once into a
// temp dir. A build failure fails the smoke test (it never skips), while the
// package's unit tests still run.
var (
	binDir   string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "strandctl-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	buildErr = buildBinaries(dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func buildBinaries(dir string) error {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bins := []struct{ name, pkg string }{
		{devcluster.BrokerBin, "./services/broker"},
		{devcluster.ControllerBin, "./services/controller"},
		{devcluster.RecovererBin, "./services/recoverer"},
		{"strandctl", "./cmd/strandctl"},
	}
	// One go build for all four: it loads the packages once and links
	// the binaries side by side, where one build each links them one
	// after the other. It names each after its package's directory.
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, b := range bins {
		args = append(args, b.pkg)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	for _, b := range bins {
		if err := os.Rename(filepath.Join(dir, filepath.Base(b.pkg)), filepath.Join(dir, b.name)); err != nil {
			return err
		}
	}
	return nil
}

func freePortBase(t *testing.T, brokers int) int {
	t.Helper()
	p, err := devcluster.FreePortBase(brokers)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type result struct {
	stdout, stderr string
	code           int
}

// ctl runs strandctl against the dev cluster in dir.
func ctl(t *testing.T, dir string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "strandctl"), append(args, "--data-dir", dir)...)
	cmd.Env = cleanEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("strandctl %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

// mustCtl runs strandctl and fails the test unless it exits 0.
func mustCtl(t *testing.T, dir, stdin string, args ...string) string {
	t.Helper()
	r := ctl(t, dir, stdin, args...)
	if r.code != 0 {
		t.Fatalf("strandctl %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// cleanEnv drops STRAND_* so the commands find the cluster from cluster.json.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STRAND_CONTROLLER=") && !strings.HasPrefix(kv, "STRAND_BROKER=") {
			env = append(env, kv)
		}
	}
	return env
}

// devProcess is a running `strandctl dev`.
type devProcess struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDev starts `strandctl dev` on dir with extra flags after the usual
// ones, and waits for its cluster.json.
func startDev(t *testing.T, dir string, portBase, brokers int, extra ...string) *devProcess {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "strandctl"), append([]string{"dev", "--data-dir", dir,
		"--port-base", strconv.Itoa(portBase), "--brokers", strconv.Itoa(brokers), "--bin-dir", binDir}, extra...)...)
	cmd.Env = cleanEnv()
	d := &devProcess{cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.out, d.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			// Its children die with it (Pdeathsig).
			_ = cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("strandctl dev output:\n%s", d.out.String())
			dumpLogs(t, dir)
		}
	})
	clustertest.Eventually(t, 90*time.Second, "cluster.json from strandctl dev", func() bool {
		select {
		case <-d.done:
			t.Fatalf("strandctl dev exited early: %v\n%s", d.err, d.out.String())
		default:
		}
		_, err := devcluster.ReadInfo(dir)
		return err == nil
	})
	return d
}

// stop sends SIGINT and waits for a clean exit.
func (d *devProcess) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("strandctl dev did not stop within 60s after SIGINT\n%s", d.out.String())
	}
	if d.err != nil {
		t.Fatalf("strandctl dev exited with %v after SIGINT\n%s", d.err, d.out.String())
	}
}

func dumpLogs(t *testing.T, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Logf("---- %s (tail)\n%s", filepath.Base(f), b)
	}
}

// readJSON reads a whole stream through `strandctl read --json`.
func readJSON(t *testing.T, dir, stream string) map[uint64]string {
	t.Helper()
	out := mustCtl(t, dir, "", "read", stream, "--from", "0", "--json")
	got := map[uint64]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			Offset  string `json:"offset"`
			Payload []byte `json:"payload"` // protojson bytes are base64, as encoding/json expects
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("read --json line %q: %v", sc.Text(), err)
		}
		off, err := strconv.ParseUint(rec.Offset, 10, 64)
		if err != nil {
			t.Fatalf("offset %q: %v", rec.Offset, err)
		}
		if _, dup := got[off]; dup {
			t.Fatalf("offset %d read twice", off)
		}
		got[off] = string(rec.Payload)
	}
	return got
}

// checkRecords asserts the stream holds exactly want, in offset order from
// 0, plus extra records after them.
func checkRecords(t *testing.T, got map[uint64]string, want []string, extra int) {
	t.Helper()
	if len(got) != len(want)+extra {
		t.Fatalf("read %d records, want %d", len(got), len(want)+extra)
	}
	for i, w := range want {
		if g, ok := got[uint64(i)]; !ok || g != w {
			t.Fatalf("offset %d: got %q (present %v), want %q", i, g, ok, w)
		}
	}
}

type streamView struct {
	Assignment struct {
		Epoch     string   `json:"epoch"`
		Owner     string   `json:"owner"`
		Followers []string `json:"followers"`
	} `json:"assignment"`
}

func TestCLISmoke(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	const brokers = 3
	dir := t.TempDir()
	port := freePortBase(t, brokers)
	dev := startDev(t, dir, port, brokers)

	// Usage errors exit 2, runtime errors 1.
	if r := ctl(t, dir, "", "stream", "create"); r.code != 2 {
		t.Fatalf("stream create without a name: exit %d, want 2 (%s)", r.code, r.stderr)
	}

	// broker drain --wait, before any stream exists: a bound of 0 is a
	// usage error and drains nothing; a bound that passed before the first
	// look gives up with exit 1 and leaves the drain on; without one the
	// wait ends at once (broker-1 holds no copy) and undrain ends it.
	if r := ctl(t, dir, "", "broker", "drain", "broker-1", "--wait", "--wait-timeout", "0"); r.code != 2 {
		t.Fatalf("drain --wait-timeout 0: exit %d, want 2 (%s)", r.code, r.stderr)
	}
	if out := mustCtl(t, dir, "", "brokers"); strings.Contains(out, "drain") {
		t.Fatalf("a refused drain drained broker-1:\n%s", out)
	}
	if r := ctl(t, dir, "", "broker", "drain", "broker-1", "--wait", "--wait-timeout", "1ns"); r.code != 1 || !strings.Contains(r.stderr, "not drained after 1ns") {
		t.Fatalf("drain --wait-timeout 1ns: exit %d, want 1 with what is left (%s)", r.code, r.stderr)
	}
	if out := mustCtl(t, dir, "", "broker", "drain", "broker-1", "--wait"); !strings.Contains(out, "drained") {
		t.Fatalf("drain --wait of a broker with no copy: %q, want it drained", out)
	}
	mustCtl(t, dir, "", "broker", "undrain", "broker-1")
	if r := ctl(t, dir, "", "stream", "create", "x", "--policy", "bogus"); r.code != 2 {
		t.Fatalf("unknown policy: exit %d, want 2 (%s)", r.code, r.stderr)
	}
	if r := ctl(t, dir, "", "stream", "get", "no-such-stream"); r.code != 1 {
		t.Fatalf("stream get of a missing stream: exit %d, want 1 (%s)", r.code, r.stderr)
	}

	clustertest.Eventually(t, 30*time.Second, "three live brokers", func() bool {
		r := ctl(t, dir, "", "brokers", "--json")
		return r.code == 0 && strings.Count(r.stdout, `"live":true`) == brokers
	})

	mustCtl(t, dir, "", "stream", "create", "smoke", "--copies", "1")
	want := []string{"alpha", "beta", "gamma"}
	mustCtl(t, dir, "", append([]string{"publish", "smoke"}, want...)...)
	stdin := []string{"delta", "epsilon", "zeta with spaces"}
	mustCtl(t, dir, strings.Join(stdin, "\n")+"\n", "publish", "smoke")
	want = append(want, stdin...)
	const generated = 200
	out := mustCtl(t, dir, "", "publish", "smoke", "--count", strconv.Itoa(generated), "--size", "64", "--inflight", "16", "--json")
	var load struct {
		Confirmed int `json:"confirmed"`
	}
	if err := json.Unmarshal([]byte(out), &load); err != nil || load.Confirmed != generated {
		t.Fatalf("generated publish: %q (%v), want %d confirmed", out, err, generated)
	}
	got := readJSON(t, dir, "smoke")
	checkRecords(t, got, want, generated)
	// Generated records follow, each with a distinct id prefix.
	ids := map[string]bool{}
	for off := uint64(len(want)); off < uint64(len(want)+generated); off++ {
		p, ok := got[off]
		if !ok || !strings.HasPrefix(p, "strandctl-") || len(p) != 64 {
			t.Fatalf("offset %d: %q, want a 64-byte generated record", off, p)
		}
		id := p[:strings.Index(p[len("strandctl-"):], "-")+len("strandctl-")]
		if ids[id] {
			t.Fatalf("generated id %s stored twice", id)
		}
		ids[id] = true
	}
	all := make([]string, len(want)+generated)
	for off := range all {
		all[off] = got[uint64(off)]
	}

	// Subscribe with a cursor; Ctrl-C commits where it stopped.
	subscribeAndCommit(t, dir, len(all))
	if out := strings.TrimSpace(mustCtl(t, dir, "", "cursor", "get", "smoke", "c1")); out != strconv.Itoa(len(all)) {
		t.Fatalf("cursor c1 at %q after subscribing to %d records, want %d", out, len(all), len(all))
	}

	// A replicated stream, where the cluster already supports it.
	if r := ctl(t, dir, "", "stream", "create", "smoke3", "--copies", "3", "--policy", "majority_durable"); r.code == 0 {
		mustCtl(t, dir, "", "publish", "smoke3", "r1", "r2")
		checkRecords(t, readJSON(t, dir, "smoke3"), []string{"r1", "r2"}, 0)
	} else {
		t.Logf("3-copy stream not available yet: %s", r.stderr)
	}

	// SIGKILL the owner's process, then stop the dev cluster.
	var sv streamView
	if err := json.Unmarshal([]byte(mustCtl(t, dir, "", "stream", "get", "smoke", "--json")), &sv); err != nil {
		t.Fatal(err)
	}
	info, err := devcluster.ReadInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	owner, ok := info.Broker(sv.Assignment.Owner)
	if !ok || owner.PID == 0 {
		t.Fatalf("owner %q not in cluster.json %+v", sv.Assignment.Owner, info)
	}
	if err := syscall.Kill(owner.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill owner %s (pid %d): %v", owner.Node, owner.PID, err)
	}
	clustertest.Eventually(t, 10*time.Second, "the killed owner to be reaped", func() bool {
		return strings.Contains(dev.out.String(), fmt.Sprintf("%s (pid %d) exited", owner.Node, owner.PID))
	})
	dev.stop(t)
	if _, err := devcluster.ReadInfo(dir); !errors.Is(err, devcluster.ErrNoCluster) {
		t.Fatalf("cluster.json still there after the dev cluster stopped: %v", err)
	}

	// Same dir, same ports: everything is read back.
	dev = startDev(t, dir, port, brokers)
	clustertest.Eventually(t, 30*time.Second, "the stream readable after the restart", func() bool {
		return ctl(t, dir, "", "read", "smoke", "--from", "0", "--max", "1", "--json", "--timeout", "5s").code == 0
	})
	checkRecords(t, readJSON(t, dir, "smoke"), all, 0)
	dev.stop(t)
}

// subscribeAndCommit runs `strandctl subscribe` until it printed n records,
// then interrupts it; it must exit 0.
func subscribeAndCommit(t *testing.T, dir string, n int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "strandctl"), "subscribe", "smoke", "--from", "0", "--cursor", "c1", "--commit-every", "50", "--json", "--data-dir", dir)
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb lockedBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan int, 1)
	go func() {
		count := 0
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			count++
			if count == n {
				lines <- count
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-lines:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("subscribe did not deliver %d records within 30s; stderr: %s", n, errb.String())
	}
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("subscribe after SIGINT: %v; stderr: %s", err, errb.String())
	}
}

// TestBenchSmoke runs `strandctl bench` end to end with both publisher
// shapes: it starts its own cluster from the built binaries, publishes for
// a short while, reads the stream back and reports one JSON result, which
// must show every confirmed record stored once at its confirmed offset.
func TestBenchSmoke(t *testing.T) {
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	for _, publishers := range []string{"async", "sync"} {
		t.Run(publishers, func(t *testing.T) {
			out := mustCtl(t, t.TempDir(), "", "bench", "--duration", "2s", "--inflight", "32", "--json",
				"--publishers", publishers, "--idle-window", "0", "--bin-dir", binDir)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var res struct {
				Confirmed         int                `json:"confirmed"`
				Lost              int                `json:"lost"`
				Duplicates        int                `json:"duplicates"`
				OffsetMismatches  int                `json:"offset_mismatches"`
				Stored            int                `json:"stored"`
				UnconfirmedStored int                `json:"unconfirmed_stored"`
				OK                bool               `json:"ok"`
				Publishers        string             `json:"publishers"`
				Copies            int                `json:"copies"`
				BrokerCPU         float64            `json:"broker_cpu_us_per_record"`
				Stages            map[string]float64 `json:"stage_mean_ms"`
			}
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
				t.Fatalf("bench output is not a JSON result: %v\n%s", err, out)
			}
			if !res.OK || res.Confirmed == 0 || res.Lost != 0 || res.Duplicates != 0 || res.OffsetMismatches != 0 {
				t.Fatalf("bench result not clean: %+v\n%s", res, out)
			}
			if res.Stored != res.Confirmed+res.UnconfirmedStored {
				t.Fatalf("stored %d, want confirmed %d + unconfirmed %d", res.Stored, res.Confirmed, res.UnconfirmedStored)
			}
			if res.BrokerCPU <= 0 {
				t.Fatalf("broker CPU per record %v, want the brokers' measured CPU", res.BrokerCPU)
			}
			// Every stage of a replicated publish was seen in the window,
			// read from the brokers' /metrics.
			for _, stage := range []string{"publish_durable", "publish_confirm", "owner_commit_sync", "follow_ack", "follower_commit_sync", "follow_apply"} {
				if res.Stages[stage] <= 0 {
					t.Fatalf("stage %s = %v ms, want a measured mean (stages %v)", stage, res.Stages[stage], res.Stages)
				}
			}
			if res.Publishers != publishers || res.Copies != 3 {
				t.Fatalf("bench ran %q publishers on %d copies, want %q on 3", res.Publishers, res.Copies, publishers)
			}
		})
	}
}

// TestBenchStreamsFailover runs `strandctl bench --streams 20` with an owner
// kill: the broker owning the most of the streams is killed, the streams it
// owned fail over and serve again, and every record of every stream is read
// back where its confirm said; the result carries the many-streams, etcd,
// CPU and memory figures, idle and loaded.
func TestBenchStreamsFailover(t *testing.T) {
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	out := mustCtl(t, t.TempDir(), "", "bench", "--streams", "20", "--duration", "3s", "--kill-owner-at-secs", "1",
		"--inflight", "64", "--idle-window", "1s", "--json", "--bin-dir", binDir)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := []byte(lines[len(lines)-1])
	var res struct {
		Confirmed         int     `json:"confirmed"`
		Lost              int     `json:"lost"`
		Duplicates        int     `json:"duplicates"`
		OffsetMismatches  int     `json:"offset_mismatches"`
		Stored            int     `json:"stored"`
		UnconfirmedStored int     `json:"unconfirmed_stored"`
		OK                bool    `json:"ok"`
		Streams           int     `json:"streams"`
		StreamsFailedOver int     `json:"streams_failed_over"`
		AllServingMs      float64 `json:"all_serving_ms"`
		ServingP50Ms      float64 `json:"serving_p50_ms"`
		Recoveries        int     `json:"recoveries"`
		Rejoined          bool    `json:"rejoined_as_follower"`
	}
	if err := json.Unmarshal(last, &res); err != nil {
		t.Fatalf("bench output is not a JSON result: %v\n%s", err, out)
	}
	if !res.OK || res.Confirmed == 0 || res.Lost != 0 || res.Duplicates != 0 || res.OffsetMismatches != 0 {
		t.Fatalf("bench result not clean: %+v\n%s", res, out)
	}
	if res.Stored != res.Confirmed+res.UnconfirmedStored {
		t.Fatalf("stored %d, want confirmed %d + unconfirmed %d", res.Stored, res.Confirmed, res.UnconfirmedStored)
	}
	// The killed broker owned the most streams: at least a third of them.
	if res.Streams != 20 || res.StreamsFailedOver < 7 || res.StreamsFailedOver > 20 {
		t.Fatalf("streams %d, failed over %d; want 20 and at least 7", res.Streams, res.StreamsFailedOver)
	}
	if res.Recoveries < res.StreamsFailedOver || !res.Rejoined {
		t.Fatalf("recoveries %d for %d streams failed over, rejoined %v", res.Recoveries, res.StreamsFailedOver, res.Rejoined)
	}
	if res.ServingP50Ms <= 0 || res.AllServingMs < res.ServingP50Ms {
		t.Fatalf("serving p50 %v ms, all %v ms: want every failed-over stream serving again, p50 <= all", res.ServingP50Ms, res.AllServingMs)
	}
	// Every figure of the cluster's cost is there, idle and loaded.
	var fields map[string]any
	if err := json.Unmarshal(last, &fields); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"create_ms", "ready_ms", "etcd_db_bytes",
		"etcd_revisions_per_s", "etcd_revisions_per_s_idle",
		"controller_cpu_pct", "controller_cpu_pct_idle", "recoverer_cpu_pct", "recoverer_cpu_pct_idle",
		"broker_cpu_pct", "broker_cpu_pct_idle", "broker_peak_heap_mb", "broker_peak_heap_mb_idle"} {
		v, ok := fields[f].(float64)
		if !ok || v < 0 {
			t.Errorf("%s = %v, want a measured figure", f, fields[f])
		}
	}
	for _, f := range []string{"etcd_revisions_per_s", "broker_cpu_pct", "broker_peak_heap_mb", "etcd_db_bytes"} {
		if v, _ := fields[f].(float64); v <= 0 {
			t.Errorf("%s = %v under load, want above 0", f, fields[f])
		}
	}
}

// TestBenchRestartOwner runs `strandctl bench --brokers 4` with an owner
// SIGKILL and a restart a second later, well within the controller's
// --replace-after: the copy stays a member and rejoins from its own tail,
// so the 4th broker gains no copy, the followers stored what the returning
// copy missed, and every record is read back where its confirm said.
func TestBenchRestartOwner(t *testing.T) {
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	out := mustCtl(t, t.TempDir(), "", "bench", "--brokers", "4", "--duration", "4s", "--kill-owner-at-secs", "1",
		"--restart-owner-after-secs", "1", "--inflight", "64", "--idle-window", "0", "--json", "--bin-dir", binDir)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res struct {
		Confirmed          int    `json:"confirmed"`
		Lost               int    `json:"lost"`
		Duplicates         int    `json:"duplicates"`
		OffsetMismatches   int    `json:"offset_mismatches"`
		OK                 bool   `json:"ok"`
		Rejoined           bool   `json:"rejoined_as_follower"`
		OldOwner           string `json:"old_owner"`
		RecordsMissed      *int64 `json:"records_missed"`
		BytesRereplicated  *int64 `json:"bytes_rereplicated"`
		BytesReturningCopy *int64 `json:"bytes_returning_copy"`
		SpareCopies        *int   `json:"spare_copies"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("bench output is not a JSON result: %v\n%s", err, out)
	}
	if !res.OK || res.Confirmed == 0 || res.Lost != 0 || res.Duplicates != 0 || res.OffsetMismatches != 0 || !res.Rejoined {
		t.Fatalf("bench result not clean: %+v\n%s", res, out)
	}
	if res.RecordsMissed == nil || res.BytesRereplicated == nil || res.BytesReturningCopy == nil || res.SpareCopies == nil {
		t.Fatalf("restart figures missing: %+v\n%s", res, out)
	}
	if *res.SpareCopies != 0 {
		t.Errorf("spare_copies = %d after a restart within --replace-after, want 0: nothing replaced", *res.SpareCopies)
	}
	// Publishing went on for a second without the killed copy: it missed
	// records, and it stored at least a byte a record of them on its way
	// back, part of what every broker stored.
	if *res.RecordsMissed <= 0 || *res.BytesReturningCopy < *res.RecordsMissed || *res.BytesRereplicated < *res.BytesReturningCopy {
		t.Errorf("records_missed %d, bytes_returning_copy %d, bytes_rereplicated %d: want a gap, its bytes stored on the returning copy, within the total",
			*res.RecordsMissed, *res.BytesReturningCopy, *res.BytesRereplicated)
	}
}
