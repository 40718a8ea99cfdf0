package replica

import (
	"fmt"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// cutPoint decides where a copy must be cut before a role change at target
// (docs/protocol.md, "Copies with a longer tail"). own are the copy's log epochs (for a
// sealed copy, the epochs its seal replaced). The cut is the lowest history
// start recorded for an epoch after the copy's own and up to target; ok is
// false when nothing needs cutting: the copy is already on the target
// history, no start lies in range, or the copy ends at or below the start.
//
// A start recorded for self, the copy's own node, never cuts it: the owner
// of an epoch is never cut at its own start (docs/limits.md). A start
// is a point on its node's own log, and that node's records past it are the
// epoch's history. A recovery records the promoted copy's sealed tails, so
// the start is its tail; an accepted owner loss records the tails the new
// owner last published in its heartbeat, which can lag its log, and cutting
// there would drop records confirmed on it and give their offsets to new
// ones.
//
// An out-of-order list is an error: the caller withholds the role change
// rather than cutting on a guess.
func cutPoint(self string, own []storage.LogEpoch, recordTail, cursorEventTail uint64, history cluster.HistoryStarts, target uint64) (cluster.HistoryStart, bool, error) {
	for i := 1; i < len(history); i++ {
		if history[i].Epoch <= history[i-1].Epoch {
			return cluster.HistoryStart{}, false, fmt.Errorf("replica: history starts out of order at epoch %d", history[i].Epoch)
		}
	}
	var ownEpoch uint64
	if len(own) > 0 {
		ownEpoch = own[len(own)-1].Epoch
	}
	if ownEpoch >= target {
		return cluster.HistoryStart{}, false, nil
	}
	// The record cut and the cursor event cut are the lowest of each over
	// the starts in range, taken separately: a promoted copy's record tail
	// reaches the previous start, but its cursor event tail need not, so
	// the start lowest in records is not always lowest in events.
	var cut cluster.HistoryStart
	found := false
	for _, h := range history {
		if h.Epoch <= ownEpoch || h.Epoch > target || (self != "" && h.Node == self) {
			continue
		}
		if !found {
			cut, found = h, true
			continue
		}
		if h.RecordTail < cut.RecordTail {
			cut.Epoch, cut.RecordTail, cut.Node = h.Epoch, h.RecordTail, h.Node
		}
		cut.CursorEventTail = min(cut.CursorEventTail, h.CursorEventTail)
	}
	if !found || (recordTail <= cut.RecordTail && cursorEventTail <= cut.CursorEventTail) {
		return cluster.HistoryStart{}, false, nil
	}
	return cut, true, nil
}
