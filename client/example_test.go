package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
)

// configFromEnv says where the cluster is, as a program deployed next to
// it would read it: the controller from STRAND_CONTROLLER, the brokers from
// STRAND_BROKER (comma separated). client.DevClusterConfig reads the same
// from a dev cluster's cluster.json instead.
func configFromEnv() client.Config {
	cfg := client.Config{Controller: os.Getenv("STRAND_CONTROLLER")}
	for _, b := range strings.Split(os.Getenv("STRAND_BROKER"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	return cfg
}

// createStream creates a stream of three copies for an example and
// returns a func that deletes it again.
func createStream(ctx context.Context, c *client.Client, name string) (func(), error) {
	_, err := c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: 3}))
	if err != nil {
		return nil, err
	}
	return func() {
		_, _ = c.Admin().DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: name}))
	}, nil
}

func ExampleNew() {
	// New does not dial: the first call finds the controller leader and
	// the brokers.
	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Admin().ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		fmt.Println(err)
		return
	}
	live := 0
	for _, b := range res.Msg.GetBrokers() {
		if b.GetLive() {
			live++
		}
	}
	fmt.Println("live brokers:", live)
	// Output: live brokers: 3
}

func ExampleClient_Admin() {
	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Three copies, confirmed once a majority of them hold a record
	// durably.
	res, err := c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{
		Name:   "orders",
		Copies: 3,
		Policy: &strandv1.ConfirmPolicy{Name: "majority_durable"},
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	spec, a := res.Msg.GetSpec(), res.Msg.GetAssignment()
	fmt.Printf("stream %s: %d copies, %s, epoch %d, an owner and %d followers\n",
		spec.GetName(), spec.GetCopies(), spec.GetPolicy().GetName(), a.GetEpoch(), len(a.GetFollowers()))

	// The same request again: AlreadyExists, the stream as it was.
	_, err = c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "orders", Copies: 3}))
	fmt.Println("again:", connect.CodeOf(err))

	if _, err := c.Admin().DeleteStream(ctx, connect.NewRequest(&strandv1.DeleteStreamRequest{Name: "orders"})); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("deleted")
	// Output:
	// stream orders: 3 copies, majority_durable, epoch 1, an owner and 2 followers
	// again: already_exists
	// deleted
}

func ExampleClient_Publish() {
	// Publishes are idempotent by default: the client stamps a producer id
	// and sequences, so a retry after a lost answer is stored once.
	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drop, err := createStream(ctx, c, "payments")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	// Publish returns once the stream's confirm policy holds for every
	// record: they are durable on a majority of the copies.
	res, err := c.Publish(ctx, "payments", []*strandv1.Record{
		{Payload: []byte("paid #1001"), Headers: map[string]string{"currency": "EUR"}},
		{Payload: []byte("paid #1002"), Headers: map[string]string{"currency": "USD"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("offsets:", res.GetOffsets(), "epoch:", res.GetEpoch())
	// Output: offsets: [0 1] epoch: 1
}

func ExampleClient_PublishAsync() {
	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drop, err := createStream(ctx, c, "clicks")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	// One goroutine keeps many records in flight; the client merges them
	// into batches. done runs once per call, in call order on the stream's
	// lane, and must not block.
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		offsets []uint64
		failed  error
	)
	for i := range 5 {
		wg.Add(1)
		c.PublishAsync(ctx, "clicks", []*strandv1.Record{{Payload: fmt.Appendf(nil, "click %d", i)}}, func(res *strandv1.PublishResponse, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = err
				return
			}
			offsets = append(offsets, res.GetOffsets()...)
		})
	}
	wg.Wait()
	if failed != nil {
		fmt.Println(failed)
		return
	}
	fmt.Println("confirmed, in the order published:", offsets)
	// Output: confirmed, in the order published: [0 1 2 3 4]
}

func ExampleClient_Subscribe() {
	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drop, err := createStream(ctx, c, "invoices")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := c.Publish(ctx, "invoices", []*strandv1.Record{{Payload: []byte("inv-1")}, {Payload: []byte("inv-2")}}); err != nil {
		fmt.Println(err)
		return
	}

	// consume reads from where the named cursor "mailer" stands until it
	// has n records, then commits the cursor past them, so the next reader
	// with the cursor starts after them.
	consume := func(n int) error {
		sub := c.Subscribe(ctx, "invoices", client.SubscribeOptions{
			Start:  strandv1.StartPosition_START_POSITION_CURSOR,
			Cursor: "mailer",
		})
		defer sub.Close()
		var got []*strandv1.StoredRecord
		for len(got) < n {
			recs, err := sub.Recv()
			if err != nil {
				return err
			}
			got = append(got, recs...)
		}
		for _, r := range got {
			fmt.Printf("%d: %s\n", r.GetOffset(), r.GetPayload())
		}
		next := got[len(got)-1].GetOffset() + 1
		_, err := c.CommitCursor(ctx, "invoices", "mailer", next)
		return err
	}
	if err := consume(2); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := c.Publish(ctx, "invoices", []*strandv1.Record{{Payload: []byte("inv-3")}}); err != nil {
		fmt.Println(err)
		return
	}
	// A reader that starts again from the cursor sees only what is new.
	if err := consume(1); err != nil {
		fmt.Println(err)
		return
	}
	cur, err := c.GetCursor(ctx, "invoices", "mailer")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("cursor mailer at", cur.GetOffset())
	// Output:
	// 0: inv-1
	// 1: inv-2
	// 2: inv-3
	// cursor mailer at 3
}

func ExampleClient_Read() {
	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drop, err := createStream(ctx, c, "audit")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := c.Publish(ctx, "audit", []*strandv1.Record{{Payload: []byte("login")}, {Payload: []byte("update")}, {Payload: []byte("logout")}}); err != nil {
		fmt.Println(err)
		return
	}

	// Read returns confirmed records only (below the confirm watermark),
	// and where to read next.
	res, err := c.Read(ctx, &strandv1.ReadRequest{Stream: "audit", FromOffset: 1, MaxRecords: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range res.GetRecords() {
		fmt.Printf("%d: %s\n", r.GetOffset(), r.GetPayload())
	}
	fmt.Println("next offset:", res.GetNextOffset(), "confirm watermark:", res.GetConfirmWatermark())
	// Output:
	// 1: update
	// 2: logout
	// next offset: 3 confirm watermark: 3
}

// A program decides what to do from the code of an error and its typed
// details, never from its message: the client keeps the cluster's answer
// in the errors it returns.
func Example_errors() {
	explain := func(err error) string {
		if err == nil {
			return "ok"
		}
		if errors.Is(err, context.DeadlineExceeded) {
			// The client retried until the deadline; the code is that of
			// the last answer.
			return fmt.Sprintf("gave up at the deadline, last answer %v", connect.CodeOf(err))
		}
		if _, ok := client.OwnerHint(err); ok {
			return "not the owner: send it to the hinted owner"
		}
		if hint, ok := client.LeaderHint(err); ok {
			return "not the controller leader: send it to " + hint.GetAddress()
		}
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodeResourceExhausted:
			var fields []string
			for _, v := range client.FieldViolations(err) {
				fields = append(fields, v.GetField())
			}
			return "bad request, fix " + strings.Join(fields, ", ")
		case connect.CodeNotFound:
			return "no such stream: give up"
		case connect.CodeAlreadyExists:
			return "exists already"
		case connect.CodeUnavailable:
			return "try again later"
		}
		var cerr *connect.Error
		if errors.As(err, &cerr) {
			return "other answer: " + cerr.Code().String()
		}
		return "not an answer of the cluster: " + err.Error()
	}

	c, err := client.New(configFromEnv())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drop, err := createStream(ctx, c, "ledger")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	_, err = c.Publish(ctx, "Not A Name", []*strandv1.Record{{Payload: []byte("x")}})
	fmt.Println("publish to a bad name:", explain(err))

	_, err = c.Read(ctx, &strandv1.ReadRequest{Stream: "no-such-stream"})
	fmt.Println("read of a stream that does not exist:", explain(err))

	_, err = c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: "ledger", Copies: 1}))
	fmt.Println("create of a name taken:", explain(err))

	// The generated client does no redirects: a broker that does not own
	// the stream answers with a hint naming the owner.
	loc, err := c.Locate(ctx, "ledger")
	if err != nil {
		fmt.Println(err)
		return
	}
	brokers := configFromEnv().Brokers
	other := brokers[(slices.Index(brokers, loc.GetOwner().GetAddress())+1)%len(brokers)]
	raw := strandv1connect.NewStreamServiceClient(http.DefaultClient, "http://"+other)
	_, err = raw.Publish(ctx, connect.NewRequest(&strandv1.PublishRequest{Stream: "ledger", Records: []*strandv1.Record{{Payload: []byte("x")}}}))
	fmt.Println("publish at a broker that does not own the stream:", explain(err))

	nowhere, err := client.New(client.Config{Controller: "127.0.0.1:1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nowhere.Close()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	_, err = nowhere.Admin().ListStreams(short, connect.NewRequest(&strandv1.ListStreamsRequest{}))
	fmt.Println("admin call where no controller listens:", explain(err))
	// Output:
	// publish to a bad name: bad request, fix stream
	// read of a stream that does not exist: no such stream: give up
	// create of a name taken: exists already
	// publish at a broker that does not own the stream: not the owner: send it to the hinted owner
	// admin call where no controller listens: gave up at the deadline, last answer unavailable
}
