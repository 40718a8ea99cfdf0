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
// Before any role change at a new epoch a copy is cut back onto the history
// of that epoch (docs/protocol.md, "Copies with a longer tail"); a sealed copy that a new
// assignment includes is released in place.
package replica
