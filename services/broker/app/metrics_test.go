package app

import (
	"fmt"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/internal/metrics"
)

// scrape reads node's /metrics.
func (h *harness) scrape(node string) map[string]*dto.MetricFamily {
	h.t.Helper()
	resp, err := http.Get(rpcserver.BaseURL(h.addrs[node]) + metrics.Path)
	if err != nil {
		h.t.Fatalf("scrape %s: %v", node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("scrape %s: %s", node, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		h.t.Fatalf("scrape %s: %v", node, err)
	}
	return fams
}

// histogramCount is the sample count of the histogram name with the given
// label (empty: the only series), or -1 when there is none.
func histogramCount(fams map[string]*dto.MetricFamily, name, label, value string) int {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	for _, m := range f.GetMetric() {
		match := label == ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				match = true
			}
		}
		if match {
			return int(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// counterValue is the value of counter name (its only series), or -1 when
// there is none.
func counterValue(fams map[string]*dto.MetricFamily, name string) float64 {
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) != 1 {
		return -1
	}
	return f.GetMetric()[0].GetCounter().GetValue()
}

// TestMetricsShowWhereAPublishWaits: every stage a publish passes through
// is counted where it happens. With local_durable every copy must hold a
// record before it is confirmed, so each follower has applied and
// acknowledged the batch by the time Publish returns.
func TestMetricsShowWhereAPublishWaits(t *testing.T) {
	h := newHarness(t, "b1", "b2", "b3")
	h.assign(threeCopies("metered", cluster.Policy{Name: cluster.LocalDurable}))
	const publishes = 5
	for i := range publishes {
		h.publish("b1", "metered", fmt.Sprintf("record-%d", i))
	}

	owner := h.scrape("b1")
	for _, c := range []struct {
		name, label, value string
		want               func(int) bool
		what               string
	}{
		// harness.publish retries only failed attempts, which are not
		// observed: exactly one sample per confirmed publish.
		{"strand_broker_publish_confirm_seconds", "", "", func(n int) bool { return n == publishes }, fmt.Sprint(publishes)},
		{"strand_broker_publish_durable_seconds", "", "", func(n int) bool { return n == publishes }, fmt.Sprint(publishes)},
		{"strand_broker_commit_write_seconds", "", "", func(n int) bool { return n >= publishes }, fmt.Sprintf("at least %d", publishes)},
		{"strand_broker_commit_sync_seconds", "", "", func(n int) bool { return n >= publishes }, fmt.Sprintf("at least %d", publishes)},
		{"strand_broker_follow_ack_seconds", "follower", "b2", func(n int) bool { return n >= 1 }, "at least 1"},
		{"strand_broker_follow_ack_seconds", "follower", "b3", func(n int) bool { return n >= 1 }, "at least 1"},
	} {
		if n := histogramCount(owner, c.name, c.label, c.value); !c.want(n) {
			t.Errorf("owner b1: %s{%s=%q} has %d samples, want %s", c.name, c.label, c.value, n, c.what)
		}
	}
	// The owner applies no follow batches; the followers confirm nothing.
	if n := histogramCount(owner, "strand_broker_follow_apply_seconds", "", ""); n != 0 {
		t.Errorf("owner b1: follow_apply_seconds has %d samples, want 0", n)
	}
	for _, node := range []string{"b2", "b3"} {
		f := h.scrape(node)
		if n := histogramCount(f, "strand_broker_follow_apply_seconds", "", ""); n < 1 {
			t.Errorf("follower %s: follow_apply_seconds has %d samples, want at least 1", node, n)
		}
		if v := counterValue(f, "strand_broker_follow_stored_bytes_total"); v <= 0 {
			t.Errorf("follower %s: follow_stored_bytes_total = %v, want the replicated records' bytes", node, v)
		}
		if n := histogramCount(f, "strand_broker_commit_sync_seconds", "", ""); n < 1 {
			t.Errorf("follower %s: commit_sync_seconds has %d samples, want at least 1", node, n)
		}
		if n := histogramCount(f, "strand_broker_publish_confirm_seconds", "", ""); n != 0 {
			t.Errorf("follower %s: publish_confirm_seconds has %d samples, want 0", node, n)
		}
	}
	if v := counterValue(owner, "strand_broker_follow_stored_bytes_total"); v != 0 {
		t.Errorf("owner b1: follow_stored_bytes_total = %v, want 0: it follows nothing", v)
	}
	if v := counterValue(owner, "strand_broker_publish_confirm_timeouts_total"); v != 0 {
		t.Errorf("owner b1: publish_confirm_timeouts_total = %v, want 0: every publish confirmed", v)
	}
	// The Go runtime and process collectors are on each broker's registry.
	if _, ok := owner["go_goroutines"]; !ok {
		t.Error("owner b1: no go_goroutines series")
	}
}
