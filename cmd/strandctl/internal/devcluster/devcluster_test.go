package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
)

// A second start on the data dir of a running cluster is refused and
// leaves its cluster.json, which every other command reads to reach it.
func TestStartRefusesTheDirOfARunningCluster(t *testing.T) {
	dir := t.TempDir()
	// A live process stands for the running cluster's strandctl.
	running := Info{PID: os.Getppid(), Controller: "127.0.0.1:1"}
	if err := writeInfo(dir, running); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Fatalf("a start on a running cluster's dir: %v, want it refused", err)
	}
	if _, err := os.Stat(filepath.Join(dir, InfoFile)); err != nil {
		t.Fatalf("the running cluster's %s is gone: %v", InfoFile, err)
	}
}

// The supervisor's back-off doubles from RestartMin up to RestartMax while
// a child keeps dying young, and starts over once one ran RestartReset.
func TestSupervisorBackoff(t *testing.T) {
	ch := &child{}
	t0 := time.Now()
	var got []time.Duration
	for range 7 {
		got = append(got, ch.nextBackoff(t0, t0.Add(time.Second)))
	}
	want := []time.Duration{RestartMin, 2 * RestartMin, 4 * RestartMin, 8 * RestartMin, 16 * RestartMin, RestartMax, RestartMax}
	if !slices.Equal(got, want) {
		t.Fatalf("back-offs of a child that keeps exiting after 1s: %v, want %v", got, want)
	}
	if d := ch.nextBackoff(t0, t0.Add(RestartReset)); d != RestartMin {
		t.Fatalf("after a run of %v the back-off is %v, want %v", RestartReset, d, RestartMin)
	}
}

// A cluster.json whose dev process is gone (reaped, or a zombie not yet
// reaped) is ErrNotRunning, with what to do; one whose process lives is
// read as it is.
func TestReadRunningStale(t *testing.T) {
	dir := t.TempDir()
	write := func(pid int) {
		t.Helper()
		if err := writeInfo(dir, Info{PID: pid, Controller: "127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	write(os.Getpid())
	if info, err := ReadRunning(dir); err != nil || info.Controller != "127.0.0.1:1" {
		t.Fatalf("cluster.json of a live process: %+v, %v", info, err)
	}

	reaped := exec.Command("true")
	if err := reaped.Run(); err != nil {
		t.Fatal(err)
	}
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zombie.Wait() }()
	// Not reaped until the deferred Wait: /proc shows it a zombie once it
	// has exited.
	clustertest.Eventually(t, 10*time.Second, "the unreaped child seen as gone", func() bool { return !alive(zombie.Process.Pid) })
	for _, pid := range []int{reaped.Process.Pid, zombie.Process.Pid} {
		write(pid)
		_, err := ReadRunning(dir)
		want := fmt.Sprintf("dev cluster in %s is not running (pid %d gone): start it with make run, or pass --controller/--broker", dir, pid)
		if !errors.Is(err, ErrNotRunning) || err.Error() != want {
			t.Errorf("cluster.json of gone pid %d: %v, want ErrNotRunning: %q", pid, err, want)
		}
	}
	if err := os.Remove(filepath.Join(dir, InfoFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRunning(dir); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("no cluster.json: %v, want ErrNoCluster", err)
	}
}

// The peer token is made up once, kept in DIR/peer-token with mode 0600 and
// reused by the next start; a caller's STRAND_PEER_TOKEN wins and is what
// the file then holds; a file with a token that cannot travel in a header
// stops the start.
func TestDevPeerTokenFile(t *testing.T) {
	t.Setenv(rpcserver.PeerTokenEnv, "")
	dir := t.TempDir()
	tok, path, err := loadPeerToken(dir)
	if err != nil || tok == "" || path != filepath.Join(dir, PeerTokenFile) {
		t.Fatalf("first start: token %q, file %q, %v", tok, path, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file %v, %v: want mode 0600", st.Mode(), err)
	}
	if again, _, err := loadPeerToken(dir); err != nil || again != tok {
		t.Fatalf("second start: token %q, %v; want the first start's %q", again, err, tok)
	}
	if got, err := ReadPeerToken(Info{PeerTokenFile: path}); err != nil || got != tok {
		t.Fatalf("ReadPeerToken: %q, %v; want %q", got, err, tok)
	}

	t.Setenv(rpcserver.PeerTokenEnv, "callers-token")
	if got, _, err := loadPeerToken(dir); err != nil || got != "callers-token" {
		t.Fatalf("with %s set: %q, %v", rpcserver.PeerTokenEnv, got, err)
	}
	if raw, _ := os.ReadFile(path); strings.TrimSpace(string(raw)) != "callers-token" {
		t.Fatalf("token file holds %q, want the caller's token", raw)
	}

	t.Setenv(rpcserver.PeerTokenEnv, "")
	if err := os.WriteFile(path, []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadPeerToken(dir); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a token with a space in %s: %v, want an error naming the file", path, err)
	}
}

func TestBrokerZoneRoundRobin(t *testing.T) {
	zones := []string{"a", "b", "c"}
	var got []string
	for i := 1; i <= 5; i++ {
		got = append(got, BrokerZone(zones, i))
	}
	if want := []string{"a", "b", "c", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("zones %v, want %v", got, want)
	}
	if z := BrokerZone(nil, 1); z != "" {
		t.Fatalf("no zones: %q", z)
	}
}

// --replace-after reaches the controller when set, before the extra flags
// (which may override it), and is left to its default otherwise.
func TestControllerArgsReplaceAfter(t *testing.T) {
	common := []string{"--etcd", "http://e", "--prefix", "/p"}
	got := strings.Join(controllerArgs(Options{PortBase: 4000, ReplaceAfter: 2 * time.Second, ControllerArgs: []string{"--log-level", "debug"}}, common), " ")
	if want := "--name controller --listen 127.0.0.1:4002 --etcd http://e --prefix /p --replace-after 2s --log-level debug"; got != want {
		t.Fatalf("args %q, want %q", got, want)
	}
	if got := strings.Join(controllerArgs(Options{PortBase: 4000}, common), " "); strings.Contains(got, "--replace-after") {
		t.Fatalf("args %q name --replace-after though it is not set", got)
	}
}
