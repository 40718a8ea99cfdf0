package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	strandclient "github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
)

// startPublishing publishes unique payloads continuously from workers
// goroutines through the Go client, which merges them into batches and rides
// through failovers; every answer goes into l. Publishing stops at the end of
// the test if not before; a call cut short by Stop stays in the ledger as
// failed (unknown outcome).
func startPublishing(t *testing.T, cl *strandclient.Client, stream, prefix string, workers int, l *ledger.Ledger) *ledger.Publisher {
	p := ledger.Start(cl.Publish, stream, prefix, workers, 30*time.Second, l)
	t.Cleanup(p.Stop)
	return p
}

// readAll reads a copy's confirmed records from offset 0 until until,
// waiting while its confirm watermark is below until.
func readAll(ctx context.Context, t *testing.T, what string, until uint64, read func(context.Context, uint64) (*strandv1.ReadResponse, error)) []*strandv1.StoredRecord {
	t.Helper()
	var recs []*strandv1.StoredRecord
	var from uint64
	clustertest.Eventually(t, 60*time.Second, fmt.Sprintf("reading %s up to offset %d", what, until), func() (bool, string) {
		for from < until {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := read(rctx, from)
			cancel()
			if err != nil {
				return false, fmt.Sprintf("read from %d: %v", from, err)
			}
			if len(res.GetRecords()) == 0 {
				return false, fmt.Sprintf("no records at %d yet (confirm watermark %d)", from, res.GetConfirmWatermark())
			}
			for _, r := range res.GetRecords() {
				if r.GetOffset() != from {
					t.Fatalf("%s: record at offset %d where %d was next", what, r.GetOffset(), from)
				}
				recs = append(recs, r)
				from++
			}
		}
		return true, ""
	})
	return recs[:until]
}

// readThroughClient reads the stream from its owner with the Go client.
func readThroughClient(cl *strandclient.Client, stream string) func(context.Context, uint64) (*strandv1.ReadResponse, error) {
	return func(ctx context.Context, from uint64) (*strandv1.ReadResponse, error) {
		return cl.Read(ctx, &strandv1.ReadRequest{Stream: stream, FromOffset: from, MaxRecords: 1000})
	}
}

// readFromCopy reads one broker's copy directly: any copy serves reads below
// its own confirm watermark.
func readFromCopy(b strandv1connect.StreamServiceClient, stream string) func(context.Context, uint64) (*strandv1.ReadResponse, error) {
	return func(ctx context.Context, from uint64) (*strandv1.ReadResponse, error) {
		res, err := b.Read(ctx, connect.NewRequest(&strandv1.ReadRequest{Stream: stream, FromOffset: from, MaxRecords: 1000}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
}

// verifyLedger checks the failover invariant (docs/protocol.md,
// "Invariants") against what clients were told:
// every confirmed record is in recs exactly once, at the offset its confirm
// named, and no record is stored twice (ledger.Ledger.Verify). It returns
// the number of confirmed records checked.
func verifyLedger(t *testing.T, l *ledger.Ledger, recs []*strandv1.StoredRecord) int {
	t.Helper()
	found, problems := l.Verify(recs)
	const shown = 20
	for _, p := range problems[:min(shown, len(problems))] {
		t.Errorf("ledger: %s", p)
	}
	if len(problems) > shown {
		t.Errorf("ledger: … %d more problems", len(problems)-shown)
	}
	if n := l.Count(); found != n {
		t.Errorf("%d of %d confirmed records found at their offsets", found, n)
	}
	return l.Count()
}

// sameRecords checks two copies hold the same records at the same offsets.
func sameRecords(t *testing.T, aName string, a []*strandv1.StoredRecord, bName string, b []*strandv1.StoredRecord) {
	t.Helper()
	if len(a) != len(b) {
		t.Errorf("%s has %d records, %s has %d", aName, len(a), bName, len(b))
		return
	}
	bad := 0
	for i := range a {
		if string(a[i].GetPayload()) != string(b[i].GetPayload()) || a[i].GetChain() != b[i].GetChain() {
			if bad < 10 {
				t.Errorf("offset %d: %s has %q (chain %x), %s has %q (chain %x)", a[i].GetOffset(),
					aName, a[i].GetPayload(), a[i].GetChain(), bName, b[i].GetPayload(), b[i].GetChain())
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d offsets differ between %s and %s", bad, aName, bName)
	}
}

// isCode reports whether err carries a Connect code.
func isCode(err error, code connect.Code) bool {
	var cerr *connect.Error
	return errors.As(err, &cerr) && cerr.Code() == code
}
