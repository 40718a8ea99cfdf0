package replica

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A stream deleted and created again at once, the delete and the new
// assignment reaching the manager back to back as one watch response can
// deliver them, is applied: the new assignment reaches the deleted
// stream's copy before that copy's loop drops it, and must not be dropped
// with it. Real Badger in a temp dir; no etcd is needed below the watch.
func TestDeletedAndRecreatedAtOnceIsApplied(t *testing.T) {
	db, err := storage.Open(storage.Options{Dir: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(Config{Node: "b1", Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: time.Second,
		// No history starts: a single copy that never failed over.
		History: func(context.Context, string) (cluster.HistoryStarts, error) { return nil, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		_ = db.Close()
	})
	const stream = "again"
	// publish waits for the copy of incarnation inc (a publish the deleted
	// copy confirmed before its drop would go with it), then publishes.
	publish := func(inc string) {
		t.Helper()
		clustertest.Until(t, 10*time.Second, "the copy of incarnation "+inc, func() bool {
			c := m.copy(stream)
			return c != nil && c.st.State().Incarnation == inc
		})
		clustertest.Until(t, 10*time.Second, "a publish to incarnation "+inc+" confirmed", func() bool {
			_, err := m.Publish(context.Background(), stream, []storage.Record{{Payload: []byte(inc)}})
			return err == nil
		})
	}
	for i, inc := range []string{"one", "two", "three"} {
		a := cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Incarnation: inc}
		if i > 0 {
			m.DeleteAssignment(stream)
		}
		m.SetAssignment(a)
		publish(inc)
		res, err := m.Read(stream, 0, 10, 1<<20)
		if err != nil || len(res.Records) != 1 || string(res.Records[0].Payload) != inc {
			t.Fatalf("incarnation %q holds %v, %v; want only its own record", inc, res.Records, err)
		}
	}
}
