package clustertest

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// WaitParked waits until a goroutine is blocked in state ("select", "chan
// send", "chan receive", as a goroutine dump names it) inside fn (its name
// as the dump gives it, e.g. "replica.(*Copy).awaitApplied"), read from the
// runtime's goroutine dump. A test uses it to know that the goroutine it
// started has reached the wait it is about, rather than hoping it has: a
// check that the goroutine has not gone past the wait can then fail.
func WaitParked(t testing.TB, state, fn string) {
	t.Helper()
	Eventually(t, 10*time.Second, "a goroutine parked in "+state+" in "+fn, func() bool {
		for _, g := range Goroutines() {
			if strings.Contains(g, "["+state) && strings.Contains(g, fn+"(") {
				return true
			}
		}
		return false
	})
}

// Goroutines returns the stack of every goroutine, one string each, from
// the runtime's goroutine dump.
func Goroutines() []string {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	// A dump that fills the buffer may have been cut short: grow it until
	// the whole dump fits.
	for n == len(buf) {
		buf = make([]byte, 2*len(buf))
		n = runtime.Stack(buf, true)
	}
	return strings.Split(string(buf[:n]), "\n\n")
}
