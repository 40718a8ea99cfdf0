package replica

import (
	"testing"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

func TestCutPoint(t *testing.T) {
	epochs := func(es ...uint64) []storage.LogEpoch {
		out := make([]storage.LogEpoch, 0, len(es))
		for _, e := range es {
			out = append(out, storage.LogEpoch{Epoch: e})
		}
		return out
	}
	h := cluster.HistoryStarts{
		{Epoch: 2, RecordTail: 100, CursorEventTail: 10, Node: "b"},
		{Epoch: 3, RecordTail: 150, CursorEventTail: 12, Node: "c"},
	}
	cases := []struct {
		name       string
		self       string
		own        []storage.LogEpoch
		tail, ctl  uint64
		history    cluster.HistoryStarts
		target     uint64
		wantCut    bool
		wantRecord uint64
		wantEvents uint64
		wantErr    bool
	}{
		{name: "returning old owner with a longer suffix", own: epochs(1), tail: 120, ctl: 10, history: h[:1], target: 2, wantCut: true, wantRecord: 100},
		{name: "two failovers away: lowest start in range", own: epochs(1), tail: 160, ctl: 12, history: h, target: 3, wantCut: true, wantRecord: 100},
		{name: "already on the target history", own: epochs(1, 3), tail: 200, ctl: 20, history: h, target: 3},
		{name: "follower caught up past the start at its epoch", own: epochs(2), tail: 130, ctl: 11, history: h[:1], target: 2},
		{name: "ends at the start", own: epochs(1), tail: 100, ctl: 10, history: h[:1], target: 2},
		{name: "below the start", own: epochs(1), tail: 90, ctl: 5, history: h[:1], target: 2},
		{name: "cursor events past the start only", own: epochs(1), tail: 100, ctl: 11, history: h[:1], target: 2, wantCut: true, wantRecord: 100},
		{name: "no start recorded in range (accepted loss without tails)", own: epochs(1), tail: 120, ctl: 10, history: nil, target: 2},
		{name: "start of its own epoch never cuts the owner of that epoch", own: epochs(1, 2), tail: 130, ctl: 12, history: h[:1], target: 3},
		{name: "start past the target is ignored", own: epochs(1), tail: 160, ctl: 12, history: h[1:], target: 2},
		// Accepted owner loss: b's start at 2 is the tails its last heartbeat
		// showed, below its log. b owns epoch 2 at its own tails; another
		// copy is cut there (and fetches the shared records again from b).
		{name: "accepted loss: the new owner is not cut at its own lagging start", self: "b", own: epochs(1), tail: 130, ctl: 12, history: h[:1], target: 2},
		{name: "accepted loss: another copy is cut at the new owner's start", self: "x", own: epochs(1), tail: 130, ctl: 12, history: h[:1], target: 2, wantCut: true, wantRecord: 100},
		{name: "own start skipped, a later start of another node still cuts", self: "b", own: epochs(1), tail: 160, ctl: 12, history: h, target: 3, wantCut: true, wantRecord: 150},
		{name: "cursor events cut at the lowest event start, not the lowest record start's", own: epochs(1), tail: 160, ctl: 60,
			history: cluster.HistoryStarts{{Epoch: 2, RecordTail: 100, CursorEventTail: 50}, {Epoch: 3, RecordTail: 120, CursorEventTail: 40}},
			target:  3, wantCut: true, wantRecord: 100, wantEvents: 40},
		{name: "out of order list withholds", own: epochs(1), tail: 160, history: cluster.HistoryStarts{h[1], h[0]}, target: 3, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cut, ok, err := cutPoint(c.self, c.own, c.tail, c.ctl, c.history, c.target)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if ok != c.wantCut {
				t.Fatalf("cut = %v (%+v), want %v", ok, cut, c.wantCut)
			}
			if ok && cut.RecordTail != c.wantRecord {
				t.Fatalf("cut at %d, want %d", cut.RecordTail, c.wantRecord)
			}
			if ok && c.wantEvents != 0 && cut.CursorEventTail != c.wantEvents {
				t.Fatalf("cursor event cut at %d, want %d", cut.CursorEventTail, c.wantEvents)
			}
		})
	}
}

func TestConfirmTrackerWatermark(t *testing.T) {
	majority := cluster.StreamConfirmPolicy(cluster.Policy{Name: cluster.MajorityDurable}, 3)
	tr := newConfirmTracker(majority, []string{"b", "c"}, 0, 0)
	tr.ownerDurable(10)
	if wm, _ := tr.get(); wm != 0 {
		t.Fatalf("owner alone with W=2: watermark %d, want 0", wm)
	}
	_, changed := tr.get()
	tr.followerDurable("b", 7)
	select {
	case <-changed:
	default:
		t.Fatal("watermark change not signalled")
	}
	if wm, _ := tr.get(); wm != 7 {
		t.Fatalf("watermark %d, want 7", wm)
	}
	tr.followerDurable("x", 10) // not a member: ignored
	if wm, _ := tr.get(); wm != 7 {
		t.Fatalf("non-member moved the watermark to %d", wm)
	}
	tr.followerDurable("c", 10)
	if wm, _ := tr.get(); wm != 10 {
		t.Fatalf("watermark %d, want 10", wm)
	}
	// Never backwards, even when a follower reports less.
	tr.followerDurable("c", 3)
	if wm, _ := tr.get(); wm != 10 {
		t.Fatalf("watermark moved back to %d", wm)
	}
	// A follower cannot count past the owner's own tail.
	all := newConfirmTracker(cluster.StreamConfirmPolicy(cluster.Policy{Name: cluster.LocalDurable}, 3), []string{"b", "c"}, 5, 0)
	all.followerDurable("b", 9)
	all.followerDurable("c", 9)
	if wm, _ := all.get(); wm != 5 {
		t.Fatalf("local_durable watermark %d, want 5 (owner tail)", wm)
	}
}
