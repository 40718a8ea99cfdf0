package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
)

// An assignment the broker cannot decode withholds action: a restarted
// broker keeps its copy (it does not take the stream for deleted).
func TestUnreadableAssignmentKeepsTheCopy(t *testing.T) {
	h := newHarness(t, "b1")
	a := cluster.Assignment{Stream: "keep", Epoch: 1, Owner: "b1"}
	h.assign(a)
	h.publish("b1", "keep", "x", "y")
	if _, err := h.cli.Put(context.Background(), h.schema.AssignmentKey("keep"), `{"epoch":"not a number"`); err != nil {
		t.Fatal(err)
	}
	h.stop("b1")
	h.start("b1")
	// Restoring a readable assignment finds the records still there.
	h.assign(a)
	clustertest.Eventually(t, 10*time.Second, "records kept through an unreadable assignment", func() error {
		got, err := h.readAll("b1", "keep")
		if err != nil {
			return err
		}
		if len(got) != 2 {
			return fmt.Errorf("%d records, want 2", len(got))
		}
		return nil
	})
}
