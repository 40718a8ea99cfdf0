// Quickstart is a small program on the Strand Go client: it connects to a
// cluster, creates a stream of three copies, publishes a few records with
// the idempotent producer, reads them back through a named cursor, commits
// the cursor, and prints what it read.
//
// Where the cluster is: --controller and --broker (or STRAND_CONTROLLER and
// STRAND_BROKER), else the dev cluster `make run` (strandctl dev) records in
// .strand/cluster.json, looked for in the working directory and its parents
// (--data-dir names another). From the examples module:
//
//	go run ./quickstart
//	go run ./quickstart --stream orders --records 5
//
// It exits 0 once it read back what it published, 1 with an error on
// stderr otherwise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
)

// copies is how many copies the quickstart's stream has: an owner and two
// followers, so it survives the loss of any one broker.
const copies = 3

// errStreamDiffers says the stream exists with a configuration other than
// the quickstart's, so it is someone else's stream and is left alone.
var errStreamDiffers = errors.New("quickstart: the stream exists with another configuration")

type options struct {
	controller, broker, dataDir, stream, cursor string
	records                                     int
	timeout                                     time.Duration
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.controller, "controller", os.Getenv("STRAND_CONTROLLER"), "controller address (env STRAND_CONTROLLER)")
	fs.StringVar(&o.broker, "broker", os.Getenv("STRAND_BROKER"), "broker addresses, comma separated (env STRAND_BROKER)")
	fs.StringVar(&o.dataDir, "data-dir", "", "dev cluster data dir holding cluster.json (default: .strand here or in a parent)")
	fs.StringVar(&o.stream, "stream", "quickstart", "stream to create and publish to")
	fs.StringVar(&o.cursor, "cursor", "quickstart", "named cursor to read with")
	fs.IntVar(&o.records, "records", 3, "records to publish (1..1000)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long the whole run may take")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.records < 1 || o.records > 1000 {
		fmt.Fprintf(stderr, "quickstart: --records must be 1..1000, got %d\n", o.records)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := quickstart(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "quickstart: %v\n", err)
		if advice := adviceFor(err); advice != "" {
			fmt.Fprintf(stderr, "quickstart: %s\n", advice)
		}
		return 1
	}
	return 0
}

// config says where the cluster is: the flags (or their environment
// variables) when given, else the dev cluster's cluster.json.
func config(o options) (client.Config, error) {
	if o.controller == "" && o.broker == "" {
		return client.DevClusterConfig(o.dataDir)
	}
	cfg := client.Config{Controller: o.controller}
	for _, b := range strings.Split(o.broker, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	return cfg, nil
}

func quickstart(ctx context.Context, o options, out io.Writer) error {
	cfg, err := config(o)
	if err != nil {
		return err
	}
	if cfg.Controller == "" {
		return errors.New("creating a stream needs the controller: pass --controller or set STRAND_CONTROLLER")
	}
	// Idempotent by default: each record gets this client's producer id
	// and a sequence, so a publish retried after a lost answer is stored
	// once.
	c, err := client.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()

	if err := ensureStream(ctx, c, o.stream); err != nil {
		return err
	}
	fmt.Fprintf(out, "stream %s: %d copies\n", o.stream, copies)

	records := make([]*strandv1.Record, o.records)
	for i := range records {
		records[i] = &strandv1.Record{Payload: fmt.Appendf(nil, "quickstart record %d", i+1)}
	}
	res, err := c.Publish(ctx, o.stream, records)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	offsets := res.GetOffsets()
	fmt.Fprintf(out, "published %d records at offsets %d..%d\n", len(offsets), offsets[0], offsets[len(offsets)-1])

	// Read with the named cursor from where it stands (the start of the
	// stream the first time) until what was just published is in.
	last := offsets[len(offsets)-1]
	sub := c.Subscribe(ctx, o.stream, client.SubscribeOptions{Start: strandv1.StartPosition_START_POSITION_CURSOR, Cursor: o.cursor})
	defer sub.Close()
	read := 0
	for next, _ := sub.Next(); read == 0 || next <= last; next, _ = sub.Next() {
		recs, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
		for _, r := range recs {
			fmt.Fprintf(out, "read %d: %s\n", r.GetOffset(), r.GetPayload())
			read++
		}
	}
	// The cursor is the reader's next unsettled offset: past what it read.
	next, _ := sub.Next()
	if _, err := c.CommitCursor(ctx, o.stream, o.cursor, next); err != nil {
		return fmt.Errorf("commit cursor: %w", err)
	}
	fmt.Fprintf(out, "read %d records; cursor %s committed at %d\n", read, o.cursor, next)
	return nil
}

// ensureStream creates the stream, or finds the one that exists: fine if
// it has the quickstart's copies, someone else's stream otherwise.
func ensureStream(ctx context.Context, c *client.Client, name string) error {
	_, err := c.Admin().CreateStream(ctx, connect.NewRequest(&strandv1.CreateStreamRequest{Name: name, Copies: copies}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		if err != nil {
			return fmt.Errorf("create stream %s: %w", name, err)
		}
		return nil
	}
	got, err := c.Admin().GetStream(ctx, connect.NewRequest(&strandv1.GetStreamRequest{Name: name}))
	if err != nil {
		return fmt.Errorf("get stream %s: %w", name, err)
	}
	if n := got.Msg.GetSpec().GetCopies(); n != copies {
		return fmt.Errorf("%w: %s has %d copies, not %d (pick another --stream)", errStreamDiffers, name, n, copies)
	}
	return nil
}

// adviceFor says what to do about err, from its code and typed details.
func adviceFor(err error) string {
	switch {
	case errors.Is(err, client.ErrNoDevCluster):
		return "start a cluster with `make run`, or pass --controller and --broker"
	case errors.Is(err, errStreamDiffers):
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer in time (last answer %v): is the cluster running and reachable?", connect.CodeOf(err))
	}
	if fv := client.FieldViolations(err); len(fv) > 0 {
		return fmt.Sprintf("the cluster refused %s: %s", fv[0].GetField(), fv[0].GetDescription())
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		return "the cluster is not serving right now; try again"
	case connect.CodeFailedPrecondition:
		return "the cluster cannot do it in its current state (too few live brokers for 3 copies?)"
	}
	return ""
}
