// Package engine is a broker's log engine: the ordered, durable key-value
// store under the stream-copy model of package storage. It owns Badger
// entirely (its options, logger, files and repair), so the model above it
// reads as streams, epochs and seals, not as value log crash repair. It is
// named for its job, not for Badger: the model sees keyed entries written
// in batches, group-committed and fsynced, and key ranges read back; which
// store holds them is this package's business alone.
//
// # API
//
//   - Open opens the store in a directory, repairing and recovering what a
//     stop left (below); Settle ends the open once the caller did its own;
//     StopWrites (or StopWritesAfter, with a batch written after every
//     other) and Close end it.
//   - Batch (Set, Delete) is a unit of writes; Enqueue, TryEnqueue and Do
//     hand it to the committer. OnGroup, OnWritten and OnDone (Options)
//     tell the caller, on the committer, when a group of batches is being
//     written, is written and is durable.
//   - View reads one consistent version: Get, and NewIterator over a key
//     prefix in either direction. DeleteRange deletes a key range through
//     the committer in bounded, durable batches.
//   - Recovery says what Open learned about the last stop; Err whether the
//     engine still takes writes.
//
// # Locks
//
// Engine keeps each lock with exactly the state it guards in a type of its
// own, held as a named field (storage's TestOneLockPerType checks it):
//
//   - gate (enqueueGate): an RWMutex and closed; senders hold it shared
//     while they send, StopWrites exclusively to set closed (and queue
//     StopWritesAfter's last batch), so the committer sees every batch
//     that was accepted, and the last one after them.
//   - stopping (stopGuard): writesStopped and gcStarted; it orders starting
//     the value log GC (Settle) against StopWrites, and Close against
//     itself.
//   - failure (failureLatch): the first write error, after which every
//     batch is refused.
//   - writeMu guards no state: it keeps Badger's two writers, the committer
//     (commit through fsync) and the value log GC (rewrite through its
//     flush), from interleaving (vlog.go). Lock order: writeMu, then
//     gate's or failure's; stopping's before failure's; gate's
//     and failure's are leaves.
//
// # Durability contract
//
// Every write goes through one committer goroutine (commit.go). It takes
// every batch queued, writes them in one Badger transaction (split only at
// Badger's transaction bound, TxnBytes, each part synced before the next)
// with SyncWrites off, and then calls Badger's DB.Sync, which fsyncs the
// active memtable's write-ahead log and the value log (badger v4.9.6
// db.go). So:
//
//   - Do returns, and OnDone reports nil, only after the batch is fsynced.
//     Batches queued together share one fsync (group commit).
//   - Between a group's commit and its fsync (OnWritten to OnDone) its
//     entries are written: in Badger's files, so in the OS page cache, and
//     readable by View. A crash of the process loses none of them; a crash
//     of the machine may lose them, and only them.
//   - A failed write or fsync stops the engine: OnFail is called once,
//     every later batch fails with ErrClosed, and the next open distrusts
//     what was written (the boot record is forgotten, boot.go).
//   - Only the newest transaction can be torn by a machine crash, since
//     every transaction is synced before the next is written, and the
//     value log GC, the one other writer, never writes between a commit and
//     its sync and makes its rewrite durable before Badger deletes the file
//     it rewrote (vlog.go).
//
// # What Open guarantees after a power loss
//
// Before Badger opens, write-ahead log and value log files shorter than
// their header, which hold no synced entry, are removed (repair.go):
// Badger refuses to open an empty one. Then, when the last stop was
// unclean and the machine rebooted since (or that cannot be told,
// boot.go), Open recovers on Badger opened without compactions (torn.go):
// a newest transaction any of whose values cannot be read is rolled back
// to the versions below it, values a value log GC moved before the power
// loss are read back from the file they were moved from, and the caller's
// Recover step runs (the model marks its copies unsure of their epoch).
// Each step is synced and recorded, so a crash in the middle of a recovery
// does the rest on the next open. After Open, Recovery tells the caller
// that written data may be missing (MayHaveLostWritten) and whether values
// were lost beyond repair (ValuesLost: read back what you rely on); until
// Settle, a read transaction keeps compaction from dropping the versions a
// roll back after another crash would need, and the value log GC waits.
//
// The store then holds exactly what the last fsync covered: every batch
// whose Do returned (or whose OnDone reported nil) is there, whole.
//
// # Where the contract is tested
//
// Each clause is tested through this package's API alone: a process
// killed in the middle of its batches keeps every batch written or
// acknowledged, whole, and none in part, and one killed between the
// transactions of a split group keeps what OnGroup returned behind its
// batches' entries (crash_test.go); a failed write
// fails its group, calls OnFail once and refuses the rest with ErrClosed
// (fault_test.go), and so does a full disk (fulldisk_linux_test.go); the
// value log GC racing overwrites and deletes keeps every latest value,
// and keeps the file it rewrote until the rewrite is durable (gc_test.go);
// a torn newest transaction is rolled back, also when a crash cuts the
// roll back short, and a value log GC rewrite a power loss cut short is
// repaired or reported (ValuesLost) (torn_test.go); every power-loss
// state of the newest log files opens (repair_test.go); StopWrites
// writes every batch accepted before it (stop_test.go); and
// MayHaveLostWritten follows the boot (boot_test.go). What the model
// builds on them (record tails, unsure epochs) is tested in package
// storage.
//
// # Memory
//
// Badger runs with two 16 MiB memtables (Options.MemTableBytes), 4 MiB
// tables, a 16 MiB block cache and 8 MiB index cache (Options.CacheBytes),
// 64 MiB value log files, two compactors and no block compression. Values
// up to 512 bytes stay in the LSM tree; larger ones go to the value log,
// written once and sequentially. Badger maps its tables and logs into
// memory; the committer advises those mappings (mappings_linux.go) so that
// fsyncs write only what changed and the resident set stays flat.
package engine
