package engine

import (
	"errors"

	"github.com/dgraph-io/badger/v4"
)

// Reads. A read sees one consistent version of the store: every group the
// committer wrote before it began (written, whether or not its fsync has
// returned yet). What is durable is the caller's to track (OnDone).

// Txn is a read-only view of the store, valid inside View's function.
type Txn struct{ t *badger.Txn }

// View runs fn on a read-only view of the store.
func (e *Engine) View(fn func(*Txn) error) error {
	return e.bdb.View(func(t *badger.Txn) error { return fn(&Txn{t: t}) })
}

// Recovering is the store while a recovery runs (Options.Recover): the
// caller reads it and writes back, durably, before the committer starts.
type Recovering struct {
	bdb   *badger.DB
	hooks *Hooks
}

// View runs fn on a read-only view of the store being recovered.
func (r *Recovering) View(fn func(*Txn) error) error {
	return r.bdb.View(func(t *badger.Txn) error { return fn(&Txn{t: t}) })
}

// Write writes entries durably (synced before it returns).
func (r *Recovering) Write(entries []Entry) error {
	return writeBack(r.bdb, entries, r.hooks)
}

// Get returns the item stored under key, or ErrNotFound.
func (t *Txn) Get(key []byte) (Item, error) {
	item, err := t.t.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return Item{}, ErrNotFound
	}
	if err != nil {
		return Item{}, err
	}
	return Item{i: item}, nil
}

// IterOptions chooses what an Iterator walks.
type IterOptions struct {
	// Prefix: only keys that start with it.
	Prefix []byte
	// Reverse walks keys in descending order (Seek then finds the largest
	// key at or below its argument).
	Reverse bool
	// Prefetch, when above 0, reads that many values ahead of the
	// iterator (for scans that read every value).
	Prefetch int
}

// Iterator walks keys in order. Close it before View's function returns.
type Iterator struct{ it *badger.Iterator }

// NewIterator returns an iterator over the keys opts selects; it starts
// invalid until Seek or Rewind.
func (t *Txn) NewIterator(opts IterOptions) *Iterator {
	return &Iterator{it: t.t.NewIterator(badger.IteratorOptions{
		Prefix:         opts.Prefix,
		Reverse:        opts.Reverse,
		PrefetchValues: opts.Prefetch > 0,
		PrefetchSize:   opts.Prefetch,
	})}
}

// Seek moves to the first key at or after key (at or before it, in
// reverse).
func (i *Iterator) Seek(key []byte) { i.it.Seek(key) }

// Rewind moves to the first key.
func (i *Iterator) Rewind() { i.it.Rewind() }

// Valid reports whether the iterator is at a key.
func (i *Iterator) Valid() bool { return i.it.Valid() }

// Next moves to the next key.
func (i *Iterator) Next() { i.it.Next() }

// Item is the key the iterator is at.
func (i *Iterator) Item() Item { return Item{i: i.it.Item()} }

// Close releases the iterator.
func (i *Iterator) Close() { i.it.Close() }

// Item is one key and its value, valid until the iterator moves or View's
// function returns.
type Item struct{ i *badger.Item }

// Key is the item's key; copy it (KeyCopy) to keep it.
func (it Item) Key() []byte { return it.i.Key() }

// KeyCopy appends the key to dst.
func (it Item) KeyCopy(dst []byte) []byte { return it.i.KeyCopy(dst) }

// Value calls fn with the value, valid only during fn. A value the engine
// cannot read whole (a value log entry a power loss tore, see torn.go, or
// one that fails its checksum) reads as empty, not as an error: Badger
// logs it (badger v4.9.6 iterator.go, yieldItemValue). The caller stores no
// empty value it relies on, and decodes what it reads.
func (it Item) Value(fn func([]byte) error) error { return it.i.Value(fn) }

// ValueCopy appends the value to dst.
func (it Item) ValueCopy(dst []byte) ([]byte, error) { return it.i.ValueCopy(dst) }
