package onebox

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// TestRecreatedStreamIgnoresStaleCopyOfDeletedStream: a broker that was
// down while a stream was deleted and recreated under the same name still
// holds the deleted stream's copy when it returns. History starts are
// dropped with the stream so a recreated stream does not inherit them; the
// same must hold for that copy: the returning broker must never show the
// deleted stream's records as the recreated stream's (readers are only shown
// confirmed records, and copies' logs are prefixes of each other on the
// confirmed range), and once placement gives it a copy of the recreated
// stream it must hold the recreated stream's records.
//
// Assignments carry the stream's incarnation; a copy of another incarnation
// is dropped.
func TestRecreatedStreamIgnoresStaleCopyOfDeletedStream(t *testing.T) {
	t.Parallel()
	c := three(t)
	const stream = "stale"
	a0 := c.CreateStream(stream, 2, majority)
	away := a0.Followers[0]
	publishAll(t, c, stream, ledger.New(), Numbered("old", 10)...)
	waitTails(t, c, away, stream, 10, 0)
	c.StopBroker(away)
	if _, err := c.Admin().DeleteStream(c.Ctx(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: stream})); err != nil {
		t.Fatal(err)
	}
	b0 := c.CreateStream(stream, 2, majority)
	if b0.Includes(away) {
		t.Fatalf("recreated on %+v; the test needs %s left out", b0, away)
	}
	l := ledger.New()
	publishAll(t, c, stream, l, Numbered("new", 3)...)
	recs := verify(t, c, b0.Owner, stream, l)

	c.StartBroker(away)
	c.WaitApplied(b0)
	// Left out of the recreated stream, the broker must not answer reads
	// of the deleted one under its name.
	if got, err := c.ReadAll(away, stream); err == nil && len(got) > 0 && SameRecords(b0.Owner, recs, away, got) != nil {
		t.Errorf("%s, left out of the recreated %s, serves the deleted stream's records %v", away, stream, Payloads(got))
	}
	// Placed as a follower of the recreated stream, it holds its records.
	if _, err := c.Admin().UpdateStream(c.Ctx(), connect.NewRequest(&strandv1.UpdateStreamRequest{Name: stream, Copies: 3})); err != nil {
		t.Fatal(err)
	}
	if a, _ := c.Assignment(stream); !a.Includes(away) {
		t.Fatalf("assignment %+v after growing to 3 copies on 3 brokers", a)
	}
	clustertest.Eventually(t, 15*time.Second, away+" holds the recreated stream's records", func() error {
		got, err := c.ReadAll(away, stream)
		if err != nil {
			return err
		}
		if err := SameRecords(b0.Owner, recs, away, got); err != nil {
			tt, _ := c.Tails(away, stream)
			return fmt.Errorf("%v; %s publishes %+v; payloads %v", err, away, tt, Payloads(got))
		}
		return nil
	})
}
