// Package attention judges what in the cluster waits on something an operator
// may want to see: pending recoveries that cannot finish yet, and the live
// copies whose refused seals keep them waiting, single-copy streams whose
// owner is down or whose copy is sealed with no recovery pending, brokers
// down that hold copies, eager-failover suspects, chain mismatches and
// under-replicated streams. It is a pure function of a snapshot and of what
// the controller remembers between snapshots (Memory).
package attention

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/liveness"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// Kinds of attention entries, as named in admin.proto.
const (
	RecoveryWaitingCopies = "recovery_waiting_copies"
	RecoveryWaitingPrefix = "recovery_waiting_prefix"
	RecoverySealRefused   = "recovery_seal_refused"
	SingleCopyOwnerDown   = "single_copy_owner_down"
	SingleCopySealed      = "single_copy_sealed"
	BrokerDown            = "broker_down"
	FailoverSuspect       = "failover_suspect"
	ChainMismatch         = "chain_mismatch"
	UnderReplicated       = "under_replicated"
)

// Entry is one thing waiting.
type Entry struct {
	Stream          string
	Kind            string
	Reason          string
	Missing         []string
	StartRecordTail uint64
	StartNode       string
	Node            string
	// Since is when the controller first saw it, zero when not known.
	Since time.Time
	// Action is what the controller will do about it, and when.
	Action string
}

// Judge lists every attention entry of the snapshot, ordered by stream, kind
// and node. mem, which may be nil, is what the controller remembers between
// snapshots (Memory).
func Judge(s *state.Snapshot, mem *Memory) []Entry {
	var out []Entry
	for name := range s.Assignments {
		out = append(out, judgeStream(s, name, mem)...)
	}
	sortEntries(out)
	return out
}

// JudgeStream lists the attention entries of one stream, ordered by kind
// and node: what Judge lists for it, at the cost of that stream alone.
func JudgeStream(s *state.Snapshot, name string, mem *Memory) []Entry {
	out := judgeStream(s, name, mem)
	sortEntries(out)
	return out
}

func sortEntries(out []Entry) {
	slices.SortFunc(out, func(x, y Entry) int {
		return cmp.Or(cmp.Compare(x.Stream, y.Stream), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Node, y.Node))
	})
}

// judgeStream lists the entries of one stream, unordered; a stream with no
// assignment has none.
func judgeStream(s *state.Snapshot, name string, mem *Memory) []Entry {
	av, ok := s.Assignments[name]
	if !ok {
		return nil
	}
	a := av.Value
	var out []Entry
	if rec, ok := s.Recoveries[name]; ok {
		if e, wait := judgeRecovery(s, a, rec.Value, s.History[name].Value); wait {
			out = append(out, e)
		}
		out = append(out, judgeRefusals(s, name, rec.Value, s.Refusals[name].Value)...)
	} else if fence, by := liveness.SealedPast(s, a); len(by) > 0 && a.Copies() == 1 {
		// A replicated stream sealed like this gets a new recovery from
		// the liveness loop; a single copy gets none of its own, and
		// refuses publishes until a recovery that adds copies takes
		// the seal over.
		out = append(out, Entry{
			Stream: name, Kind: SingleCopySealed, Node: a.Owner,
			Reason: fmt.Sprintf("single-copy stream is sealed at epoch %d on %s, past its assignment's epoch %d, with no recovery pending (one was withdrawn); it refuses publishes until a stream update to more copies recovers it",
				fence, a.Owner, a.Epoch),
		})
	}
	for _, m := range a.Members() {
		if s.Live(m) {
			continue
		}
		if a.Copies() == 1 {
			out = append(out, Entry{
				Stream: name, Kind: SingleCopyOwnerDown, Node: m,
				Reason: fmt.Sprintf("single-copy stream waits for its owner %s; accept the loss to move it", m),
			})
			continue
		}
		role := cluster.RoleFollower
		if m == a.Owner {
			role = cluster.RoleOwner
		}
		out = append(out, Entry{
			Stream: name, Kind: BrokerDown, Node: m,
			Reason: fmt.Sprintf("broker %s holding the %s copy at epoch %d is down", m, role, a.Epoch),
		})
	}
	if e, under := judgeUnderReplicated(s, a, mem); under {
		out = append(out, e)
	}
	suspects := map[string][]string{}
	for node := range s.Heartbeats {
		t, ok := s.Tails(node, name)
		if !ok {
			continue
		}
		if t.Suspect != "" && t.Suspect == a.Owner {
			suspects[t.Suspect] = append(suspects[t.Suspect], node)
		}
		if t.ChainMismatch {
			out = append(out, Entry{
				Stream: name, Kind: ChainMismatch, Node: node,
				Reason: fmt.Sprintf("copy on %s disagrees with its owner's checksum chain at epoch %d; it stopped following", node, t.Epoch),
			})
		}
	}
	for owner, by := range suspects {
		slices.Sort(by)
		out = append(out, Entry{
			Stream: name, Kind: FailoverSuspect, Node: owner,
			Reason: fmt.Sprintf("owner %s suspected by %s", owner, strings.Join(by, ", ")),
		})
	}
	return out
}

// judgeRecovery says whether a pending recovery waits, and on what (docs/protocol.md,
// "The confirmed prefix"). It judges from heartbeats: a copy whose heartbeat
// is absent cannot answer a seal. With fewer than R such copies the recovery
// waits for copies. Otherwise it waits for the confirmed prefix when every
// live old copy published a record tail below the latest history start; it
// stays quiet while a live copy has published nothing for the stream, since
// that copy may hold the prefix.
func judgeRecovery(s *state.Snapshot, a cluster.Assignment, rec cluster.Recovery, history cluster.HistoryStarts) (Entry, bool) {
	old := rec.OldMembers()
	rule := cluster.StreamConfirmPolicy(a.Policy, len(old))
	var live, missing []string
	for _, m := range old {
		if _, ok := s.Heartbeats[m]; ok {
			live = append(live, m)
		} else {
			missing = append(missing, m)
		}
	}
	if len(live) < rule.R() {
		return Entry{
			Stream: rec.Stream, Kind: RecoveryWaitingCopies, Missing: missing,
			Reason: fmt.Sprintf("recovery to epoch %d has %d of the %d copies it must seal; missing %s",
				rec.FenceEpoch, len(live), rule.R(), strings.Join(missing, ", ")),
		}, true
	}
	start, ok := history.Latest()
	if !ok {
		return Entry{}, false
	}
	for _, m := range live {
		t, published := s.Tails(m, rec.Stream)
		if !published || t.RecordTail >= start.RecordTail {
			return Entry{}, false
		}
	}
	return Entry{
		Stream: rec.Stream, Kind: RecoveryWaitingPrefix, StartRecordTail: start.RecordTail, StartNode: start.Node,
		Reason: fmt.Sprintf("recovery to epoch %d waits for a copy holding the confirmed prefix: %d records, taken over by %s at epoch %d",
			rec.FenceEpoch, start.RecordTail, start.Node, start.Epoch),
	}, true
}

// judgeRefusals lists the live copies that refused their seal in the last
// round of a pending recovery, one entry each, from what the recoverer
// recorded when that round left the recovery waiting. Heartbeats alone
// cannot show this wait: the copies are live and may publish tails that
// would let it finish, yet the recovery waits rather than guess (docs/protocol.md,
// "Safety argument"). Refusals recorded for another transition or fence
// epoch belong to a recovery that is gone, and a copy whose broker is no
// longer registered is listed as down instead.
func judgeRefusals(s *state.Snapshot, stream string, rec cluster.Recovery, refusals cluster.SealRefusals) []Entry {
	if refusals.TransitionID != rec.TransitionID || refusals.FenceEpoch != rec.FenceEpoch {
		return nil
	}
	old := rec.OldMembers()
	var out []Entry
	for _, r := range refusals.Refusals {
		if !slices.Contains(old, r.Node) || !s.Live(r.Node) {
			continue
		}
		out = append(out, Entry{Stream: stream, Kind: RecoverySealRefused, Node: r.Node, Reason: refusalReason(rec, refusals, r)})
	}
	return out
}

func refusalReason(rec cluster.Recovery, refusals cluster.SealRefusals, r cluster.SealRefusal) string {
	wait := fmt.Sprintf("recovery to epoch %d waits with %d of the %d seals it needs", rec.FenceEpoch, len(refusals.Sealed), refusals.R)
	if len(refusals.Sealed) >= refusals.R {
		wait = fmt.Sprintf("recovery to epoch %d waits for a sealed copy at the confirmed prefix", rec.FenceEpoch)
	}
	if len(refusals.Sealed) > 0 {
		wait += fmt.Sprintf(" (sealed: %s)", strings.Join(refusals.Sealed, ", "))
	}
	var detail []string
	if r.Code != "" {
		detail = append(detail, r.Code)
	}
	if !r.Since.IsZero() {
		detail = append(detail, "since "+r.Since.UTC().Format(time.RFC3339))
	}
	how := ""
	if len(detail) > 0 {
		how = " (" + strings.Join(detail, ", ") + ")"
	}
	return fmt.Sprintf("%s; live copy %s refused its seal%s: %s", wait, r.Node, how, r.Error)
}
