// Package storage is a broker's durable store: every stream copy the broker
// holds, in one Badger database. A copy is a record log, a cursor event log
// and metadata (epochs, seal, retained head, confirm watermark, cursor
// snapshot). The failover rules it serves are in the seed,
// ../shared/seed/stream-failover.md; the section names below refer to it.
//
// # Key layout
//
// Every key starts with a kind byte; stream keys then carry the stream name
// prefixed by its length in one byte, so no stream's keys are a prefix of
// another's. Offsets are 8-byte big-endian, so Badger's key order is offset
// order and a range of offsets is a key range.
//
//	m | len | name            meta: epochs, seal, head, tails, chain, bytes,
//	                          confirm watermark, cut intent (JSON)
//	r | len | name | offset   record (codec.go: version, offset, epoch,
//	                          publish time, sequence, chain, producer id,
//	                          sorted headers, payload)
//	e | len | name | offset   cursor event (codec.go: version, offset, epoch,
//	                          position, cursor name)
//	s | len | name            cursor snapshot: boundary + cursor positions (JSON)
//
// # Logs, tails and the chain
//
// Records sit at dense offsets [head, record tail); cursor events at dense
// offsets [0, cursor event tail). Tails are exclusive. Each record carries
// Chain = Chain(chain of the previous record, record), see Chain for exactly
// what it covers; the chain of an empty log is 0, and the chain below the
// head is kept in meta so ChainAt works at the head after retention or
// ResetTo. Copies whose chains agree at an offset hold the same prefix.
//
// # Durability
//
// All writes go through one committer goroutine per DB (commit.go). It
// drains every queued op, writes them in one Badger transaction (split only
// at Badger's transaction bound) with SyncWrites off, and then calls
// DB.Sync, which fsyncs the active memtable WAL and the value log (verified
// in badger v4.9.6 db.go). Because it is the only writer and syncs after
// every transaction, a memtable Badger rotates out never holds unsynced
// data. This is the group commit: concurrent appends to any streams share
// one fsync.
//
//   - Append, AppendReplicated, Seal, AdvanceEpoch, ResetTo, Cut, Snapshot,
//     Drop and retention return only after their writes are fsynced.
//   - CommitCursor returns before the fsync (seed "Cursors": no per-commit
//     fsync); the event is synced with the next batch. A crash may lose
//     returned cursor commits, never records.
//   - SetConfirmWatermark is persisted lazily with the next batch.
//   - A stream's meta is written in the same transaction as (or a later one
//     than) the entries it counts, so a durable tail never claims missing
//     entries. Entries past a durable tail (a crash inside a split batch)
//     are deleted when the stream is opened. Badger truncates a torn WAL
//     tail on open.
//
// # Ordering invariants
//
// Ops of one stream are queued under the stream's lock in the order their
// offsets were assigned, and applied in queue order, so the durable tail
// only moves over dense, written offsets. State, Read, ChainAt and
// ReadCursorEvents see only durable entries (followers receive cursor
// events only once they are durable on the owner). The assigned view (what
// has been queued) runs ahead of the durable one only while ops are in
// flight.
//
// # Waiting
//
// WaitTail, WaitConfirmed and WaitCursorEventTail return channels closed
// once the durable record tail, the confirm watermark or the durable cursor
// event tail passes an offset; WaitTail also on every new durable cursor
// event. All of them also close on close, drop, seal, epoch change, cut and
// reset, so waiters re-check the copy. Waiters on the same condition share
// one channel, so abandoned waits do not accumulate.
//
// # Epochs and seals
//
// LogEpochs record which owner history each range of both logs followed
// (seed "Copies with a longer tail"): AdvanceEpoch appends {epoch, record
// tail, cursor event tail}; replicated entries with an epoch above the last
// one add one; a last entry that starts at the same tails (it holds no
// entries) is replaced rather than kept. Seal fences the copy at the fence
// epoch in O(1): the first seal saves the log epochs it replaces in
// SealedLogEpochs (the seal advances the epochs without data), a newer
// transition at the same fence takes over, and AdvanceEpoch at or above the
// fence releases the seal in place and clears them.
//
// # Cut
//
// Cut (cut.go) truncates both logs of a copy with a longer tail to the cut
// point the broker computed, never below the retained head. Protocol: write
// the intent (tails, chain and bytes after the cut) durably into meta; cut
// the record log; cut the cursor event log; write the new cursor snapshot
// and the final meta, clearing the intent, in one transaction. A crash at
// any point leaves the intent and the next open completes the same cut, so
// a cut is idempotent. Cursors above the new record tail are clamped to it
// (and the clamp is written into the snapshot); a snapshot that covered
// events past the cut keeps its state with the boundary lowered to the cut,
// so the new owner's events there replay.
//
// Known limits (seed "Known limits"): after an accepted owner loss the
// recorded start is the new owner's tails as its heartbeat last published
// them, which can lag its log, so a returning copy may cut lower than needed
// and fetch shared records again; and the owner of an epoch is never cut at
// its own start. Storage executes the cut it is given; choosing it is the
// broker's job.
//
// # Retention
//
// ApplyRetention moves the head forward by max records, max bytes (encoded
// record bytes) and max age (publish time), never past the confirm
// watermark. The new head and the chain below it are made durable first;
// records below it are then deleted in bounded batches, tracked by a purge
// mark in meta that the next open resumes. Cursors read clamped to [head,
// tail].
//
// # Memory
//
// Badger runs with two 16 MiB memtables (Options.MemTableBytes), 4 MiB
// tables, a 16 MiB block cache and 8 MiB index cache (Options.CacheBytes),
// 64 MiB value log files, two compactors and no block compression. Values
// up to 1 MiB stay in the LSM tree; larger ones go to the value log, which
// is not garbage-collected. Badger maps its tables and logs into memory, so
// RSS also counts file pages the kernel can reclaim; the Go heap is bounded
// by the settings above times GOGC, which a broker caps with GOMEMLIMIT.
package storage
