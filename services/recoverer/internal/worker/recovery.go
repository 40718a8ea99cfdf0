package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/recoverer/internal/pick"
)

// waitLogEvery is how often an unchanged wait is logged again.
const waitLogEvery = 5 * time.Second

// step is what a task does after an attempt.
type step int

const (
	// stepDone: the recovery was committed, or none is pending.
	stepDone step = iota + 1
	// stepReread: the guarded commit lost to another write; read again.
	stepReread
	// stepWait: wait (with backoff, or until woken) and try again.
	stepWait
)

// run drives one stream's pending recovery until it is committed or gone, or
// the term ends. Waiting never gives up: a recovery that cannot commit safely
// waits (docs/protocol.md, "Safety argument"), and the controller's
// attention shows why.
func (t *term) run(k *task) {
	bo := newBackoff(t.w.cfg.BackoffMin, t.w.cfg.BackoffMax)
	var st taskState
	rereads := 0
	for {
		// A slot bounds the attempts in flight; it is given back before
		// any wait, so a recovery that cannot commit yet holds none.
		select {
		case t.slots <- struct{}{}:
		case <-t.ctx.Done():
			return
		}
		next := t.attempt(k, &st, bo)
		<-t.slots
		if t.ctx.Err() != nil {
			return
		}
		switch next {
		case stepDone:
			if t.finish(k, st.covered, st.committed) {
				return
			}
			bo.reset()
			rereads = 0
		case stepReread:
			// The loser reads again at once; repeated losses back off so
			// two writers cannot keep each other busy.
			rereads++
			if rereads > 1 && !k.wait(t.ctx, bo.next()) {
				return
			}
		case stepWait:
			rereads = 0
			if !k.wait(t.ctx, bo.next()) {
				return
			}
		}
	}
}

// wait returns after d, early when the task is woken, and false once ctx ends.
func (k *task) wait(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-k.kick:
		return true
	case <-timer.C:
		return true
	}
}

// taskState is what a task remembers between attempts, so it logs each
// recovery's start once and each wait once per change.
type taskState struct {
	recoveryRev int64
	// started is the recovery revision whose start was logged.
	started    int64
	waitKey    string
	waitLogged time.Time
	// covered is the revision the attempt that returned stepDone read at
	// (no recovery pending) or, committed set, committed at: the wakes it
	// makes redundant (term.finish).
	covered   int64
	committed bool
	// refusalsWarned is when a failure to record seal refusals was logged.
	refusalsWarned time.Time
}

// noteWait reports whether a wait described by key should be logged: when it
// differs from the last one, or the last log is a while ago.
func (s *taskState) noteWait(key string) bool {
	now := time.Now()
	if key == s.waitKey && now.Sub(s.waitLogged) < waitLogEvery {
		return false
	}
	s.waitKey, s.waitLogged = key, now
	return true
}

// attempt reads the stream's state at one revision, seals the old copies,
// decides and, when it may promote, commits (docs/protocol.md, "Stream failover").
func (t *term) attempt(k *task, st *taskState, bo *backoff) step {
	// The read is gathered with the other attempts' (snapshots.go) and
	// sent after this call, at or past the revision of the change that
	// woke the task (linearizable when none named one): a change it misses
	// wakes the task again at a revision past the read's, which finish
	// reads again for.
	snap, err := t.reads.Do(t.ctx, snapshotRead{stream: k.stream, atLeast: t.takeWake(k)})
	if err != nil {
		if t.ctx.Err() == nil && st.noteWait("read:"+err.Error()) {
			k.log.Warn().Err(err).Msg("cannot read the recovery state; retrying")
		}
		return stepWait
	}
	if !snap.hasRecovery() {
		st.covered, st.committed = snap.rev, false
		return stepDone
	}
	rec := snap.recovery
	log := k.log.With().Uint64(logging.FenceEpoch, rec.FenceEpoch).Str(logging.Transition, rec.TransitionID).Logger()
	if snap.recoveryRev != st.recoveryRev {
		st.recoveryRev = snap.recoveryRev
		bo.reset()
	}

	if !snap.hasAssignment() {
		if st.noteWait("no-assignment") {
			log.Warn().Msg("pending recovery for a stream with no assignment; left for the controller")
		}
		t.recordRefusals(log, st, snap, nil)
		return stepWait
	}
	// A recovery from another epoch, or naming other copies, is not a
	// recovery of this assignment: sealing its copies would not prove which
	// records were confirmed. The controller rewrites or withdraws it.
	if err := pick.Check(snap.assignment, rec, snap.history); err != nil {
		if st.noteWait("stale:" + err.Error()) {
			log.Warn().Err(err).Uint64(logging.Epoch, snap.assignment.Epoch).Msg("stale pending recovery; left for the controller")
		}
		t.recordRefusals(log, st, snap, nil)
		return stepWait
	}
	if st.started != snap.recoveryRev {
		st.started = snap.recoveryRev
		log.Info().
			Uint64(logging.Epoch, snap.assignment.Epoch).
			Str(logging.Owner, rec.OldOwner).
			Strs(logging.Followers, rec.OldFollowers).
			Str(fieldProposedOwner, rec.ProposedOwner).
			Str(logging.Policy, snap.assignment.Policy.String()).
			Int(fieldR, pick.Threshold(snap.assignment)).
			Str(logging.Reason, rec.Reason).
			Msg("recovering stream: sealing every copy of the old assignment")
	}

	answers, failed := t.sealRound(snap)
	if t.ctx.Err() != nil {
		// Leadership was lost mid-round: stop here. A commit could not
		// succeed anyway, since it compares the leader key.
		return stepWait
	}
	d := pick.DecideFor(snap.assignment, rec, snap.history, answers)
	log.Debug().Stringer(fieldVerdict, d.Verdict).Int(fieldR, d.R).Strs(fieldSealed, d.Sealed).Strs(fieldMissing, d.Missing).
		Dict(fieldSealErrors, sealErrors(d.Missing, failed)).Str(fieldPick, d.Pick.Node).Uint64(fieldPickRecordTail, d.Pick.RecordTail).
		Msg("seal round done")
	if d.Verdict != pick.Promote {
		// Attention shows why the recovery waits: the copies that did not
		// seal although their broker is registered, and what they answered
		// (docs/limits.md: a waiting recovery stays under controller
		// attention until a copy answers). A promotion's commit deletes them.
		t.recordRefusals(log, st, snap, refusalsOf(snap, d, failed, time.Now()))
	}
	switch d.Verdict {
	case pick.WaitQuorum:
		if st.noteWait(fmt.Sprint("quorum", d.Sealed, d.Missing)) {
			log.Info().Int(fieldR, d.R).Strs(fieldSealed, d.Sealed).Strs(fieldMissing, d.Missing).
				Dict(fieldSealErrors, sealErrors(d.Missing, failed)).
				Msg("waiting: fewer than R copies answered their seal; retrying")
		}
		return stepWait
	case pick.WaitPrefix:
		if st.noteWait(fmt.Sprint("prefix", d.Pick, d.Start, d.Missing)) {
			log.Info().Str(fieldPick, d.Pick.Node).Uint64(fieldPickRecordTail, d.Pick.RecordTail).
				Uint64(logging.RecordTail, d.Start.RecordTail).Uint64(logging.Epoch, d.Start.Epoch).Str(logging.Node, d.Start.Node).
				Strs(fieldSealed, d.Sealed).Strs(fieldMissing, d.Missing).
				Msg("waiting for a copy at the confirmed prefix: the furthest sealed copy is below the latest history start; retrying")
		}
		return stepWait
	}

	next, starts := pick.Commit(snap.assignment, rec, snap.history, d)
	committed, rev, err := t.commitBatched(snap, next, starts)
	switch {
	case errors.Is(err, errDeposed):
		log.Warn().Msg("commit refused: no longer the recoverer leader; stopping recovery work")
		t.depose(errDeposed)
		return stepWait
	case err != nil:
		if t.ctx.Err() == nil {
			log.Warn().Err(err).Msg("recovery commit failed; retrying")
		}
		return stepWait
	case !committed:
		log.Info().Msg("recovery state changed since it was read; reading it again")
		return stepReread
	}
	log.Info().
		Uint64(logging.Epoch, next.Epoch).
		Str(logging.Owner, next.Owner).
		Strs(logging.Followers, next.Followers).
		Str(logging.Policy, next.Policy.String()).
		Uint64(logging.RecordTail, d.Pick.RecordTail).
		Uint64(logging.CursorEventTail, d.Pick.CursorEventTail).
		Strs(fieldMissing, d.Missing).
		Msg("recovery committed")
	st.covered, st.committed = rev, true
	return stepDone
}

// recordRefusals stores want as the seal refusals of the recovery in snap.
// A failure only costs the operator's view of the wait, never the recovery:
// it is logged and the next round records them again.
func (t *term) recordRefusals(log zerolog.Logger, st *taskState, snap snapshot, want *cluster.SealRefusals) {
	cfg := t.w.cfg
	written, err := writeRefusals(t.ctx, cfg.Client, cfg.Schema, snap, t.leader, want)
	switch {
	case err != nil:
		if now := time.Now(); t.ctx.Err() == nil && now.Sub(st.refusalsWarned) >= waitLogEvery {
			st.refusalsWarned = now
			log.Warn().Err(err).Msg("cannot record the seal refusals for attention; the recovery goes on and records them after its next round")
		}
	case written && want != nil:
		refused := zerolog.Dict()
		for _, r := range want.Refusals {
			refused.Str(r.Node, r.Error)
		}
		log.Info().Int(fieldR, want.R).Strs(fieldSealed, want.Sealed).Dict(fieldRefused, refused).
			Msg("live copies refused their seal; recorded for attention while the recovery waits")
	}
}

func sealErrors(nodes []string, failed map[string]error) *zerolog.Event {
	dict := zerolog.Dict()
	for _, n := range nodes {
		if err := failed[n]; err != nil {
			dict.Str(n, err.Error())
		}
	}
	return dict
}
