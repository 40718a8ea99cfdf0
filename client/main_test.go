package client_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox"
)

// box is the in-process cluster the examples and the tests of this
// package's external tests run against: three brokers, two controllers (so
// one does not lead), one recoverer.
var box *onebox.Cluster

// TestMain starts box before any test or example and exports where it is
// as a deployment would, in STRAND_BROKER and STRAND_CONTROLLER, so the
// examples read their configuration from the environment like any program
// (configFromEnv) instead of from test wiring.
func TestMain(m *testing.M) {
	os.Exit(onebox.Main(m, onebox.Options{Brokers: []string{"b1", "b2", "b3"}, Controllers: 2, Recoverers: 1}, func(t testing.TB, c *onebox.Cluster) error {
		box = c
		leader(t)
		if err := os.Setenv("STRAND_BROKER", strings.Join(c.Addrs(), ",")); err != nil {
			return err
		}
		return os.Setenv("STRAND_CONTROLLER", c.ControllerAddr())
	}))
}

// leader waits until one of box's controllers leads and returns its
// address and the other one's.
func leader(t testing.TB) (leading, other string) {
	t.Helper()
	clustertest.Eventually(t, 15*time.Second, "a controller leads", func() error {
		first, second := box.Controller(1), box.Controller(2)
		switch {
		case first.Leading():
			leading, other = first.Addr(), second.Addr()
		case second.Leading():
			leading, other = second.Addr(), first.Addr()
		default:
			return errors.New("no controller leads")
		}
		return nil
	})
	return leading, other
}
