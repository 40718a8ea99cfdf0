package onebox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// An owner ships records to followers before its own fsync ends, so after
// a machine crash a follower may hold records the owner lost. An owner that
// comes back after an unclean stop on a new boot must therefore not
// continue its epoch: it stands down, names itself suspect, and the
// controller recovers the stream at a new epoch, with every confirmed
// record kept. The controller and recoverer are stopped while the owner is
// away, so the only way the stream can move to a new epoch is the owner
// standing down.
func TestOwnerStandsDownAfterUncleanStopOnNewBoot(t *testing.T) {
	c := three(t)
	a := c.CreateStream("sd", 3, majority)
	c.WaitApplied(a)
	l := ledger.New()
	publishAll(t, c, "sd", l, "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8")

	c.StopController(1)
	c.StopRecoverer(c.LeadingRecoverer())
	c.StopBroker(a.Owner)
	// Play the crash: a stop that leaves no clean mark (storage writes
	// STRAND_CLEAN only on a clean close), then a reboot.
	if err := os.Remove(filepath.Join(c.dir, a.Owner, "STRAND_CLEAN")); err != nil {
		t.Fatalf("the owner's clean stop left no clean mark: %v", err)
	}
	c.SetBootID("onebox-boot-2")
	c.StartBroker(a.Owner)

	clustertest.Eventually(t, 10*time.Second, a.Owner+" names itself suspect at epoch "+fmt.Sprint(a.Epoch), func() error {
		tails, ok := c.Tails(a.Owner, "sd")
		if !ok || tails.Suspect != a.Owner || tails.Epoch != a.Epoch {
			return fmt.Errorf("tails %+v (found %v)", tails, ok)
		}
		return nil
	})
	refused := func() {
		t.Helper()
		_, err := c.Streams(a.Owner).Publish(c.Ctx(), connect.NewRequest(&strandv1.PublishRequest{
			Stream: "sd", Records: []*strandv1.Record{{Payload: []byte("at the old epoch")}},
		}))
		var cerr *connect.Error
		if !errors.As(err, &cerr) || cerr.Code() != connect.CodeUnavailable {
			t.Fatalf("publish to the standing-down owner: %v, want Unavailable", err)
		}
	}
	refused()

	// The owner's process dies again on the same boot, before any new
	// epoch: the boot id no longer tells, but the copy still knows it may
	// have lost written records (storage keeps it in the copy's metadata),
	// and stands down again.
	c.StopBroker(a.Owner)
	if err := os.Remove(filepath.Join(c.dir, a.Owner, "STRAND_CLEAN")); err != nil {
		t.Fatalf("the owner's clean stop left no clean mark: %v", err)
	}
	c.StartBroker(a.Owner)
	clustertest.Eventually(t, 10*time.Second, a.Owner+" names itself suspect at epoch "+fmt.Sprint(a.Epoch)+" after a restart on the same boot", func() error {
		tails, ok := c.Tails(a.Owner, "sd")
		if !ok || tails.Suspect != a.Owner || tails.Epoch != a.Epoch {
			return fmt.Errorf("tails %+v (found %v)", tails, ok)
		}
		return nil
	})
	refused()

	c.StartController()
	c.StartRecoverer()
	na := waitRecovered(t, c, "sd", a.Epoch, 30*time.Second)
	publishAll(t, c, "sd", l, "b1", "b2", "b3")
	for _, n := range append([]string{na.Owner}, na.Followers...) {
		clustertest.Eventually(t, 20*time.Second, n+" holds every confirmed record", func() error {
			recs, err := c.ReadAll(n, "sd")
			if err != nil {
				return err
			}
			if found, problems := l.Verify(recs); len(problems) > 0 || found != l.Count() {
				return fmt.Errorf("%d of %d confirmed records, problems %v", found, l.Count(), problems)
			}
			return nil
		})
	}
}
