// Package replica runs a broker's copies: for each stream assigned to this
// broker it holds the storage stream, the role the latest applied assignment
// gives it (owner, follower or sealed), the confirm watermark, and the
// replication workers.
//
// An owner confirms a record once W copies hold it durably, the owner
// included, with W taken from cluster.StreamConfirmPolicy (docs/protocol.md,
// "One rule for W"). Followers pull from the owner over ReplicationService.Follow and
// report their durable tails back on the same stream; the owner's confirm
// watermark is the W-th highest of those tails and its own, each capped at
// the owner's durable tail. The owner ships records once written, before
// its own fsync ends (storage.WrittenTail), so its fsync and the
// followers' overlap; a copy that restarts after an unclean stop on a new
// boot therefore never continues its epoch as owner (withholdOwner).
//
// # One Follow call per pair of brokers
//
// A follower holds one ReplicationService.Follow call to each owner broker
// it follows streams on (followSession), carrying every stream the two
// share, as a Kafka follower runs one fetcher per source broker: what a
// follower costs an owner grows with the brokers, not the streams, and a
// followed stream costs a few goroutines and a small queue instead of an
// HTTP/2 stream with its buffers (net/http holds a 512 KiB buffer for each
// request body a client sends). Each stream's follow within the call is
// what a call of its own was, rule for rule:
//
//   - The follower starts it with a FollowStart (the stream, its epoch, its
//     durable tails and chain, and an id new in the call) and stops it with
//     a FollowStop when its role ends or it refuses a batch. The owner runs
//     the same checks per start (stream known and owned here, the call's
//     node a follower at the owner's epoch, tails not past the owner's,
//     chains equal) and serves each follow from its own goroutine
//     (serveFollow); a start at an epoch the owner's copy has not applied
//     yet first waits up to a second for it (followApplyWait), since a
//     new assignment reaches the owner and its followers in no order. Each
//     follow has its own flow control: record bytes and batches
//     sent and not acknowledged, so one follow cannot queue without bound
//     on the follower.
//   - Every batch (FollowBatch) carries the follow's id and the owner's
//     epoch; the follower refuses another epoch and drops batches of ids it
//     stopped, so a late batch of an earlier follow of a stream is never
//     taken for the next one.
//   - The follower acknowledges a follow's durable tails (FollowAck) only
//     once storage synced them; the owner caps them at what it sent on that
//     follow and counts them toward that stream's W (confirmTracker).
//   - A follow's error ends that follow alone: the owner sends a FollowEnd
//     with the Connect code and message the follow's own call would have
//     ended with, the follower's follow returns that error to runFollower
//     (which retries, names the owner suspect, or stops on a chain
//     mismatch, as for a call), and the call and the other follows go on;
//     likewise a follower that refuses a batch stops only that follow. A
//     stream sealed, cut or reassigned ends its follow this way, and one
//     assigned starts its follow on the call that is already open.
//   - Only what is wrong with the call as a whole ends it: a missing or
//     wrong peer token (checked once per call, before anything is read), an
//     invalid node, a message naming another node, a start without an id,
//     or a broken connection, which ends every follow on it with its error.
//
// The owner sends round-robin: each follow has at most one batch waiting
// for the call's sender, which packs the waiting batches, in the order they
// came, into responses of about 1 MiB; a follow whose batch is taken reads
// its next one and waits at the back, so a busy stream cannot starve the
// others. A follow's goroutine wakes only for something to ship (records
// written, cursor events durable, room given back by an ack): the confirm
// watermark, which moves on every confirm, is told to the call's sender
// by the stream's confirm tracker, and the sender adds a batch carrying
// only it after the ready batches of its next response, for each follow
// whose newest watermark was not sent yet and whose first batch was
// (followServer.take). The follower's receiver never waits on a stream's
// goroutine. A follow's goroutine applies its first batch (which alone may
// carry the head a copy below the owner starts at) and any batch that
// waits in its inbox; from then on the receiver stores each batch of the
// follow's epoch in storage itself and applies its watermark, when nothing
// of the follow is queued or being applied (followSub.applyDirect), so a
// batch wakes no goroutine of its stream. Storage's committer tells each
// stored batch's outcome to the session (noteDurable), whose one acker
// acknowledges the copies' durable tails after each group commit: the
// goroutines a record wakes on a follower are per broker pair, not per
// stream. A watermark is capped at the copy's durable tail wherever it is
// applied. Starts, stops and acks go in messages of a bounded number of
// frames, under the owner's read limit; acks waiting to be sent are
// replaced by later ones of the same follow. The call ends when its last
// follow stops.
//
// Before any role change at a new epoch a copy is cut back onto the history
// of that epoch (docs/protocol.md, "Copies with a longer tail"); a sealed copy that a new
// assignment includes is released in place.
package replica
