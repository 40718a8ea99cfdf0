package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Where a publish waits, stage by stage: the bench reads the brokers'
// /metrics histograms (services/broker/internal/metrics) before and after
// its publishing window and reports each stage's mean over the window, so
// a run shows whether the owner's disk, the followers' disks or the trip
// between them hold the confirm up.

// histogram is a broker histogram's sample sum and count, summed over its
// label series (follow_ack_seconds has one per follower).
type histogram struct {
	sum   float64
	count uint64
}

// brokerHistograms maps a metric name, without the strand_broker_ prefix,
// to its histogram on one broker.
type brokerHistograms map[string]histogram

const brokerMetricPrefix = "strand_broker_"

// scrapeHistograms reads the /metrics histograms of the broker at base (its URL).
func scrapeHistograms(ctx context.Context, hc *http.Client, base string) (brokerHistograms, error) {
	fams, err := scrapeFamilies(ctx, hc, base)
	if err != nil {
		return nil, err
	}
	out := brokerHistograms{}
	for name, f := range fams {
		if !strings.HasPrefix(name, brokerMetricPrefix) {
			continue
		}
		var h histogram
		for _, m := range f.GetMetric() {
			if hm := m.GetHistogram(); hm != nil {
				h.sum += hm.GetSampleSum()
				h.count += hm.GetSampleCount()
			}
		}
		out[strings.TrimPrefix(name, brokerMetricPrefix)] = h
	}
	return out, nil
}

// scrapeFamilies reads the /metrics at base (a broker's URL), by metric name.
func scrapeFamilies(ctx context.Context, hc *http.Client, base string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", base, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", base, err)
	}
	return fams, nil
}

// stageMeans turns the histograms read before and after the window into
// mean milliseconds per stage. Owner stages come from owner's histograms,
// follower stages from every other broker's taken together. With owner
// empty (many streams: every broker owns some and follows others) every
// stage comes from every broker, and the committer's stages, which then
// serve both roles at once, are commit_write and commit_sync. A stage with
// no samples in the window is left out.
func stageMeans(owner string, before, after map[string]brokerHistograms) map[string]float64 {
	type stage struct{ key, metric string }
	ownerStages := []stage{
		{"publish_durable", "publish_durable_seconds"},
		{"publish_confirm", "publish_confirm_seconds"},
		{"owner_commit_write", "commit_write_seconds"},
		{"owner_commit_sync", "commit_sync_seconds"},
		{"follow_ack", "follow_ack_seconds"},
	}
	followerStages := []stage{
		{"follower_commit_write", "commit_write_seconds"},
		{"follower_commit_sync", "commit_sync_seconds"},
		{"follow_apply", "follow_apply_seconds"},
	}
	out := map[string]float64{}
	mean := func(key, metric string, nodes func(string) bool) {
		var sum float64
		var count uint64
		for node, a := range after {
			b, ok := before[node]
			if !ok || !nodes(node) {
				continue
			}
			ha, hb := a[metric], b[metric]
			if ha.count < hb.count {
				continue // the broker restarted: its counters began again
			}
			sum += ha.sum - hb.sum
			count += ha.count - hb.count
		}
		if count > 0 {
			out[key] = math.Round(sum/float64(count)*1e6) / 1e3
		}
	}
	if owner == "" {
		every := func(string) bool { return true }
		for _, s := range append(ownerStages, followerStages...) {
			key := s.key
			if strings.HasSuffix(s.metric, "commit_write_seconds") || strings.HasSuffix(s.metric, "commit_sync_seconds") {
				key = strings.TrimSuffix(s.metric, "_seconds")
			}
			mean(key, s.metric, every)
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	for _, s := range ownerStages {
		mean(s.key, s.metric, func(n string) bool { return n == owner })
	}
	for _, s := range followerStages {
		mean(s.key, s.metric, func(n string) bool { return n != owner })
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
