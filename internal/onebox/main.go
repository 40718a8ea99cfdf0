package onebox

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"testing"
)

// Main starts one cluster for a whole test binary, before any of its tests
// and examples run, and stops it after them: an Example function has no
// *testing.T to start one with, and reads where the cluster is from the
// environment, as a program would. setup gets the running cluster (to
// export its addresses, say) and a testing.TB to wait with (Eventually):
// its Fatalf, or an error setup returns, fails the start, and the binary
// runs nothing. Main returns the exit code for TestMain to pass to os.Exit.
func Main(m *testing.M, opts Options, setup func(testing.TB, *Cluster) error) int {
	// A run that selects no test or example (make test compiles every
	// test binary in parallel with -run '^$' first) needs no cluster, and
	// starting one there would only load the machine.
	flag.Parse()
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "^$" {
		return m.Run()
	}
	t := &mainT{}
	defer t.cleanup()
	if err := t.run(func() {
		c := Start(t, opts)
		if err := setup(t, c); err != nil {
			t.Fatalf("onebox: %v", err)
		}
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		t.failed = true
		return 1
	}
	code := m.Run()
	t.failed = code != 0
	return code
}

// mainT is the testing.TB of a cluster that Main starts: Fatalf ends the
// start (a panic that run recovers), Cleanup runs when Main returns, and
// Logf, the service logs a failed run dumps among them, goes to stderr.
// Methods onebox, etcdtest and clustertest do not call are left to the
// embedded nil TB, and panic.
type mainT struct {
	testing.TB
	cleanups []func()
	dirs     []string
	failed   bool
}

// errFatal is what a Fatalf during Main's start panics with.
type errFatal struct{ msg string }

func (t *mainT) run(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(errFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(fe.msg)
		}
	}()
	f()
	return nil
}

func (t *mainT) cleanup() {
	for _, f := range slices.Backward(t.cleanups) {
		f()
	}
	for _, d := range t.dirs {
		_ = os.RemoveAll(d)
	}
}

func (t *mainT) Helper()                 {}
func (t *mainT) Name() string            { return "onebox.Main" }
func (t *mainT) Failed() bool            { return t.failed }
func (t *mainT) Cleanup(f func())        { t.cleanups = append(t.cleanups, f) }
func (t *mainT) Logf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (t *mainT) Fatalf(f string, a ...any) {
	panic(errFatal{fmt.Sprintf(f, a...)})
}
func (t *mainT) Fatal(a ...any) { panic(errFatal{fmt.Sprint(a...)}) }

func (t *mainT) TempDir() string {
	d, err := os.MkdirTemp("", "onebox-")
	if err != nil {
		t.Fatalf("onebox: temp dir: %v", err)
	}
	t.dirs = append(t.dirs, d)
	return d
}
