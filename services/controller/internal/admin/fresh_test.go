package admin

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

// Calls sharing reads of a fresh snapshot (state.View.Fresh) each see every write finished
// before they asked: each of many concurrent callers writes a stream spec
// and then finds it in the snapshot it gets.
func TestSharedFreshHoldsWritesBefore(t *testing.T) {
	f := startFlood(t, Config{}, "b1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			name := fmt.Sprintf("s-%03d", i)
			spec := cluster.StreamSpec{Name: name, Copies: 1}
			if _, err := f.cli.Put(ctx, f.schema.StreamKey(name), cluster.Encode(spec)); err != nil {
				t.Error(err)
				return
			}
			snap, err := f.view.Fresh(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if _, ok := snap.Streams[name]; !ok {
				t.Errorf("%s written before the call is not in its snapshot at revision %d", name, snap.Rev)
			}
		})
	}
	wg.Wait()
}
