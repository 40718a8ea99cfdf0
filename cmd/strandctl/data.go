package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/cmd/strandctl/internal/bench"
)

func dataCommands() []*command {
	var (
		count       uint64
		size        uint
		inflight    uint
		batch       uint
		noIdem      bool
		from        string
		maxRecs     uint64
		subFrom     string
		cursor      string
		commitEvery uint64
	)
	return []*command{
		{
			name: "publish", args: "NAME [RECORD...]", summary: "publish records: arguments, stdin lines, or --count N --size BYTES of generated load",
			flags: func(fs *flag.FlagSet) {
				fs.Uint64Var(&count, "count", 0, "publish N generated records instead of arguments or stdin")
				fs.UintVar(&size, "size", 1024, "payload size of generated records, in bytes")
				fs.UintVar(&inflight, "inflight", 64, "generated records in flight at once")
				fs.UintVar(&batch, "batch", 500, "stdin lines per publish, at most")
				fs.BoolVar(&noIdem, "no-idempotence", false, "publish without producer id and sequences")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, -1, "NAME"); err != nil {
					return err
				}
				stream, records := args[0], args[1:]
				if count > 0 && len(records) > 0 {
					return usagef("give records as arguments or --count, not both")
				}
				if count > 0 && (inflight < 1 || size < 1) {
					return usagef("--inflight and --size must be at least 1")
				}
				if batch < 1 {
					return usagef("--batch must be at least 1")
				}
				c, err := e.client(client.Config{Idempotent: client.Bool(!noIdem)})
				if err != nil {
					return err
				}
				defer func() { _ = c.Close() }()
				switch {
				case count > 0:
					return publishLoad(ctx, e, c, stream, count, int(size), int(inflight))
				case len(records) > 0:
					rs := make([]*strandv1.Record, len(records))
					for i, r := range records {
						rs[i] = &strandv1.Record{Payload: []byte(r)}
					}
					return publishOnce(ctx, e, c, stream, rs)
				default:
					return publishLines(ctx, e, c, stream, int(batch))
				}
			},
		},
		{
			name: "read", args: "NAME", summary: "read confirmed records from an offset",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&from, "from", "0", "first offset, or earliest: the oldest record still retained")
				fs.Uint64Var(&maxRecs, "max", 0, "read at most N records (0: up to the confirm watermark)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				start, earliest := uint64(0), from == "earliest"
				if !earliest {
					n, err := strconv.ParseUint(from, 10, 64)
					if err != nil {
						return usagef("--from %q: want an offset or earliest", from)
					}
					start = n
				}
				c, err := e.client(client.Config{})
				if err != nil {
					return err
				}
				defer func() { _ = c.Close() }()
				return readRecords(ctx, e, c, args[0], start, earliest, maxRecs)
			},
		},
		{
			name: "subscribe", args: "NAME", summary: "follow a stream's records live (Ctrl-C stops)",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&subFrom, "from", "", "earliest, latest or an offset (default: the cursor's position with --cursor, else earliest)")
				fs.StringVar(&cursor, "cursor", "", "named cursor to start from and commit to")
				fs.Uint64Var(&commitEvery, "commit-every", 0, "commit the cursor after every N records (0: only when stopping)")
			},
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 1, 1, "NAME"); err != nil {
					return err
				}
				opts, err := subscribeStart(subFrom, cursor)
				if err != nil {
					return err
				}
				if commitEvery > 0 && cursor == "" {
					return usagef("--commit-every needs --cursor")
				}
				c, err := e.client(client.Config{})
				if err != nil {
					return err
				}
				defer func() { _ = c.Close() }()
				return subscribe(ctx, e, c, args[0], opts, cursor, commitEvery)
			},
		},
		{
			name: "cursor commit", args: "NAME CURSOR OFFSET", summary: "move a named cursor to its next unsettled offset",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 3, 3, "NAME CURSOR OFFSET"); err != nil {
					return err
				}
				off, err := strconv.ParseUint(args[2], 10, 64)
				if err != nil {
					return usagef("OFFSET %q is not a number", args[2])
				}
				c, err := e.client(client.Config{})
				if err != nil {
					return err
				}
				defer func() { _ = c.Close() }()
				ctx, cancel := e.withTimeout(ctx)
				defer cancel()
				res, err := c.CommitCursor(ctx, args[0], args[1], off)
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				fmt.Fprintf(e.stdout, "cursor %s of %s at %d (cursor event %d)\n", args[1], args[0], res.GetOffset(), res.GetCursorEventOffset())
				return nil
			},
		},
		{
			name: "cursor get", args: "NAME CURSOR", summary: "show a named cursor's next unsettled offset",
			run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
				if err := needArgs(args, 2, 2, "NAME CURSOR"); err != nil {
					return err
				}
				c, err := e.client(client.Config{})
				if err != nil {
					return err
				}
				defer func() { _ = c.Close() }()
				ctx, cancel := e.withTimeout(ctx)
				defer cancel()
				res, err := c.GetCursor(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				if e.g.json {
					return printMessage(e.stdout, res)
				}
				if !res.GetFound() {
					fmt.Fprintf(e.stdout, "cursor %s of %s not committed yet (offset %d)\n", args[1], args[0], res.GetOffset())
					return nil
				}
				fmt.Fprintf(e.stdout, "%d\n", res.GetOffset())
				return nil
			},
		},
	}
}

func publishOnce(ctx context.Context, e *env, c *client.Client, stream string, rs []*strandv1.Record) error {
	ctx, cancel := e.withTimeout(ctx)
	defer cancel()
	res, err := c.Publish(ctx, stream, rs)
	if err != nil {
		return err
	}
	if e.g.json {
		return printMessage(e.stdout, res)
	}
	offs := res.GetOffsets()
	if len(offs) == 1 {
		fmt.Fprintf(e.stdout, "published at offset %d\n", offs[0])
	} else {
		fmt.Fprintf(e.stdout, "published %d records at offsets %d..%d\n", len(offs), offs[0], offs[len(offs)-1])
	}
	return nil
}

// publishLines publishes stdin lines, batching what is already available so
// piped input goes fast and typed input goes out line by line.
func publishLines(ctx context.Context, e *env, c *client.Client, stream string, batch int) error {
	lines := make(chan string, batch)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(e.stdin)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				readErr <- ctx.Err()
				return
			}
		}
		close(lines)
		readErr <- sc.Err()
	}()
	total := 0
	for {
		var rs []*strandv1.Record
		select {
		case l, ok := <-lines:
			if !ok {
				if err := <-readErr; err != nil {
					return fmt.Errorf("reading stdin: %w", err)
				}
				if !e.g.json {
					fmt.Fprintf(e.stderr, "published %d records\n", total)
				}
				return nil
			}
			rs = append(rs, &strandv1.Record{Payload: []byte(l)})
		case <-ctx.Done():
			return ctx.Err()
		}
	drain:
		for len(rs) < batch {
			select {
			case l, ok := <-lines:
				if !ok {
					// Put the close back for the outer loop.
					lines = closedLines()
					break drain
				}
				rs = append(rs, &strandv1.Record{Payload: []byte(l)})
			default:
				break drain
			}
		}
		if err := publishOnce(ctx, e, c, stream, rs); err != nil {
			return err
		}
		total += len(rs)
	}
}

func closedLines() chan string {
	ch := make(chan string)
	close(ch)
	return ch
}

// publishLoad publishes count generated records with inflight publishers and
// reports the confirmed count and rate.
func publishLoad(ctx context.Context, e *env, c *client.Client, stream string, count uint64, size, inflight int) error {
	var (
		next      atomic.Uint64
		confirmed atomic.Uint64
		dups      atomic.Uint64
		mu        sync.Mutex
		lat       []time.Duration
		firstErr  error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range inflight {
		wg.Go(func() {
			var mine []time.Duration
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for {
				i := next.Add(1)
				if i > count || ctx.Err() != nil {
					return
				}
				payload := bench.Payload(fmt.Sprintf("strandctl-%d-", i), size)
				t0 := time.Now()
				res, err := c.Publish(ctx, stream, []*strandv1.Record{{Payload: payload}})
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				mine = append(mine, time.Since(t0))
				confirmed.Add(1)
				if d := res.GetDuplicate(); len(d) > 0 && d[0] {
					dups.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := confirmed.Load()
	sum := bench.Summarize(lat)
	out := map[string]any{
		"confirmed":      n,
		"duplicates":     dups.Load(),
		"seconds":        elapsed.Seconds(),
		"records_per_s":  float64(n) / elapsed.Seconds(),
		"mb_per_s":       float64(n) * float64(size) / 1e6 / elapsed.Seconds(),
		"confirm_p50_ms": sum.P50,
		"confirm_p99_ms": sum.P99,
	}
	if e.g.json {
		if err := printJSON(e.stdout, out); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "confirmed %d records of %d bytes in %.2fs: %.0f records/s, %.1f MB/s, confirm p50 %.2f ms, p99 %.2f ms\n",
			n, size, elapsed.Seconds(), out["records_per_s"], out["mb_per_s"], sum.P50, sum.P99)
	}
	if firstErr != nil {
		return fmt.Errorf("after %d confirmed: %w", n, firstErr)
	}
	return nil
}

// readRecords reads from start, or with earliest from the stream's head (the
// oldest record retention kept), until max records or, with max 0, until
// the confirm watermark. Only the first read starts at the head: the next
// ones ask for the offset after the last record shown, and retention moving
// the head past it meanwhile is an error naming that offset, never a gap
// in what is printed.
func readRecords(ctx context.Context, e *env, c *client.Client, stream string, start uint64, earliest bool, max uint64) error {
	ctx, cancel := e.withTimeout(ctx)
	defer cancel()
	var t *table
	if !e.g.json {
		t = newTable(e.stdout, "OFFSET", "PAYLOAD")
		defer t.flush()
	}
	next, got := start, uint64(0)
	for max == 0 || got < max {
		req := &strandv1.ReadRequest{Stream: stream, FromOffset: next, FromEarliest: earliest}
		earliest = false
		if max > 0 {
			req.MaxRecords = uint32(min(max-got, 10000))
		}
		res, err := c.Read(ctx, req)
		if err != nil {
			return err
		}
		if len(res.GetRecords()) == 0 {
			return nil
		}
		for _, r := range res.GetRecords() {
			if e.g.json {
				if err := printMessage(e.stdout, r); err != nil {
					return err
				}
			} else {
				t.row(r.GetOffset(), payloadText(r.GetPayload()))
			}
			got++
			next = r.GetOffset() + 1
			if max > 0 && got >= max {
				return nil
			}
		}
		if n := res.GetNextOffset(); n > next {
			next = n
		}
	}
	return nil
}

func subscribeStart(from, cursor string) (client.SubscribeOptions, error) {
	var o client.SubscribeOptions
	switch {
	case from == "" && cursor != "":
		o.Start, o.Cursor = strandv1.StartPosition_START_POSITION_CURSOR, cursor
	case from == "" || from == "earliest":
		o.Start = strandv1.StartPosition_START_POSITION_EARLIEST
	case from == "latest":
		o.Start = strandv1.StartPosition_START_POSITION_LATEST
	default:
		n, err := strconv.ParseUint(from, 10, 64)
		if err != nil {
			return o, usagef("--from %q: want earliest, latest or an offset", from)
		}
		o.Start, o.Offset = strandv1.StartPosition_START_POSITION_OFFSET, n
	}
	return o, nil
}

// subscribe prints records until ctx ends, committing the cursor every
// commitEvery records and once more when stopping.
func subscribe(ctx context.Context, e *env, c *client.Client, stream string, opts client.SubscribeOptions, cursor string, commitEvery uint64) error {
	sub := c.Subscribe(ctx, stream, opts)
	defer func() { _ = sub.Close() }()
	w := bufio.NewWriter(e.stdout)
	defer func() { _ = w.Flush() }()
	var sinceCommit uint64
	committed := uint64(0)
	commit := func(ctx context.Context) error {
		next, ok := sub.Next()
		if cursor == "" || !ok || next == committed {
			return nil
		}
		cctx, cancel := e.withTimeout(ctx)
		defer cancel()
		if _, err := c.CommitCursor(cctx, stream, cursor, next); err != nil {
			return fmt.Errorf("commit cursor %s at %d: %w", cursor, next, err)
		}
		committed, sinceCommit = next, 0
		return nil
	}
	for {
		recs, err := sub.Recv()
		if err != nil {
			_ = w.Flush()
			if ctx.Err() != nil {
				// Ctrl-C: settle the cursor where we stopped.
				return commit(context.WithoutCancel(ctx))
			}
			return err
		}
		for _, r := range recs {
			if e.g.json {
				if err := printMessage(w, r); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(w, "%d\t%s\n", r.GetOffset(), payloadText(r.GetPayload()))
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		sinceCommit += uint64(len(recs))
		if commitEvery > 0 && sinceCommit >= commitEvery {
			if err := commit(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
		}
	}
}
