package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// jsonOpts prints every field under its proto name, so scripts see
// record_tail: 0 rather than a missing key.
var jsonOpts = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// printMessage writes one message as one line of JSON.
func printMessage(w io.Writer, m proto.Message) error {
	b, err := jsonOpts.Marshal(m)
	if err != nil {
		return err
	}
	// protojson's output is one line when not multiline; compact it so the
	// bytes are stable for tests and tools.
	var v json.RawMessage = b
	out, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

// printJSON writes a plain value as one line of JSON.
func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(anySlice(header)...)
	return t
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func (t *table) row(cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(t.tw, strings.Join(parts, "\t"))
}

func (t *table) flush() { _ = t.tw.Flush() }

// payloadText shows a payload as text when it is printable UTF-8, quoted
// otherwise.
func payloadText(b []byte) string {
	if utf8.Valid(b) && !strings.ContainsAny(string(b), "\n\r\t\x00") {
		return string(b)
	}
	return strconv.Quote(string(b))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sinceString renders a time an entry or a copy has been so, "-" when not
// known.
func sinceString(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

func orDash(n uint64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(n, 10)
}

// printEach prints one JSON object per line.
func printEach[M proto.Message](w io.Writer, msgs []M) error {
	for _, m := range msgs {
		if err := printMessage(w, m); err != nil {
			return err
		}
	}
	return nil
}
