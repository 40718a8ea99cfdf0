// Package storage is a broker's durable store: every stream copy the broker
// holds, in one log engine. A copy is a record log, a cursor event log
// and metadata (epochs, seal, retained head, confirm watermark, cursor
// snapshot). The failover rules it serves are in docs/protocol.md;
// the section names below refer to it.
//
// # Layers
//
// Two packages, one on the other:
//
//   - package engine (engine/doc.go) owns Badger: its options and logger,
//     the committer and group commit, fsync, the repair of log files a
//     power loss left short, the roll back of a torn newest transaction,
//     the value log GC, the advice on Badger's mappings and the boot
//     record that tells whether written data may be lost. Its API is
//     batches of keyed entries, key range reads and deletes, and what an
//     open learned from a recovery.
//   - this package is the stream-copy model, written against that API
//     only (no file of it imports Badger, TestModelDoesNotImportBadger):
//     the key layout, epochs, seal, cut, cursors and snapshots, producers,
//     retention, the confirm watermark, the segment codec, the tail cache
//     and incarnations.
//
// # Key layout
//
// Every key starts with a kind byte; stream keys then carry the stream name
// prefixed by its length in one byte, so no stream's keys are a prefix of
// another's. Offsets are 8-byte big-endian, so Badger's key order is offset
// order and a range of offsets is a key range.
//
//	m | len | name            meta: epochs, seal, head, tails, chain, bytes,
//	                          confirm watermark, cut intent, cursor event
//	                          purge mark (JSON)
//	r | len | name | last     record segment (segment.go): the records of
//	                          one appended batch, keyed by the offset of
//	                          the last one, each in its codec.go encoding
//	                          (version, offset, epoch, publish time,
//	                          sequence, chain, producer id, sorted headers,
//	                          payload)
//	e | len | name | offset   cursor event (codec.go: version, offset, epoch,
//	                          position, cursor name)
//	s | len | name            cursor snapshot: boundary + cursor positions (JSON)
//	p | len | name | gen | chunk
//	                          producer table checkpoint chunk (producers.go:
//	                          8-byte generation, 4-byte chunk, both big-endian)
//	t | group | chunk         tails of the streams one group commit
//	                          appended to (tails.go: 8-byte group, 2-byte
//	                          chunk, both big-endian; below the value
//	                          threshold), until the next checkpoint
//	g                         never written (engine.ReservedKeyByte): the
//	                          value log GC drops it to flush Badger's
//	                          memtables (engine/vlog.go)
//
// # Logs, tails and the chain
//
// Records sit at dense offsets [head, record tail); cursor events at dense
// offsets [cursor events purged, cursor event tail), where the purge mark
// is at most the cursor snapshot's boundary (see "Cursor compaction").
// Tails are exclusive. Each record carries
// Chain = Chain(chain of the previous record, record), see Chain for exactly
// what it covers; the chain of an empty log is 0, and the chain below the
// head is kept in meta so ChainAt works at the head after retention or
// ResetTo. Copies whose chains agree at an offset hold the same prefix.
//
// # Durability
//
// All writes are ops (commit.go) handed to the engine's one committer
// goroutine (engine/commit.go). It drains every queued op, writes them in
// one Badger transaction (split only at Badger's transaction bound) with
// SyncWrites off, each stream's newest metadata (or, when only its tails
// changed, its tails in the group's tails entry, tails.go) after all of
// them (groupMeta), and then fsyncs the memtable WAL and the value log.
// This is the group commit: concurrent appends to any streams share one
// fsync. The engine's durability contract is in engine/doc.go.
//
//   - Append, AppendReplicated, Seal, AdvanceEpoch, ResetTo, Cut, Snapshot,
//     InstallCursorSnapshot, Drop and retention return only after their
//     writes are fsynced.
//   - Between a batch's Badger commit and its fsync, its records are
//     written (Stream.WrittenTail, ReadWritten, WaitWritten): in Badger's
//     files, so in the OS page cache, and safe from a crash
//     of the process but not of the machine. An owner ships them to
//     followers from there so their fsyncs overlap its own; nothing counts
//     toward W or is shown to readers before it is durable. Whether the
//     last stop was unclean on an earlier boot, so that written records
//     may be gone, is kept in two files next to Badger's (engine/boot.go,
//     DB.MayHaveLostWritten).
//   - A machine crash between a commit and its fsync can leave keys and
//     metadata on disk whose values in the value log are not (two files,
//     written back in any order). Only the newest transaction
//     can be torn so, since every batch is synced before the next. After
//     such a stop, the engine rolls that transaction back if any of its
//     values cannot be read (engine/torn.go), and the model marks every
//     copy unsure of its epoch (State.UnsureEpoch, torn.go), before the
//     boot is trusted again (engine/boot.go). Every value log read checks
//     the value's checksum.
//   - CommitCursor returns before the fsync (docs/protocol.md, "Cursors": no per-commit
//     fsync); the event is synced with the next batch. A crash may lose
//     returned cursor commits, never records.
//   - SetConfirmWatermark is persisted lazily: with the stream's next
//     metadata write, or within 500 ms by a write of its own (synced like
//     every batch, so that only the newest transaction can be torn; nobody
//     waits for it; a crash can only leave an older value).
//   - A stream's meta, or its tails entry when only its tails changed
//     (tails.go), is written in the same transaction as (or a later one
//     than) the entries it counts, so a durable tail never claims missing
//     entries. Entries past a durable tail (a crash inside a split batch)
//     are deleted when the stream is opened. Open folds the tails entries
//     into the metadata before any stream is loaded. Badger truncates a
//     torn WAL tail on open.
//   - Open opens from every state a power loss can leave Badger's log files
//     in: a write-ahead log or value log file shorter than its header (one
//     Badger created and nothing synced yet) holds no synced entry and is
//     removed before Badger opens, which it otherwise refuses to
//     (engine/repair.go).
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
// # Reads
//
// A read the tail cache answers (tailcache.go) begins no engine
// transaction. One it cannot answer, and the read of a record's chain,
// runs in one of logReadSlots read slots (readLog): the follows of a
// rejoining broker start together, and thousands of read transactions
// begun at once would keep the broker's goroutines waiting to run for
// seconds (docs/limits.md, "A rejoin is paced").
//
// # Locks
//
// No type keeps more than one lock's worth of state: each lock and exactly
// the state it guards live in a small type of their own, held by its owner
// as a named field, never embedded (an embedded type's fields are promoted,
// so the owner would still keep them); TestOneLockPerType checks it here
// and in package engine.
//
//   - Stream: assigned (assignedView: mu and the assigned view, that is
//     the metadata, cursor state, snapshot counters, producer table, closed
//     and the role fence) and durable (durableView: dmu and the durable and
//     written views, the watermark, the waiters and the tail cache). A
//     method that needs both views (State, read) stays on Stream and takes
//     assigned.mu before durable.dmu; the committer takes only durable.dmu.
//     prodGarbage (checkpointGarbage) has its own leaf lock. admin only
//     serialises Cut, ResetTo and retention against each other and guards
//     no state; it is taken before assigned.mu. onDurable (durableHook:
//     the function OnDurable registered) holds its lock while the function
//     runs, on the committer after durable.dmu is released, so the
//     function may take durable.dmu. Lock order: admin, assigned.mu,
//     onDurable.mu, durable.dmu; checkpointGarbage.mu is a leaf.
//   - DB: streams (streamRegistry: the open streams by name, held while a
//     stream loads and so before any stream's locks), wm (watermarkQueue:
//     streams whose raised watermark waits for the flush, added to under
//     durable.dmu), compact (compactQueue: streams waiting for cursor event
//     compaction) and closing (closeGuard: Close's flag, held through
//     Close). Lock order: closing.mu, streams.mu, then a stream's; the two
//     queues are leaves.
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
// (docs/protocol.md, "Copies with a longer tail"): AdvanceEpoch appends {epoch, record
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
// so the new owner's events there replay, unless the cut is below the
// retained cursor events (see "Cursor compaction").
//
// Known limits (docs/limits.md): after an accepted owner loss the
// recorded start is the new owner's tails as its heartbeat last published
// them, which can lag its log, so a returning copy may cut lower than needed
// and fetch shared records again; and the owner of an epoch is never cut at
// its own start. Storage executes the cut it is given; choosing it is the
// broker's job.
//
// # Cursor compaction
//
// The cursor state is the snapshot plus the events after its boundary, so
// events below a durable snapshot's boundary are deleted (compact.go). A
// snapshot is taken by the rule in cursor.go (snapshotEvery events or
// snapshotEveryBytes encoded bytes since the last one, never before those
// bytes reach the last snapshot's size), by Snapshot, by a cut and by
// InstallCursorSnapshot. Each copy applies the rule to its own log and
// compacts after its own durable snapshot; nothing of it is replicated.
//
//   - The snapshot goes in the transaction of the metadata that counts its
//     events (or before it, in a split batch: the boundary read on open is
//     capped at the tail). Nothing is deleted before it is synced, so a
//     torn snapshot transaction, rolled back on open (engine/torn.go),
//     lost no event.
//   - Then a loop off the committer deletes [purge mark, boundary) in
//     batches of compactBatch keys, each in one transaction with the purge
//     mark it moves; repeating a batch finds nothing. Open finishes a
//     compaction a stop left, before the copy is used.
//   - ReadCursorEvents serves from the cursor event head (CursorEventHead),
//     moved past a batch before the batch is deleted, and refuses reads
//     below it with ErrOutOfRange; CursorSnapshot stands for them. An owner
//     ships the snapshot to a follower below its head, which installs it
//     (InstallCursorSnapshot: snapshot, new tail and head in one
//     transaction) before any later event.
//   - A cut below the purge mark restarts the cursor event log empty at 0
//     (cutIntent.ResetCursors) rather than keep a snapshot that folded
//     events past the cut; the copy takes the new owner's state on its
//     next follow. A cut at or above it never reads a deleted event: it
//     reads only from the snapshot's boundary up. A sealed copy compacts
//     nothing until its seal is released, so the tail it reported for its
//     next cut (CursorEventTailAfterCut) stays what that cut leaves.
//
// # Idempotent publish
//
// A record may carry a producer id and a sequence (idempotent publish,
// docs/api.md); the pair is
// part of the record, so it is in the log, covered by the chain and
// replicated with it. Sequence 0 means none: only records with both take
// part. Each copy keeps a producer table (producers.go): per producer, the
// last sequence and the offsets of its newest records, at most
// ProducerWindow records (default 65536, the largest publish) in at most
// ProducerBatches runs (default 256), for at most MaxProducers producers
// (default 10000), the least recently appended evicted first. A batch of
// consecutive sequences at consecutive offsets is one run of 16 bytes, so a
// retry of any one batch whose answer was lost can be answered, and memory
// is bounded by MaxProducers x ProducerBatches runs per stream copy: 40 MiB
// at the defaults, reached only by 10000 producers whose publishes all
// interleave; 256 producers publishing batches of 64 hold tens of KiB.
//
// The owner checks a batch in AppendIdempotent under the stream's
// assigned.mu, where offsets are assigned, so concurrent publishes cannot
// both store a sequence:
//
//   - a sequence at or below the producer's last and within the window is a
//     duplicate: the original offset is returned, nothing is stored;
//   - the producer's next sequence is stored; so is any sequence of an
//     unknown producer (Kafka's rule: the producer may be new, or evicted;
//     a retry older than an eviction is then stored again, which the limits
//     make unlikely);
//   - a sequence past the next is ErrSequenceGap; one older than the window
//     is ErrBelowWindow; a duplicate after a new record of the batch, or a
//     producer's sequences not consecutive inside the batch, is
//     ErrSequenceOrder. Any of them fails the whole batch.
//
// Duplicates may only form a prefix of a batch: a retry of a batch of which
// a copy holds the first part. A batch of duplicates only returns once the
// originals are durable (the table takes records when they are queued).
//
// The table is a function of the log. It changes only on appends (not on
// lookups), and owner appends, AppendReplicated and replay apply one rule
// (producerTable.apply): the next sequence extends the producer's window,
// any other starts a new one. So followers hold the owner's table, and a
// promoted copy deduplicates what the old owner stored.
//
// Checkpoints bound the work to rebuild it (checkpoint.go). With an append,
// once ProducerCheckpointRecords records (default 8192, at least the
// table's size in runs) follow the last checkpoint, the table is written in
// chunks under a new generation, with the record tail it covers as its
// boundary (Snapshot writes one too); the meta names the newest two
// (ProducerTables). Chunks are deleted only after a durable meta stopped
// naming them; Open deletes any the meta does not name.
//
//   - Open: the newest checkpoint in [head, record tail] plus the records
//     after it (at most the checkpoint interval).
//   - Retention writes a checkpoint at the record tail before moving the
//     head past the newest one, so that one is always usable.
//   - Cut: the newest checkpoint at or below the cut plus the records up to
//     it; two checkpoints cover a cut of up to an interval of records. A
//     deeper cut (possible after an accepted owner loss) replays the last
//     65536 records before the cut only: producers that published only
//     before them are forgotten, so their old retries count as new. The
//     rebuilt table is checkpointed with the cut, and checkpoints past it
//     retired, in the cut's last transaction.
//   - ResetTo: the table restarts empty at the new head (checkpointed with
//     the reset); the records it knew are gone from this copy.
//
// A copy written before checkpoints existed is rebuilt like a deep cut.
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
// 64 MiB value log files, two compactors and no block compression (set in
// package engine). Values up to 512 bytes stay in the LSM tree; larger ones
// go to the value log, written once and sequentially, so compaction moves
// only pointers. A background loop (engine/vlog.go) asks Badger every
// minute to rewrite value log files that retention, cuts and drops left at
// least half garbage; appends wait while one file is rewritten, because the
// rewrite is made durable (synced, memtables flushed) before Badger may
// delete the old file, and no commit may sit unsynced in a memtable the
// rewrite rotates out. A rewrite that holds writes past 30 s fails the
// store (the broker stops, its streams fail over). A power loss during a
// rewrite, before its sync, can leave a moved value torn at its new place;
// a marker file kept while a rewrite is not durable makes the next open
// read the moved values back from the old file, which is kept until then
// (engine/torn.go, engine/vlog.go), and cut a copy below any found nowhere
// (torn.go). Badger maps its tables and logs into memory, so RSS also
// counts file pages the kernel can reclaim; the Go heap is bounded by the
// settings above times GOGC, which a broker caps with GOMEMLIMIT.
package storage
