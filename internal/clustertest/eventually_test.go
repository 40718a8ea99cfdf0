package clustertest

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records a Fatalf and stops its goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls wait with a recorder and returns what it failed with ("" when
// it returned).
func run(t *testing.T, wait func(tb testing.TB)) string {
	t.Helper()
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait(f)
	}()
	<-done
	return f.msg
}

func TestEventuallyEveryShape(t *testing.T) {
	n := 0
	holdsThird := func() bool { n++; return n >= 3 }
	for _, c := range []struct {
		name string
		wait func(tb testing.TB)
	}{
		{"error", func(tb testing.TB) {
			n = 0
			Eventually(tb, 10*time.Second, "x", func() error {
				if !holdsThird() {
					return errors.New("no")
				}
				return nil
			})
		}},
		{"bool", func(tb testing.TB) { n = 0; Eventually(tb, 10*time.Second, "x", holdsThird) }},
		{"bool and state", func(tb testing.TB) {
			n = 0
			Eventually(tb, 10*time.Second, "x", func() (bool, string) { return holdsThird(), "seen" })
		}},
	} {
		if msg := run(t, c.wait); msg != "" || n != 3 {
			t.Errorf("%s: failed with %q after %d polls; want it to hold on the third", c.name, msg, n)
		}
	}
}

func TestEventuallyFailsWithWhatWasSeen(t *testing.T) {
	for _, c := range []struct {
		name string
		wait func(tb testing.TB)
		want string
	}{
		{"error", func(tb testing.TB) {
			Eventually(tb, 50*time.Millisecond, "the thing", func() error { return errors.New("tail at 3") })
		}, "the thing: not within 50ms: tail at 3"},
		{"bool", func(tb testing.TB) {
			Eventually(tb, 50*time.Millisecond, "the thing", func() bool { return false })
		}, "the thing: not within 50ms: " + errNotYet.Error()},
		{"bool and state", func(tb testing.TB) {
			Eventually(tb, 50*time.Millisecond, "the thing", func() (bool, string) { return false, "tail at 3" })
		}, "the thing: not within 50ms: tail at 3"},
	} {
		if msg := run(t, c.wait); !strings.Contains(msg, c.want) {
			t.Errorf("%s: failed with %q, want %q", c.name, msg, c.want)
		}
	}
}
