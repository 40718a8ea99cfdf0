package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/clustertest"
)

func stored(payloads ...string) []*strandv1.StoredRecord {
	recs := make([]*strandv1.StoredRecord, len(payloads))
	for i, p := range payloads {
		recs[i] = &strandv1.StoredRecord{Offset: uint64(i), Payload: []byte(p), Epoch: 1, ProducerId: "prod", Sequence: uint64(i)}
	}
	return recs
}

func TestVerify(t *testing.T) {
	l := New()
	l.Confirm("a", 0, 1)
	l.Confirm("b", 1, 1)
	l.Fail("c", errors.New("timeout"))
	if found, problems := l.Verify(stored("a", "b", "c")); found != 2 || len(problems) != 0 {
		t.Errorf("a clean read: found %d, problems %q", found, problems)
	}
	if l.Count() != 2 || l.Failures() != 1 || l.End() != 2 || l.AtEpoch(1) != 2 || l.FirstAt(1).IsZero() {
		t.Errorf("count %d failures %d end %d at epoch 1 %d", l.Count(), l.Failures(), l.End(), l.AtEpoch(1))
	}

	for _, c := range []struct {
		name string
		recs []*strandv1.StoredRecord
		want string
	}{
		{"lost", stored("a"), "1 confirmed records missing"},
		{"moved", stored("b", "a"), `"a" confirmed at 0 is stored at 1`},
		{"stored twice", stored("a", "b", "c", "c"), `"c" stored at offset 2 (epoch 1 producer prod seq 2) and at offset 3 (epoch 1 producer prod seq 3)`},
	} {
		_, problems := l.Verify(c.recs)
		if !strings.Contains(strings.Join(problems, "\n"), c.want) {
			t.Errorf("%s: problems %q, want one with %q", c.name, problems, c.want)
		}
	}

	l.Confirm("d", 1, 1)
	if _, problems := l.Verify(stored("a", "b")); !strings.Contains(strings.Join(problems, "\n"), "offset 1 confirmed for b and for d") {
		t.Errorf("two confirms at one offset: problems %q", problems)
	}
}

func TestStartReportsMalformedAnswers(t *testing.T) {
	l := New()
	publish := func(ctx context.Context, stream string, records []*strandv1.Record) (*strandv1.PublishResponse, error) {
		return &strandv1.PublishResponse{Epoch: 1}, nil // no offset
	}
	p := Start(publish, "s", "x", 1, time.Second, l)
	clustertest.Eventually(t, 5*time.Second, "a failed publish counted", func() bool { return l.Failures() > 0 })
	p.Stop()
	if l.Count() != 0 || l.Failures() == 0 {
		t.Errorf("count %d failures %d, want only failures", l.Count(), l.Failures())
	}
	if _, problems := l.Verify(nil); len(problems) == 0 || !strings.Contains(problems[0], "answered with 0 offsets for one record") {
		t.Errorf("problems %q", problems)
	}
}
