// Package metrics is a broker's Prometheus metrics, served at /metrics on
// its listener. They show where a publish waits, stage by stage, so an
// operator can tell a slow disk from a slow follower or a slow network
// (docs/operating.md, "Metrics"):
//
//	strand_broker_commit_write_seconds       committer: one batch into Badger
//	strand_broker_commit_sync_seconds        committer: that batch's fsync
//	strand_broker_publish_durable_seconds    owner: publish queued to durable here
//	strand_broker_publish_confirm_seconds    owner: publish queued to confirmed by W copies
//	strand_broker_publish_confirm_timeouts_total
//	                                         owner: publishes answered Unavailable because
//	                                         fewer than W copies held them in time
//	strand_broker_follow_ack_seconds         owner: a batch sent to a follower to its
//	                                         acknowledgement, by follower
//	strand_broker_follow_apply_seconds       follower: a batch received to durable here
//	strand_broker_follow_stored_bytes_total  follower: record bytes received on Follow and
//	                                         stored here (what a rejoin re-replicates)
//	strand_broker_follow_calls_total         owner: Follow calls served (one per follower
//	                                         broker while its call holds; each carries
//	                                         every stream the two brokers share)
//	strand_broker_follow_calls               owner: Follow calls being served
//	strand_broker_follows                    owner: stream follows on those calls
//	strand_broker_publishes_waiting          publishes waiting for room among the
//	                                         publish bytes in flight (--max-publish-inflight-bytes)
//	strand_broker_publish_inflight_bytes     request bytes of the publishes being handled
//	strand_broker_publishes_refused_total    publishes answered Unavailable for want of room
//	strand_broker_heartbeat_ticks_total      heartbeat intervals gone through while registered
//	strand_broker_heartbeat_txns_total       heartbeat transactions written (one etcd revision each)
//	strand_broker_heartbeat_tails_skipped_total
//	                                         tails passes that read no status: none changed
//	strand_broker_heartbeat_omitted_copies   copies left out of the heartbeat for want of room
//	strand_broker_orphan_copies              copies their stream's assignment leaves out,
//	                                         kept while the orphan grace runs (--orphan-grace)
//	strand_broker_orphan_checks_held_total   orphan checks past the grace that kept the copy
//	                                         (a pending recovery names the broker, or etcd unread)
//	strand_broker_orphan_copies_deleted_total
//	                                         orphan copies deleted
//	strand_broker_orphan_bytes_reclaimed_total
//	                                         retained bytes those copies held
//
// Every broker has a registry of its own, so brokers running in one process
// (tests, strandctl dev) do not share series.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where a broker serves its metrics.
const Path = "/metrics"

// Broker holds one broker's collectors. A nil *Broker records nothing, so
// components built without metrics (unit tests) need no checks.
type Broker struct {
	registry       *prometheus.Registry
	commitWrite    prometheus.Histogram
	commitSync     prometheus.Histogram
	publishDurable prometheus.Histogram
	publishConfirm prometheus.Histogram
	confirmTimeout prometheus.Counter
	followAck      *prometheus.HistogramVec
	followApply    prometheus.Histogram
	followStored   prometheus.Counter
	followCalls    prometheus.Counter
	followCallsNow prometheus.Gauge
	followsNow     prometheus.Gauge
	orphanDeleted  prometheus.Counter
	orphanBytes    prometheus.Counter
}

// buckets run from 100 µs to about 6.5 s, doubling: a fsync on a fast
// disk is in the first few, a confirm that took most of the confirm
// timeout (5 s) in the last. A publish that timed out is not a confirm:
// publish_confirm_timeouts_total counts it.
var buckets = prometheus.ExponentialBuckets(100e-6, 2, 17)

// New registers a broker's collectors, with the Go runtime's and the
// process's, on a registry of its own.
func New() *Broker {
	hist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "strand", Subsystem: "broker", Name: name, Help: help, Buckets: buckets})
	}
	b := &Broker{
		registry:       prometheus.NewRegistry(),
		commitWrite:    hist("commit_write_seconds", "Time the committer takes to write one batch of operations into Badger, before its fsync (a batch split at Badger's transaction bound includes the fsync between its parts)."),
		commitSync:     hist("commit_sync_seconds", "Time the fsync of one committed batch takes (group commit: one per batch, for every stream)."),
		publishDurable: hist("publish_durable_seconds", "Owner: time from a publish being queued for the log to its records being durable on the owner."),
		publishConfirm: hist("publish_confirm_seconds", "Owner: time from a publish being queued for the log to W copies holding it durably (the confirm)."),
		confirmTimeout: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "strand", Subsystem: "broker", Name: "publish_confirm_timeouts_total",
			Help: "Owner: publishes answered Unavailable because fewer than W copies held their records durably within the confirm timeout (the records may remain, unconfirmed).",
		}),
		followAck: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "strand", Subsystem: "broker", Name: "follow_ack_seconds", Buckets: buckets,
			Help: "Owner: time from sending a batch of records to a follower to the follower acknowledging it durable.",
		}, []string{"follower"}),
		followApply: hist("follow_apply_seconds", "Follower: time from receiving a batch of records from the owner to holding it durably."),
		followStored: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "strand", Subsystem: "broker", Name: "follow_stored_bytes_total",
			Help: "Follower: bytes of records received from owners on Follow and stored here durably (record segments as sent)."}),
		followCalls: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "strand", Subsystem: "broker", Name: "follow_calls_total",
			Help: "Owner: Follow calls served; a follower broker holds one call here for every stream the two share."}),
		followCallsNow: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "strand", Subsystem: "broker", Name: "follow_calls",
			Help: "Owner: Follow calls being served."}),
		followsNow: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "strand", Subsystem: "broker", Name: "follows",
			Help: "Owner: stream follows being served on the Follow calls."}),
		orphanDeleted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "strand", Subsystem: "broker", Name: "orphan_copies_deleted_total",
			Help: "Orphan copies deleted: copies of existing streams whose assignment left this broker out for the orphan grace."}),
		orphanBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "strand", Subsystem: "broker", Name: "orphan_bytes_reclaimed_total",
			Help: "Retained record bytes the deleted orphan copies held (the disk the value log GC gets back)."}),
	}
	b.registry.MustRegister(b.commitWrite, b.commitSync, b.publishDurable, b.publishConfirm, b.confirmTimeout, b.followAck, b.followApply, b.followStored,
		b.followCalls, b.followCallsNow, b.followsNow, b.orphanDeleted, b.orphanBytes,
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return b
}

// gaugeOf is a broker gauge read from f at each scrape.
func gaugeOf(name, help string, f func() int64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "strand", Subsystem: "broker", Name: name, Help: help},
		func() float64 { return float64(f()) })
}

// counterOf is a broker counter read from f at each scrape.
func counterOf(name, help string, f func() int64) prometheus.CounterFunc {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "strand", Subsystem: "broker", Name: name, Help: help},
		func() float64 { return float64(f()) })
}

// PublishGate registers the series of the publish bytes bound: publishes
// waiting for room, the bytes those admitted hold, and publishes refused
// for want of room.
func (b *Broker) PublishGate(waiting, held, refused func() int64) {
	if b == nil {
		return
	}
	b.registry.MustRegister(
		gaugeOf("publishes_waiting", "Publishes waiting, before they are read, for room among the publish request bytes in flight (--max-publish-inflight-bytes).", waiting),
		gaugeOf("publish_inflight_bytes", "Request bytes of the publishes being read and handled (at most --max-publish-inflight-bytes).", held),
		counterOf("publishes_refused_total", "Publishes answered Unavailable, unread, because they did not fit among the publish bytes in flight (--max-publish-inflight-bytes) in time.", refused),
	)
}

// PublishesAwaitingRecovery registers the gauge of publishes held, each
// for up to a second, for their copy sealed for a recovery to take the
// recovery's assignment in.
func (b *Broker) PublishesAwaitingRecovery(held func() int64) {
	if b == nil {
		return
	}
	b.registry.MustRegister(gaugeOf("publishes_awaiting_recovery", "Publishes held, each up to a second, for their copy sealed for a recovery to take in the recovery's assignment; then served as its owner or refused Unavailable.", held))
}

// Heartbeats registers the series of the broker's heartbeat: the
// intervals it went through, the transactions it wrote (on change only, so
// an idle broker's stays flat while its ticks grow), and the copies its
// shards leave out for want of room.
func (b *Broker) Heartbeats(ticks, txns, skipped, omitted func() int64) {
	if b == nil {
		return
	}
	b.registry.MustRegister(
		counterOf("heartbeat_ticks_total", "Heartbeat intervals the broker went through while registered, whether or not it wrote anything in them.", ticks),
		counterOf("heartbeat_txns_total", "Heartbeat transactions the broker wrote to etcd, each one revision: written when a copy's status changes, never on a clock alone.", txns),
		counterOf("heartbeat_tails_skipped_total", "Heartbeat tails passes that read no copy's status because none changed since everything was published (every tenth interval reads all the same).", skipped),
		gaugeOf("heartbeat_omitted_copies", "Copies left out of the broker's heartbeat shards because a shard would pass its size bound; the controller sees no status for them.", omitted),
	)
}

// Sessions registers the series of the broker's etcd sessions: those that
// lapsed while it ran, and those that went on under the same lease.
func (b *Broker) Sessions(lapsed, resumed func() int64) {
	if b == nil {
		return
	}
	b.registry.MustRegister(
		counterOf("etcd_sessions_lapsed_total", "etcd sessions of the broker's lease that lapsed while it ran: no keep-alive answer within the lease TTL (etcd unreachable, or its answers late).", lapsed),
		counterOf("etcd_leases_resumed_total", "Sessions that went on under the lease of the session before because etcd still held it: the broker's registration and streams stayed put.", resumed),
	)
}

// Orphans registers the series of copies left out of their stream's
// assignment: those waiting out the orphan grace, and the checks past it
// that kept the copy.
func (b *Broker) Orphans(waiting, held func() int64) {
	if b == nil {
		return
	}
	b.registry.MustRegister(
		gaugeOf("orphan_copies", "Copies whose stream's assignment leaves this broker out, kept while the orphan grace (--orphan-grace) runs.", waiting),
		counterOf("orphan_checks_held_total", "Orphan checks past the grace that kept the copy: a pending recovery names this broker, etcd's assignment includes it after all, or etcd could not be read.", held),
	)
}

// OrphanDeleted records an orphan copy deleted, with the retained bytes it
// held.
func (b *Broker) OrphanDeleted(bytes uint64) {
	if b == nil {
		return
	}
	b.orphanDeleted.Inc()
	b.orphanBytes.Add(float64(bytes))
}

// Handler serves the registry in the Prometheus exposition format.
func (b *Broker) Handler() http.Handler {
	return promhttp.HandlerFor(b.registry, promhttp.HandlerOpts{Registry: b.registry})
}

// Commit records one committer batch: its Badger write and, when it was
// synced, its fsync.
func (b *Broker) Commit(write, sync time.Duration, synced bool) {
	if b == nil {
		return
	}
	b.commitWrite.Observe(write.Seconds())
	if synced {
		b.commitSync.Observe(sync.Seconds())
	}
}

// PublishDurable records a publish durable on the owner, since it was
// queued at start.
func (b *Broker) PublishDurable(start time.Time) {
	if b != nil {
		b.publishDurable.Observe(time.Since(start).Seconds())
	}
}

// PublishConfirmed records a publish confirmed, since it was queued at
// start.
func (b *Broker) PublishConfirmed(start time.Time) {
	if b != nil {
		b.publishConfirm.Observe(time.Since(start).Seconds())
	}
}

// PublishConfirmTimedOut counts a publish whose confirm timed out.
func (b *Broker) PublishConfirmTimedOut() {
	if b != nil {
		b.confirmTimeout.Inc()
	}
}

// FollowAcked returns what records a batch acknowledged by follower, sent
// at sent. The follower's series is looked up once, for a stream's follow,
// not once per batch.
func (b *Broker) FollowAcked(follower string) func(sent time.Time) {
	if b == nil {
		return func(time.Time) {}
	}
	o := b.followAck.WithLabelValues(follower)
	return func(sent time.Time) { o.Observe(time.Since(sent).Seconds()) }
}

// FollowApplied records a batch durable on this follower, received at
// received, whose record segment was bytes long.
func (b *Broker) FollowApplied(received time.Time, bytes int) {
	if b != nil {
		b.followApply.Observe(time.Since(received).Seconds())
		b.followStored.Add(float64(bytes))
	}
}

// FollowCall counts a Follow call served from now; the returned func ends
// it.
func (b *Broker) FollowCall() func() {
	if b == nil {
		return func() {}
	}
	b.followCalls.Inc()
	b.followCallsNow.Inc()
	return b.followCallsNow.Dec
}

// Follow counts a stream follow served from now; the returned func ends it.
func (b *Broker) Follow() func() {
	if b == nil {
		return func() {}
	}
	b.followsNow.Inc()
	return b.followsNow.Dec
}
