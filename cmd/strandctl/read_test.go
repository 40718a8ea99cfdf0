package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox"
)

// inProcess runs a strandctl command in this process against an onebox
// cluster and returns its exit code, stdout and stderr.
func inProcess(t *testing.T, c *onebox.Cluster, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	args = append(args, "--controller", c.ControllerAddr(), "--broker", strings.Join(c.Addrs(), ","), "--timeout", "10s")
	code := run(ctx, args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// readOffsets parses `strandctl read --json` into offsets and payloads.
func readOffsets(t *testing.T, out string) ([]uint64, []string) {
	t.Helper()
	var (
		offs     []uint64
		payloads []string
	)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var rec struct {
			Offset  string `json:"offset"`
			Payload []byte `json:"payload"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("read --json line %q: %v", sc.Text(), err)
		}
		off, err := strconv.ParseUint(rec.Offset, 10, 64)
		if err != nil {
			t.Fatalf("offset %q: %v", rec.Offset, err)
		}
		offs = append(offs, off)
		payloads = append(payloads, string(rec.Payload))
	}
	return offs, payloads
}

// TestReadFromEarliestAfterRetention: once retention has moved a stream's
// head past 0, `read --from earliest` starts at the head (the oldest record
// still retained, as Kafka's auto.offset.reset=earliest and NATS's
// DeliverAll do), while an explicit offset below the head stays an error
// naming that offset: records are never skipped silently for it.
func TestReadFromEarliestAfterRetention(t *testing.T) {
	c := onebox.Start(t, onebox.Options{Brokers: []string{"b1"}, Controllers: 1})
	const (
		stream    = "retained"
		published = 20
		keep      = 5
		head      = published - keep
	)
	ctl := func(args ...string) string {
		t.Helper()
		code, out, errb := inProcess(t, c, args...)
		if code != 0 {
			t.Fatalf("strandctl %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errb)
		}
		return out
	}
	ctl("stream", "create", stream, "--copies", "1", "--policy", "local_durable", "--retention-records", strconv.Itoa(keep))
	a, ok := c.Assignment(stream)
	if !ok {
		t.Fatalf("no assignment of %s", stream)
	}
	c.WaitApplied(a)
	payloads := onebox.Numbered("rec", published)
	ctl(append([]string{"publish", stream}, payloads...)...)

	// The broker's retention runs every few seconds; its heartbeat shows
	// the head once it moved. No publish follows, so it stays there.
	clustertest.Eventually(t, 20*time.Second, "retention to move the head to "+strconv.Itoa(head), func() error {
		tails, ok := c.Tails("b1", stream)
		if !ok || tails.Head != head {
			return fmt.Errorf("heartbeat tails %+v (present %v)", tails, ok)
		}
		return nil
	})

	wantOffs := make([]uint64, 0, keep)
	for off := uint64(head); off < published; off++ {
		wantOffs = append(wantOffs, off)
	}
	offs, got := readOffsets(t, ctl("read", stream, "--from", "earliest", "--json"))
	if !slices.Equal(offs, wantOffs) || !slices.Equal(got, payloads[head:]) {
		t.Fatalf("read --from earliest: offsets %v payloads %v; want offsets %v payloads %v", offs, got, wantOffs, payloads[head:])
	}
	offs, _ = readOffsets(t, ctl("read", stream, "--from", "earliest", "--max", "2", "--json"))
	if !slices.Equal(offs, wantOffs[:2]) {
		t.Fatalf("read --from earliest --max 2: offsets %v, want %v", offs, wantOffs[:2])
	}
	// The table output starts at the head too.
	lines := strings.Split(strings.TrimSpace(ctl("read", stream, "--from", "earliest")), "\n")
	if len(lines) != keep+1 || strings.Fields(lines[1])[0] != strconv.Itoa(head) || strings.Fields(lines[keep])[1] != payloads[published-1] {
		t.Fatalf("read --from earliest (table):\n%s\nwant a header and offsets %d..%d", strings.Join(lines, "\n"), head, published-1)
	}

	// An explicit offset below the head is an error naming it; one at the
	// head reads the same records as earliest.
	for _, from := range []string{"0", strconv.Itoa(head - 1)} {
		code, out, errb := inProcess(t, c, "read", stream, "--from", from, "--json")
		if code != 1 || out != "" || !strings.Contains(errb, "out_of_range") || !strings.Contains(errb, "from_offset: ") || !strings.Contains(errb, " "+from+" is below the retained head") {
			t.Fatalf("read --from %s below the head %d: exit %d, stdout %q, stderr %q; want exit 1, no records, out_of_range naming from_offset %s", from, head, code, out, errb, from)
		}
	}
	offs, _ = readOffsets(t, ctl("read", stream, "--from", strconv.Itoa(head), "--json"))
	if !slices.Equal(offs, wantOffs) {
		t.Fatalf("read --from %d: offsets %v, want %v", head, offs, wantOffs)
	}
}
