package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// A restart of the killed owner within the controller's --replace-after
// (Config.RestartAfter): the lost copy stays a member and rejoins from its
// own record tail (docs/operating.md, "Under-replicated streams";
// docs/protocol.md, "Replacing a missing copy"). The bench shows what that
// costs: records_missed (the records the copy missed while down),
// bytes_rereplicated (what followers stored from Follow from the restart
// until the copy caught up) and spare_copies (copies that appeared on a
// broker that held none of the stream: 0, as nothing was replaced).

// followStoredMetric is the follower's counter of record bytes received on
// Follow and stored (services/broker/internal/metrics).
const followStoredMetric = brokerMetricPrefix + "follow_stored_bytes_total"

// RecordsMissed is the tail gap the killed copies had at the restart,
// summed over the streams in epochs (stream index to its epoch at the
// kill): the furthest offset confirmed by restartAt, past the furthest the
// killed owner confirmed at its epoch. Confirms bound both tails from
// below, so the gap is exact up to the records in flight at either moment.
func RecordsMissed(confirms []Confirm, epochs map[int]uint64, restartAt time.Duration) int64 {
	type tails struct{ atKill, atRestart uint64 } // offsets + 1
	per := make(map[int]*tails, len(epochs))
	for s := range epochs {
		per[s] = &tails{}
	}
	for _, c := range confirms {
		t, ok := per[int(c.Stream)]
		if !ok {
			continue
		}
		if c.Epoch == epochs[int(c.Stream)] {
			t.atKill = max(t.atKill, c.Offset+1)
		}
		if c.Done <= restartAt {
			t.atRestart = max(t.atRestart, c.Offset+1)
		}
	}
	var n int64
	for _, t := range per {
		if t.atRestart > t.atKill {
			n += int64(t.atRestart - t.atKill)
		}
	}
	return n
}

// SpareCopies counts the copies in after that before did not have, by
// stream: copies a replacement put on a broker that held none of the
// stream.
func SpareCopies(before, after map[string][]string) int {
	n := 0
	for s, nodes := range after {
		for _, node := range nodes {
			if !slices.Contains(before[s], node) {
				n++
			}
		}
	}
	return n
}

// members is every stream's assignment members (owner first), by name.
func members(states []*strandv1.GetStreamResponse) map[string][]string {
	out := make(map[string][]string, len(states))
	for _, st := range states {
		a := st.GetAssignment()
		out[st.GetSpec().GetName()] = append([]string{a.GetOwner()}, a.GetFollowers()...)
	}
	return out
}

// followStoredBytes reads followStoredMetric from every broker that
// answers, by node (a killed broker does not; a restarted one counts from
// 0).
func (r *runner) followStoredBytes(ctx context.Context) map[string]float64 {
	hc, baseURL := r.metricsClient()
	out := map[string]float64{}
	for _, b := range r.cl.Info().Brokers {
		fams, err := scrapeFamilies(ctx, hc, baseURL(b.Address))
		if err != nil {
			continue
		}
		if f, ok := fams[followStoredMetric]; ok {
			for _, m := range f.GetMetric() {
				out[b.Node] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// CounterGrowth is how much each node's counter grew from before to after,
// summed, and the part of it on node. A node missing from before (not
// running then) grew from 0.
func CounterGrowth(before, after map[string]float64, node string) (total, onNode int64) {
	for n, v := range after {
		g := int64(v - before[n])
		total += g
		if n == node {
			onNode = g
		}
	}
	return total, onNode
}

// restartMidRun starts the killed owner again RestartAfter after the kill,
// while publishing goes on, and waits until its copy of every stream the
// broker owned is a live follower whose record tail reached what the
// stream's furthest live copy held at the restart. It measures what the
// followers stored from Follow in between. timer ends with the publishing
// (bg); the catch-up is bounded by a minute of ctx.
func (r *runner) restartMidRun(bg, ctx context.Context) error {
	t := time.NewTimer(time.Until(r.start.Add(r.o.KillAt + r.o.RestartAfter)))
	defer t.Stop()
	select {
	case <-bg.Done():
		return nil
	case <-t.C:
	}
	r.mu.Lock()
	node, epochs := r.killed, r.killEpochs
	r.mu.Unlock()
	if node == "" {
		return fmt.Errorf("bench: restart: no broker was killed")
	}
	states, err := r.getStreams(ctx)
	if err != nil {
		return fmt.Errorf("bench: restart: get streams: %w", err)
	}
	// The tail the returning copy must reach: the furthest live copy's
	// when it restarts, as last published in heartbeats.
	target := make(map[int]uint64, len(epochs))
	for i := range epochs {
		for _, cp := range states[i].GetCopies() {
			if cp.GetNode() != node && cp.GetLive() {
				target[i] = max(target[i], cp.GetRecordTail())
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = r.cl.Wait(wctx, node)
	cancel()
	if err != nil {
		return fmt.Errorf("bench: restart: %s did not exit: %w", node, err)
	}
	before := r.followStoredBytes(ctx)
	at := r.since()
	r.mu.Lock()
	r.restartAt = at
	r.mu.Unlock()
	if err := r.cl.Restart(ctx, node); err != nil {
		return fmt.Errorf("bench: restart %s: %w", node, err)
	}
	fmt.Fprintf(r.o.Stderr, "bench: %.2fs restarted %s (pid %d), %.1fs after the kill; waiting for it to catch up\n",
		at.Seconds(), node, r.cl.PID(node), r.o.RestartAfter.Seconds())
	ctx, cancel = context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if states, err := r.getStreams(ctx); err == nil {
			for i := range target {
				if caughtUp(states[i], node, target[i]) {
					delete(target, i)
				}
			}
		}
		if len(target) == 0 {
			in := r.since()
			grew, returning := CounterGrowth(before, r.followStoredBytes(ctx), node)
			r.mu.Lock()
			r.res.BytesRereplicated, r.res.BytesReturningCopy = &grew, &returning
			v := round(ms(in - at))
			r.res.RejoinCaughtUpMs = &v
			r.mu.Unlock()
			fmt.Fprintf(r.o.Stderr, "bench: %.2fs %s caught up; followers stored %d bytes from Follow since its restart, %d of them on %s\n",
				in.Seconds(), node, grew, returning, node)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: %s did not catch up on %d streams within a minute of its restart", node, len(target))
		case <-tick.C:
		}
	}
}

// caughtUp reports whether node is a live follower of the stream whose
// record tail reached tail.
func caughtUp(st *strandv1.GetStreamResponse, node string, tail uint64) bool {
	if !rejoined(st, node) {
		return false
	}
	for _, cp := range st.GetCopies() {
		if cp.GetNode() == node {
			return cp.GetRecordTail() >= tail
		}
	}
	return false
}
