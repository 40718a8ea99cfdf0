// Package metrics is the controller's Prometheus metrics, served at
// /metrics on its listen address (docs/operating.md, "Metrics"). The
// leader's liveness pass sets them from its view of etcd; a controller that
// does not lead reads 0 in every gauge but strand_controller_leader, so
// summing over controllers counts each stream once:
//
//	strand_controller_leader                    1 while this controller leads
//	strand_controller_streams                   streams with an assignment
//	strand_controller_under_replicated_streams  streams with fewer live, in-sync
//	                                            copies than their copies E
//	strand_controller_pending_recoveries        pending recoveries
//	strand_controller_live_brokers              registered brokers
//	strand_controller_election_sessions_lapsed_total
//	                                            election sessions that lapsed
//	                                            (no keep-alive answer within
//	                                            the lease TTL)
//	strand_controller_election_leases_resumed_total
//	                                            of those, the ones whose lease
//	                                            etcd still held: kept alive
//	                                            again, the term went on
//
// Every controller has a registry of its own, so controllers running in one
// process (tests, strandctl dev) do not share series.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where a controller serves its metrics.
const Path = "/metrics"

// Controller holds one controller's collectors.
type Controller struct {
	registry        *prometheus.Registry
	leader          prometheus.Gauge
	streams         prometheus.Gauge
	underReplicated prometheus.Gauge
	recoveries      prometheus.Gauge
	liveBrokers     prometheus.Gauge
}

// Pass is what one liveness pass counted.
type Pass struct {
	Streams           int
	UnderReplicated   int
	PendingRecoveries int
	LiveBrokers       int
}

// New registers a controller's collectors, with the Go runtime's and the
// process's, on a registry of its own.
func New() *Controller {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "strand", Subsystem: "controller", Name: name, Help: help})
	}
	c := &Controller{
		registry: prometheus.NewRegistry(),
		leader:   gauge("leader", "1 while this controller leads (serves AdminService and runs the liveness loop), else 0."),
		streams:  gauge("streams", "Streams with an assignment, as the leader's last liveness pass saw them."),
		underReplicated: gauge("under_replicated_streams",
			"Streams with fewer live, in-sync copies than their copies E (attention kind under_replicated), as the leader's last liveness pass saw them."),
		recoveries:  gauge("pending_recoveries", "Pending recoveries, as the leader's last liveness pass saw them."),
		liveBrokers: gauge("live_brokers", "Registered brokers, as the leader's last liveness pass saw them."),
	}
	c.registry.MustRegister(c.leader, c.streams, c.underReplicated, c.recoveries, c.liveBrokers,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return c
}

// Sessions registers the series of the election lease's sessions: those
// that lapsed, and those that went on under the same lease because etcd
// still held it.
func (c *Controller) Sessions(lapsed, resumed func() int64) {
	counter := func(name, help string, f func() int64) prometheus.CounterFunc {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "strand", Subsystem: "controller", Name: name, Help: help},
			func() float64 { return float64(f()) })
	}
	c.registry.MustRegister(
		counter("election_sessions_lapsed_total", "Election sessions of this controller that lapsed: no keep-alive answer within the lease TTL.", lapsed),
		counter("election_leases_resumed_total", "Lapsed election sessions whose lease etcd still held: kept alive again, and a term it held went on.", resumed),
	)
}

// Handler serves the registry in the Prometheus exposition format.
func (c *Controller) Handler() http.Handler {
	return promhttp.HandlerFor(c.registry, promhttp.HandlerOpts{Registry: c.registry})
}

// Observe records one liveness pass of the leader.
func (c *Controller) Observe(p Pass) {
	c.leader.Set(1)
	c.streams.Set(float64(p.Streams))
	c.underReplicated.Set(float64(p.UnderReplicated))
	c.recoveries.Set(float64(p.PendingRecoveries))
	c.liveBrokers.Set(float64(p.LiveBrokers))
}

// Follow records that this controller does not lead: what it counted as
// leader is another's to report now.
func (c *Controller) Follow() {
	c.leader.Set(0)
	c.streams.Set(0)
	c.underReplicated.Set(0)
	c.recoveries.Set(0)
	c.liveBrokers.Set(0)
}
