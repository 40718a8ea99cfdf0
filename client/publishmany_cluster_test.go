package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/clustertest"
)

// Many streams published to at once through PublishAsync, a window of
// records in flight spread over them round robin (so each stream has a
// fraction of a record in flight and the client gathers streams into
// PublishMany calls), with the owner of several of them handed over to a
// follower in the middle: every call is confirmed, and reading each stream
// back finds dense offsets holding exactly the confirmed payloads, none
// lost and none twice.
func TestPublishAsyncManyStreamsThroughAnOwnerChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(client.Config{Brokers: box.Addrs(), Controller: box.ControllerAddr()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	const (
		streams   = 24
		perStream = 40
		window    = 64
	)
	names := make([]string, streams)
	for i := range names {
		names[i] = fmt.Sprintf("many-%02d", i)
		if _, err := c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: names[i], Copies: 3,
			Policy: &strandv1.ConfirmPolicy{Name: "majority_durable"}})); err != nil {
			t.Fatalf("create %s: %v", names[i], err)
		}
	}
	defer func() {
		for _, n := range names {
			_, _ = c.Admin().DeleteStream(context.Background(), connect.NewRequest(&strandv1.DeleteStreamRequest{Name: n}))
		}
	}()

	type confirm struct {
		payload string
		offset  uint64
	}
	var (
		mu        sync.Mutex
		confirmed = map[string][]confirm{}
		failures  []error
		inFlight  = make(chan struct{}, window)
		wg        sync.WaitGroup
		sent      int
	)
	handover := make(chan struct{})
	publish := func(stream string, i int) {
		inFlight <- struct{}{}
		wg.Add(1)
		payload := fmt.Sprintf("%s/%d", stream, i)
		c.PublishAsync(ctx, stream, []*strandv1.Record{{Payload: []byte(payload)}}, func(res *strandv1.PublishResponse, err error) {
			defer wg.Done()
			defer func() { <-inFlight }()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Errorf("%s: %w", payload, err))
				return
			}
			confirmed[stream] = append(confirmed[stream], confirm{payload: payload, offset: res.GetOffsets()[0]})
		})
		sent++
		if sent == streams*perStream/2 {
			close(handover)
		}
	}
	// The owner change: every stream the owner of the first one owns is
	// handed over to one of its followers, while publishing goes on.
	moved := make(chan error, 1)
	go func() {
		<-handover
		first, ok := box.Assignment(names[0])
		if !ok {
			moved <- fmt.Errorf("no assignment of %s", names[0])
			return
		}
		n := 0
		for _, name := range names {
			a, ok := box.Assignment(name)
			if !ok || a.Owner != first.Owner || len(a.Followers) == 0 {
				continue
			}
			if _, err := c.Admin().Failover(ctx, connect.NewRequest(&strandv1.FailoverRequest{Stream: name, Who: "test", Why: "owner change under PublishMany", To: a.Followers[0]})); err != nil {
				moved <- fmt.Errorf("hand %s over to %s: %w", name, a.Followers[0], err)
				return
			}
			n++
		}
		if n == 0 {
			moved <- fmt.Errorf("no stream handed over")
			return
		}
		moved <- nil
	}()
	for i := range perStream {
		for _, s := range names {
			publish(s, i)
		}
	}
	wg.Wait()
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if len(failures) > 0 {
		t.Fatalf("%d publishes failed, first: %v", len(failures), failures[0])
	}
	if client.PublishManyCalls(c) == 0 {
		t.Fatal("no PublishMany answered: every attempt went alone")
	}
	for _, name := range names {
		want := map[uint64]string{}
		for _, cf := range confirmed[name] {
			if p, dup := want[cf.offset]; dup {
				t.Fatalf("%s: offset %d confirmed for %s and %s", name, cf.offset, p, cf.payload)
			}
			want[cf.offset] = cf.payload
		}
		if len(want) != perStream {
			t.Fatalf("%s: %d records confirmed, want %d", name, len(want), perStream)
		}
		var got []*strandv1.StoredRecord
		clustertest.Eventually(t, 30*time.Second, name+" read back whole", func() error {
			got = got[:0]
			for next := uint64(0); ; {
				res, err := c.Read(ctx, &strandv1.ReadRequest{Stream: name, FromOffset: next})
				if err != nil {
					return err
				}
				got = append(got, res.GetRecords()...)
				if len(res.GetRecords()) == 0 || res.GetNextOffset() >= res.GetConfirmWatermark() {
					break
				}
				next = res.GetNextOffset()
			}
			if len(got) < perStream {
				return fmt.Errorf("%d records read, want %d", len(got), perStream)
			}
			return nil
		})
		seen := map[string]bool{}
		for i, r := range got {
			p := string(r.GetPayload())
			if r.GetOffset() != uint64(i) {
				t.Fatalf("%s: record %d at offset %d: offsets not dense", name, i, r.GetOffset())
			}
			if seen[p] {
				t.Fatalf("%s: %s stored twice", name, p)
			}
			seen[p] = true
			if want[r.GetOffset()] != p {
				t.Fatalf("%s: offset %d holds %s, confirmed for %q", name, r.GetOffset(), p, want[r.GetOffset()])
			}
		}
		if len(got) != perStream {
			t.Fatalf("%s: %d records stored, %d confirmed", name, len(got), perStream)
		}
	}
}
