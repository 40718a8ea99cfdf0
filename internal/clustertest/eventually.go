package clustertest

import (
	"errors"
	"testing"
	"time"
)

// Condition is what Eventually polls, in the shape the caller has at hand:
//
//   - func() error holds when it returns nil; the error says what was seen
//     instead.
//   - func() bool holds when it returns true.
//   - func() (bool, string) holds when it returns true; the string says
//     what was seen instead.
type Condition interface {
	func() error | func() bool | func() (bool, string)
}

// Eventually is the one way tests wait for a condition: it polls cond every
// 25ms until it holds, and fails the test with what and what cond last saw
// once within has passed. Tests wait on a condition with a deadline like
// this, an etcd watch or a channel, never for a while.
func Eventually[C Condition](t testing.TB, within time.Duration, what string, cond C) {
	t.Helper()
	check := asCheck(cond)
	deadline := time.Now().Add(within)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		<-tick.C
	}
}

// asCheck turns any Condition into its func() error form.
func asCheck[C Condition](cond C) func() error {
	switch c := any(cond).(type) {
	case func() error:
		return c
	case func() bool:
		return func() error {
			if c() {
				return nil
			}
			return errNotYet
		}
	case func() (bool, string):
		return func() error {
			if ok, seen := c(); !ok {
				return errors.New(seen)
			}
			return nil
		}
	}
	panic("clustertest: a Condition of no known shape") // the constraint admits none other
}

var errNotYet = errors.New("condition does not hold yet")
