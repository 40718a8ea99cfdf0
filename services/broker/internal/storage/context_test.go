package storage

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
)

// blockingCall is one of the calls that wait on the committer, with what
// it changes: queued reports whether the change is in place in memory,
// durable whether a reopened copy holds it.
type blockingCall struct {
	name string
	// prepare readies s for the call (10 records at epoch 1 are there).
	prepare func(t *testing.T, s *Stream)
	call    func(ctx context.Context, s *Stream) error
	queued  func(s *Stream) bool
	// finish completes what a cancelled call left for later, if anything.
	finish  func(t *testing.T, s *Stream)
	durable func(s *Stream) error
}

func blockingCalls() []blockingCall {
	noPrepare := func(*testing.T, *Stream) {}
	noFinish := func(*testing.T, *Stream) {}
	return []blockingCall{
		{
			name:    "Seal",
			prepare: noPrepare,
			call:    func(ctx context.Context, s *Stream) error { _, err := s.Seal(ctx, 2, "t2"); return err },
			queued:  func(s *Stream) bool { return s.State().SealEpoch == 2 },
			finish:  noFinish,
			durable: func(s *Stream) error {
				st := s.State()
				if st.SealEpoch != 2 || st.SealTransition != "t2" || st.Epoch != 2 {
					return fmt.Errorf("seal %d %q epoch %d, want sealed at 2 by t2", st.SealEpoch, st.SealTransition, st.Epoch)
				}
				return nil
			},
		},
		{
			name:    "AdvanceEpoch",
			prepare: noPrepare,
			call:    func(ctx context.Context, s *Stream) error { return s.AdvanceEpoch(ctx, 3) },
			queued:  func(s *Stream) bool { return s.State().Epoch == 3 },
			finish:  noFinish,
			durable: func(s *Stream) error {
				st := s.State()
				if st.Epoch != 3 {
					return fmt.Errorf("epoch %d, want 3", st.Epoch)
				}
				return nil
			},
		},
		{
			name:    "ResetTo",
			prepare: noPrepare,
			call:    func(ctx context.Context, s *Stream) error { return s.ResetTo(ctx, 50, 0xabc) },
			// State reports the durable tail; the reset's metadata is
			// in place before.
			queued: func(s *Stream) bool {
				s.assigned.mu.Lock()
				defer s.assigned.mu.Unlock()
				return s.assigned.m.RecordTail == 50 && s.assigned.m.Head == 50
			},
			finish: noFinish,
			durable: func(s *Stream) error {
				st := s.State()
				if st.Head != 50 || st.RecordTail != 50 || st.Chain != 0xabc {
					return fmt.Errorf("head %d tail %d chain %#x, want 50, 50, 0xabc", st.Head, st.RecordTail, st.Chain)
				}
				return nil
			},
		},
		{
			name:    "Cut",
			prepare: noPrepare,
			call:    func(ctx context.Context, s *Stream) error { return s.Cut(ctx, 6, 0) },
			queued: func(s *Stream) bool {
				s.assigned.mu.Lock()
				defer s.assigned.mu.Unlock()
				return s.assigned.m.Cut != nil
			},
			// The cut left pending is finished by the next call that
			// needs the copy's history settled.
			finish: func(t *testing.T, s *Stream) {
				if err := s.AdvanceEpoch(context.Background(), 2); err != nil {
					t.Fatalf("advance after the cancelled cut: %v", err)
				}
			},
			durable: func(s *Stream) error {
				st := s.State()
				if st.RecordTail != 6 || st.Epoch != 2 {
					return fmt.Errorf("record tail %d epoch %d, want the cut to 6 and epoch 2", st.RecordTail, st.Epoch)
				}
				return nil
			},
		},
		{
			name:    "SetIncarnation",
			prepare: noPrepare,
			call:    func(ctx context.Context, s *Stream) error { return s.SetIncarnation(ctx, "inc-1") },
			queued:  func(s *Stream) bool { return s.State().Incarnation == "inc-1" },
			finish:  noFinish,
			durable: func(s *Stream) error {
				st := s.State()
				if st.Incarnation != "inc-1" {
					return fmt.Errorf("incarnation %q, want inc-1", st.Incarnation)
				}
				return nil
			},
		},
		{
			name: "ClearUnsure",
			prepare: func(t *testing.T, s *Stream) {
				if err := s.commitMeta(context.Background(), func(m *meta) error { m.UnsureEpoch = 1; return nil }); err != nil {
					t.Fatal(err)
				}
			},
			call:   func(ctx context.Context, s *Stream) error { return s.ClearUnsure(ctx) },
			queued: func(s *Stream) bool { return s.State().UnsureEpoch == 0 },
			finish: noFinish,
			durable: func(s *Stream) error {
				st := s.State()
				if st.UnsureEpoch != 0 {
					return fmt.Errorf("unsure epoch %d, want it cleared", st.UnsureEpoch)
				}
				return nil
			},
		},
		{
			name: "Snapshot",
			prepare: func(t *testing.T, s *Stream) {
				if _, err := s.CommitCursor(context.Background(), 1, "c", 3); err != nil {
					t.Fatal(err)
				}
			},
			call: func(ctx context.Context, s *Stream) error { return s.Snapshot(ctx) },
			queued: func(s *Stream) bool {
				s.assigned.mu.Lock()
				defer s.assigned.mu.Unlock()
				return s.assigned.snapBoundary == 1
			},
			finish: noFinish,
			durable: func(s *Stream) error {
				snap, err := s.readSnapshot()
				if err != nil || snap.Boundary != 1 || snap.Cursors["c"] != 3 {
					return fmt.Errorf("snapshot %+v (%v), want boundary 1 with c at 3", snap, err)
				}
				return nil
			},
		},
		{
			name: "ApplyRetention",
			// The producer checkpoint is past the new head already, so
			// the first wait is the head's.
			prepare: func(t *testing.T, s *Stream) {
				s.SetConfirmWatermark(10)
				if err := s.Snapshot(context.Background()); err != nil {
					t.Fatal(err)
				}
			},
			call: func(ctx context.Context, s *Stream) error {
				_, err := s.ApplyRetention(ctx, Retention{MaxRecords: 4}, time.Now())
				return err
			},
			queued: func(s *Stream) bool {
				s.assigned.mu.Lock()
				defer s.assigned.mu.Unlock()
				return s.assigned.m.Head == 6
			},
			finish: noFinish,
			durable: func(s *Stream) error {
				if st := s.State(); st.Head != 6 || st.RecordTail != 10 {
					return fmt.Errorf("head %d tail %d, want 6 and 10", st.Head, st.RecordTail)
				}
				return nil
			},
		},
	}
}

// A blocking call whose context is already done returns ctx.Err() and
// changes nothing.
func TestBlockingCallsCancelledChangeNothing(t *testing.T) {
	for _, c := range blockingCalls() {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			db := openDB(t, dir)
			s := ownerStream(t, db, "s", 1)
			mustAppend(t, s, 1, recs("a", 10))
			c.prepare(t, s)
			if err := s.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			before := s.State()
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := c.call(ctx, s); !errors.Is(err, context.Canceled) {
				t.Fatalf("%s with a cancelled context: %v, want context.Canceled", c.name, err)
			}
			if c.queued(s) || !equalState(s.State(), before) {
				t.Fatalf("%s with a cancelled context changed the copy:\n%+v\nwas\n%+v", c.name, s.State(), before)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openDB(t, dir)
			defer db.Close()
			if after := openStream(t, db, "s").State(); !equalState(after, before) {
				t.Fatalf("%s with a cancelled context changed the stored copy:\n%+v\nwas\n%+v", c.name, after, before)
			}
		})
	}
}

// A blocking call whose context ends while it waits on a held committer
// returns ctx.Err() without waiting for the committer, and its change,
// already queued, is in place and becomes durable in order: the copy is as
// the call would have left it (for a cut, once the next role change
// finishes it).
func TestBlockingCallsReturnWhenContextEndsWhileCommitterWaits(t *testing.T) {
	for _, c := range blockingCalls() {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			db := openDB(t, dir)
			s := ownerStream(t, db, "s", 1)
			mustAppend(t, s, 1, recs("a", 10))
			c.prepare(t, s)
			if err := s.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			blocker := ownerStream(t, db, "blocker", 1)

			inSync, release := holdNextSync(db)
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()
			blocked := make(chan error, 1)
			go func() {
				_, err := blocker.Append(context.Background(), 1, recs("b", 1))
				blocked <- err
			}()
			select {
			case <-inSync:
			case <-time.After(10 * time.Second):
				t.Fatal("the committer never reached its fsync")
			}

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.call(ctx, s) }()
			clustertest.Eventually(t, 10*time.Second, c.name+" queued behind the held batch", func() error {
				if !c.queued(s) {
					return errors.New("not queued yet")
				}
				return nil
			})
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("%s cancelled while the committer waits: %v, want context.Canceled", c.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not return when its context ended; it waits for the held committer", c.name)
			}
			if !c.queued(s) {
				t.Fatalf("%s: the queued change was undone in memory though it is still to be written", c.name)
			}

			close(release)
			released = true
			if err := <-blocked; err != nil {
				t.Fatal(err)
			}
			c.finish(t, s)
			// Sync's barrier is written after the queued change.
			if err := s.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := c.durable(s); err != nil {
				t.Fatalf("after the committer went on: %v", err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openDB(t, dir)
			defer db.Close()
			if err := c.durable(openStream(t, db, "s")); err != nil {
				t.Fatalf("reopened: %v", err)
			}
		})
	}
}
