package coord

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
)

// maxTxnOps is etcd's default --max-txn-ops: a transaction with more
// operations is refused whole. A heartbeat batch holds at most
// cluster.HeartbeatShards puts, and is split at this bound all the same,
// so a larger shard count could never make every heartbeat fail.
const maxTxnOps = 128

// txnsInFlight bounds the transactions of one pass sent at once. A pass
// is split only past maxTxnOps shards or cluster.MaxHeartbeatTxnBytes of
// values: a broker of some 10,000 copies takes two transactions for every
// shard, one of 80,000 about eight.
const txnsInFlight = 8

// promptDelay gathers the status changes of one burst (an assignment
// listing applied, a recovery's seals) into one transaction: copies apply
// them concurrently, each one signalling, and a write per signal would cost
// a revision per copy.
const promptDelay = 25 * time.Millisecond

// publishMode says which shards a pass writes.
type publishMode int

const (
	// publishPrompt writes the shards where a copy came or went, or
	// changed in what the controller acts on (role, epoch, seal, suspect
	// owner, chain mismatch: liveness, attention and recovery), or took in
	// an assignment (state.Snapshot.HeardSince).
	publishPrompt publishMode = iota
	// publishTails writes, once per heartbeat interval, what publishPrompt
	// writes and the shards where a copy's tails need publishing
	// (tailsNeedWrite): not every move, only one an observer can tell.
	publishTails
)

// tailStep is how far a copy's published tails may trail its own before a
// tails pass writes them: half the controller's in-sync slack
// (cluster.InSyncSlack). An owner's and a follower's published record
// tails then each trail theirs by less than tailStep, so the lag the
// controller computes from them is off by less than tailStep either way:
// a follower that keeps up is judged in sync, one further behind than the
// slack plus tailStep is judged lagging, and a move the judgement cannot
// tell apart costs no write (docs/etcd-schema.md, "Heartbeat shards").
// Without it a loaded broker rewrote every shard with a moving tail on
// every interval, a shard holding hundreds of copies for one record each.
const tailStep = cluster.InSyncSlack / 2

// maxTailsSkips bounds the tails passes skipped in a row because nothing
// changed (heartbeats.gen): every (maxTailsSkips+1)th interval reads every
// copy's status whatever the generation says, so a change some path failed
// to count is still published within that many intervals.
const maxTailsSkips = 9

// heartbeats publishes this broker's copy statuses in etcd, one key per
// shard (cluster.HeartbeatShard), on change and never on a clock alone:
// liveness is the lease, whose keep-alives write no revisions, so an idle
// broker writes nothing and a busy one about one revision per heartbeat
// interval (more only past cluster.MaxHeartbeatTxnBytes), however many
// streams it holds. What it writes it remembers per lease; a new lease (a new session) starts with
// nothing written, and the first pass under it writes every shard that
// holds a copy, and shard 0.
type heartbeats struct {
	cli    *clientv3.Client
	schema cluster.Schema
	node   string
	log    zerolog.Logger
	// status yields the status of every copy whose stream want accepts
	// (nil: every copy).
	status func(want func(stream string) bool) iter.Seq2[string, cluster.CopyTails]
	// gen, when set, moves after every change of what status yields
	// (replica.Manager.StatusGeneration); nil: every tails pass reads
	// every status.
	gen func() uint64
	// maxValue and maxTxn bound one shard's value and one transaction's
	// values (cluster.MaxHeartbeatBytes, cluster.MaxHeartbeatTxnBytes),
	// maxOps a transaction's puts (maxTxnOps).
	maxValue, maxTxn, maxOps int

	// Used by the session's loop only.
	lease     clientv3.LeaseID
	published [cluster.HeartbeatShards]map[string]cluster.CopyTails
	written   [cluster.HeartbeatShards]bool
	// seen is what the last tails pass read, written or not: a copy whose
	// tails read the same again stopped moving, and its exact tails go out
	// (tailsNeedWrite).
	seen [cluster.HeartbeatShards]map[string]cluster.CopyTails
	// takenIn marks shards to write at the next pass even when their
	// statuses read the same: a copy in them took in an assignment.
	takenIn [cluster.HeartbeatShards]bool
	// signalled marks shards where a copy signalled a change the
	// controller acts on since they were last read: a prompt pass reads
	// only those (and the ones takenIn or not yet written), so a mass
	// failover's stream of signals does not re-read every copy of the
	// broker each promptDelay.
	signalled [cluster.HeartbeatShards]bool
	omitted   [cluster.HeartbeatShards]int
	// settled is set by a tails pass after which every shard's published
	// statuses are exactly the ones it read, under this lease; settledGen
	// is gen as it read before that pass's statuses. A tails pass that
	// finds gen still there reads nothing and writes nothing: the statuses
	// are the ones published, so every shard would compare unchanged.
	// skipped counts the passes skipped since one ran (maxTailsSkips).
	settled    bool
	settledGen uint64
	skipped    int

	// Counters for metrics and tests.
	ticks        atomic.Int64
	skips        atomic.Int64
	txns         atomic.Int64
	omittedTotal atomic.Int64
}

func newHeartbeats(cli *clientv3.Client, schema cluster.Schema, node string, log zerolog.Logger, status func(want func(stream string) bool) iter.Seq2[string, cluster.CopyTails], gen func() uint64) *heartbeats {
	return &heartbeats{cli: cli, schema: schema, node: node, log: log, status: status, gen: gen,
		maxValue: cluster.MaxHeartbeatBytes, maxTxn: cluster.MaxHeartbeatTxnBytes, maxOps: maxTxnOps}
}

// tookIn marks the shards of streams whose copies took in an assignment.
func (h *heartbeats) tookIn(streams []string) {
	for _, s := range streams {
		h.takenIn[cluster.HeartbeatShard(s)] = true
	}
}

// signal marks the shards of streams whose copies signalled a change.
func (h *heartbeats) signal(streams []string) {
	for _, s := range streams {
		h.signalled[cluster.HeartbeatShard(s)] = true
	}
}

// publish writes the shards mode asks for under lease, in as few
// transactions as the bounds allow (one, unless the values pass maxTxn),
// sent together. It returns how many transactions it wrote. A failed write
// leaves what it did not write to the next pass.
func (h *heartbeats) publish(ctx context.Context, lease clientv3.LeaseID, mode publishMode) (int, error) {
	if lease != h.lease {
		h.lease = lease
		h.published = [cluster.HeartbeatShards]map[string]cluster.CopyTails{}
		h.written = [cluster.HeartbeatShards]bool{}
		h.seen = [cluster.HeartbeatShards]map[string]cluster.CopyTails{}
		h.settled = false
	}
	// An idle broker's tails pass: nothing changed since a pass after which
	// everything read was published, and nothing asks for a write (a copy
	// that took in an assignment or signalled: their shards are written
	// even when their statuses read the same). Reading every copy's status
	// to find that out was most of what an idle broker of 10,000 copies
	// spent its CPU on.
	var gen uint64
	if mode == publishTails && h.gen != nil {
		gen = h.gen()
		if h.settled && gen == h.settledGen && h.skipped < maxTailsSkips && !h.asked() {
			h.skipped++
			h.skips.Add(1)
			return 0, nil
		}
		h.skipped = 0
	}
	// Settled again only by a tails pass that ends with everything it read
	// published; a prompt pass changes what is published, so the tails
	// pass after it reads.
	h.settled = false
	// The shards this pass reads: a tails pass reads them all; a prompt
	// pass only those where something it writes may have changed (a copy
	// signalled, took in an assignment, or the shard is not written under
	// this lease yet). A change whose signal a prompt pass misses is still
	// written by the next tails pass, which compares every shard.
	var read [cluster.HeartbeatShards]bool
	all := mode == publishTails
	for i := range read {
		read[i] = all || !h.written[i] || h.takenIn[i] || h.signalled[i]
	}
	var cur [cluster.HeartbeatShards]map[string]cluster.CopyTails
	for i := range cur {
		if read[i] {
			// Sized as the last pass found the shard: grown from empty,
			// the maps of 10,000 copies were half of what an idle broker
			// allocated.
			cur[i] = make(map[string]cluster.CopyTails, max(len(h.seen[i]), len(h.published[i])))
		}
	}
	var want func(string) bool
	if !all {
		want = func(stream string) bool { return read[cluster.HeartbeatShard(stream)] }
	}
	for stream, t := range h.status(want) {
		cur[cluster.HeartbeatShard(stream)][stream] = t
	}
	now := time.Now().UTC()
	type put struct {
		shard int
		value string
	}
	var batch []put
	for i := range cur {
		if !read[i] {
			continue
		}
		seen := h.seen[i]
		if mode == publishTails {
			h.seen[i] = cur[i]
		}
		if h.written[i] && !h.takenIn[i] && !changed(h.published[i], seen, cur[i], mode) {
			h.signalled[i] = false
			continue
		}
		if !h.written[i] && len(cur[i]) == 0 && i != 0 {
			// An absent shard reads as an empty one, so a shard with no
			// copies is written only once it had some under this lease:
			// a broker of a few streams writes a few keys, not 128.
			// Shard 0 is always written, so a registered broker with no
			// copies has a heartbeat (liveness.ReplenishWith takes a
			// broker without one for one still starting).
			h.signalled[i], h.takenIn[i] = false, false
			continue
		}
		v, left := cluster.BoundHeartbeat(cluster.Heartbeat{Node: h.node, Shard: i, Time: now, Streams: cur[i]}, h.maxValue)
		h.noteOmitted(i, left)
		batch = append(batch, put{shard: i, value: v})
	}
	// The batch in transactions within etcd's bounds, written together:
	// one after another, the second half of a mass failover's pass (every
	// shard of a broker of 10,000 copies, over 1 MiB) reached etcd a
	// transaction's latency after the first on a loaded machine, and
	// with it the suspicions the controller records recoveries from.
	// Shards are independent keys, so their order does not matter; a
	// transaction that fails leaves its shards to the next pass, as a
	// failed pass did.
	var txns [][]put
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) && n < h.maxOps && (n == 0 || size+len(batch[n].value) <= h.maxTxn) {
			size += len(batch[n].value)
			n++
		}
		txns = append(txns, batch[:n])
		batch = batch[n:]
	}
	errs := make([]error, len(txns))
	var wg sync.WaitGroup
	sem := make(chan struct{}, txnsInFlight)
	for t, puts := range txns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ops := make([]clientv3.Op, 0, len(puts))
			for _, p := range puts {
				ops = append(ops, clientv3.OpPut(h.schema.HeartbeatKey(h.node, p.shard), p.value, clientv3.WithLease(lease)))
			}
			_, errs[t] = h.cli.Txn(ctx).Then(ops...).Commit()
		})
	}
	wg.Wait()
	wrote := 0
	var firstErr error
	for t, puts := range txns {
		if errs[t] != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("coord: heartbeat: %w", errs[t])
			}
			continue
		}
		wrote++
		h.txns.Add(1)
		for _, p := range puts {
			h.published[p.shard] = cur[p.shard]
			h.written[p.shard] = true
			h.takenIn[p.shard] = false
			h.signalled[p.shard] = false
		}
	}
	if mode == publishTails && h.gen != nil && firstErr == nil {
		h.settled, h.settledGen = h.publishedAll(cur), gen
	}
	return wrote, firstErr
}

// asked reports whether a shard is to be written whatever its statuses
// read: a copy in it took in an assignment or signalled a change.
func (h *heartbeats) asked() bool {
	for i := range h.takenIn {
		if h.takenIn[i] || h.signalled[i] {
			return true
		}
	}
	return false
}

// publishedAll reports whether every shard's published statuses are
// exactly cur's (a tails pass reads every shard): the pass left nothing
// moving or unwritten, and a pass reading the same statuses again would
// write nothing. A copy that moved by less than tailStep is not, so the
// pass after it still reads, finds it settled and writes its exact tails.
func (h *heartbeats) publishedAll(cur [cluster.HeartbeatShards]map[string]cluster.CopyTails) bool {
	for i := range cur {
		if !maps.Equal(h.published[i], cur[i]) {
			return false
		}
	}
	return true
}

// changed reports whether a shard's statuses moved from was (published)
// to now in a way mode writes; seen is what the last tails pass read.
func changed(was, seen, now map[string]cluster.CopyTails, mode publishMode) bool {
	if len(was) != len(now) {
		return true
	}
	for stream, t := range now {
		w, ok := was[stream]
		if !ok || w.Epoch != t.Epoch || w.Role != t.Role || w.SealEpoch != t.SealEpoch ||
			w.Suspect != t.Suspect || w.ChainMismatch != t.ChainMismatch {
			return true
		}
		if mode == publishTails && w != t {
			if s, ok := seen[stream]; tailsNeedWrite(w, t, ok && s == t) {
				return true
			}
		}
	}
	return false
}

// tailsNeedWrite reports whether a copy whose tails moved from was
// (published) to now, with the same role and epoch, is to be written by a
// tails pass; settled says they read the same at the last tails pass too.
// Written are:
//   - a sealed copy's: a pending recovery waits on the tails of the copies
//     it sealed (attention: recovery_waiting_prefix), so they are exact;
//   - a move of tailStep or more of any tail (or of the head), which the
//     in-sync judgement could tell (cluster.InSyncSlack);
//   - tails that stopped moving: once a copy is quiet for an interval its
//     exact tails are out, so an idle stream's published tails are its own
//     (what an accepted loss starts the history from, and what strandctl
//     stream get shows), and an idle broker then writes nothing.
//
// A copy that keeps moving by less than tailStep an interval is written
// once its moves add up to tailStep.
func tailsNeedWrite(was, now cluster.CopyTails, settled bool) bool {
	if now.Role == cluster.RoleSealed || settled {
		return true
	}
	apart := func(a, b uint64) bool { return max(a, b)-min(a, b) >= tailStep }
	return apart(was.RecordTail, now.RecordTail) || apart(was.ConfirmWatermark, now.ConfirmWatermark) ||
		apart(was.CursorEventTail, now.CursorEventTail) || apart(was.Head, now.Head)
}

// noteOmitted warns when a shard's value leaves copies out, and when it
// stops doing so; a shard that keeps leaving the same number out is not
// logged again.
func (h *heartbeats) noteOmitted(shard int, left []string) {
	if len(left) == h.omitted[shard] {
		return
	}
	h.omittedTotal.Add(int64(len(left) - h.omitted[shard]))
	h.omitted[shard] = len(left)
	if len(left) == 0 {
		h.log.Info().Str(logging.Node, h.node).Int("shard", shard).Msg("heartbeat shard fits its size bound again; every copy's status is published")
		return
	}
	h.log.Warn().Str(logging.Node, h.node).Int("shard", shard).Int("omitted", len(left)).Str("first_omitted", left[0]).
		Int("max_bytes", h.maxValue).
		Msg("heartbeat shard would pass its size bound; copies left out of it (the controller sees no status for them: too many copies on this broker)")
}
