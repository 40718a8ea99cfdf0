package coord

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/broker/internal/replica"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A broker answers NotFound only for a stream that does not exist
// (docs/errors.md): a stream its assignment watch has not brought yet,
// though the watch runs, is Unavailable, and so is one whose absence etcd
// cannot confirm. The manager here is fed no watch at all, which is what
// a lagging watch looks like from the manager's side; the read is the
// broker's real one (Coord.ReadStream) against real etcd.
func TestUnknownStreamIsNotFoundOnlyOnceEtcdConfirmsIt(t *testing.T) {
	co, e := newTestCoord(t)
	m, cli, schema := co.cfg.Manager, co.cfg.Client, co.cfg.Schema

	if _, err := m.Locate(t.Context(), "fresh"); !errors.Is(err, replica.ErrUnavailable) {
		t.Fatalf("Locate before the assignments were listed: %v, want ErrUnavailable", err)
	}
	m.SyncAssignments(nil, nil)
	if _, err := m.Locate(t.Context(), "fresh"); !errors.Is(err, replica.ErrUnknownStream) {
		t.Fatalf("Locate of a stream etcd does not hold: %v, want ErrUnknownStream", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := cluster.Assignment{Stream: "fresh", Epoch: 1, Owner: "b2", Followers: []string{"b1", "b3"}, Incarnation: "i1"}
	if _, err := cli.Put(ctx, schema.AssignmentKey("fresh"), cluster.Encode(a)); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"Locate", func() error { _, err := m.Locate(t.Context(), "fresh"); return err }},
		{"Read", func() error { _, err := m.Read(t.Context(), "fresh", 0, 10, 1<<20); return err }},
		{"Publish", func() error {
			_, err := m.Publish(ctx, "fresh", []storage.Record{{Payload: []byte("x")}})
			return err
		}},
	} {
		err := call.do()
		if !errors.Is(err, replica.ErrUnavailable) || errors.Is(err, replica.ErrUnknownStream) {
			t.Fatalf("%s of a stream etcd holds but the watch has not brought: %v, want ErrUnavailable", call.name, err)
		}
		if !strings.Contains(err.Error(), "watch has not brought") {
			t.Fatalf("%s: %v, want it to say the watch lags", call.name, err)
		}
	}

	if _, err := cli.Delete(ctx, schema.AssignmentKey("fresh")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Locate(t.Context(), "fresh"); !errors.Is(err, replica.ErrUnknownStream) {
		t.Fatalf("Locate of a deleted stream: %v, want ErrUnknownStream", err)
	}

	// The read that would confirm the absence is the caller's: a call
	// that has ended does not have it made (nor waits for it), so nothing
	// is promised to it either.
	ended, end := context.WithCancel(ctx)
	end()
	if _, err := m.Locate(ended, "fresh"); !errors.Is(err, replica.ErrUnavailable) {
		t.Fatalf("Locate by a caller that has gone: %v, want ErrUnavailable (the read is bounded by the call)", err)
	}

	// etcd gone: absence cannot be confirmed, so it is not promised.
	e.Close()
	if _, err := m.Locate(t.Context(), "fresh"); !errors.Is(err, replica.ErrUnavailable) {
		t.Fatalf("Locate with etcd down: %v, want ErrUnavailable", err)
	}
}
