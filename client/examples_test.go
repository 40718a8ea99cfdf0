package client_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The examples module (examples/, a module of its own that imports the
// client as any other module would) vets and builds, and its quickstart,
// run as a program against the in-process cluster with only STRAND_BROKER
// and STRAND_CONTROLLER to find it, creates its stream, publishes, reads
// back through its cursor and exits 0; run again, it finds the stream and
// resumes at its cursor. This is how `make test` covers examples/: the main
// module's ./... does not reach into another module.
func TestExamplesModule(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("..", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	goTool(t, dir, "vet", "./...")
	bin := filepath.Join(t.TempDir(), "quickstart")
	goTool(t, dir, "build", "-o", bin, "./quickstart")

	leading, _ := leader(t)
	env := append(os.Environ(), "STRAND_BROKER="+strings.Join(box.Addrs(), ","), "STRAND_CONTROLLER="+leading)
	out := runQuickstart(t, bin, env, 0, "--stream", "quickstart-test")
	for _, want := range []string{
		"stream quickstart-test: 3 copies\n",
		"published 3 records at offsets 0..2\n",
		"read 0: quickstart record 1\nread 1: quickstart record 2\nread 2: quickstart record 3\n",
		"read 3 records; cursor quickstart committed at 3\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("first run printed\n%s\nwant it to hold %q", out, want)
		}
	}
	out = runQuickstart(t, bin, env, 0, "--stream", "quickstart-test")
	for _, want := range []string{
		"published 3 records at offsets 3..5\n",
		"read 3: quickstart record 1\n",
		"read 3 records; cursor quickstart committed at 6\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("second run printed\n%s\nwant it to hold %q", out, want)
		}
	}

	// No cluster where it is told to look: exit 1, the reason on stderr.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := ln.Addr().String()
	_ = ln.Close()
	runQuickstart(t, bin, os.Environ(), 1, "--controller", nowhere, "--broker", nowhere, "--timeout", "1s")
}

// goTool runs the go command in dir, failing the test with its output if
// it fails. GOWORK=off: the examples module is built on its own, as a
// fresh clone builds it, with the dependencies its go.sum pins.
func goTool(t *testing.T, dir string, args ...string) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
}

// runQuickstart runs the built quickstart and checks its exit code; it
// returns what it printed on stdout.
func runQuickstart(t *testing.T, bin string, env []string, wantExit int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// Run where no dev cluster's cluster.json can be found, so only what
	// it is given says where the cluster is.
	cmd.Dir = t.TempDir()
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("quickstart %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	if code != wantExit {
		t.Fatalf("quickstart %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, wantExit, stdout.String(), stderr.String())
	}
	if wantExit != 0 && !strings.HasPrefix(stderr.String(), "quickstart: ") {
		t.Fatalf("quickstart %v failed without saying why on stderr: %q", args, stderr.String())
	}
	return stdout.String()
}
