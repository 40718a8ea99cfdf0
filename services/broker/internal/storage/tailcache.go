package storage

import "sync/atomic"

// The tail cache keeps each stream's newest written records in memory
// (advanceWritten fills it once Badger has taken them), so an owner ships
// a batch to its followers, and serves subscribers at the tail, without
// reading it back from Badger (a read transaction, an iterator and a value
// log read per batch). It is only a copy of what Badger holds: Read and
// ReadWritten serve from it exactly what they would read from Badger, each
// bounded by its own tail (durable or written), and anything that lowers
// or replaces the log (cut, reset) empties it first (setDurable), so it
// never shows a record the log does not hold at that offset.
//
// Memory is bounded twice: per stream (Options.TailCacheBytes) and for the
// whole DB (Options.TailCacheTotalBytes), so many streams cannot add up past
// a fixed budget. A stream that finds the budget spent keeps no tail and
// reads from Badger, which is slower and otherwise the same.

const (
	// DefaultTailCacheBytes is a stream's tail cache bound: about 8 follow
	// batches of 1 KiB records, more than a follower keeps unacknowledged
	// at the default flow control window in the common case.
	DefaultTailCacheBytes = 4 << 20
	// DefaultTailCacheTotalBytes bounds the tail caches of all streams.
	DefaultTailCacheTotalBytes = 64 << 20
)

type tailCache struct {
	recs  []Record // dense: recs[i].Offset == recs[0].Offset+i
	sizes []int
	bytes int
	max   int
	total *atomic.Int64 // the DB-wide budget's use
	limit int64
}

// end is the offset after the cached records (only meaningful when
// non-empty).
func (c *tailCache) end() uint64 {
	return c.recs[0].Offset + uint64(len(c.recs))
}

// add appends written records that follow the cached ones; records that
// do not (a gap after the cache was emptied) restart it.
func (c *tailCache) add(recs []Record) {
	if len(recs) == 0 || c.max <= 0 {
		return
	}
	if len(c.recs) > 0 && c.end() != recs[0].Offset {
		c.clear()
	}
	for i := range recs {
		n := recordSize(&recs[i])
		if n > c.max {
			c.clear()
			continue
		}
		for len(c.recs) > 0 && (c.bytes+n > c.max || c.total.Load()+int64(n) > c.limit) {
			c.dropFirst()
		}
		if c.total.Load()+int64(n) > c.limit {
			// The DB-wide budget is spent by other streams.
			c.clear()
			return
		}
		c.recs = append(c.recs, recs[i])
		c.sizes = append(c.sizes, n)
		c.bytes += n
		c.total.Add(int64(n))
	}
}

func (c *tailCache) dropFirst() {
	c.bytes -= c.sizes[0]
	c.total.Add(-int64(c.sizes[0]))
	c.recs[0] = Record{}
	c.recs, c.sizes = c.recs[1:], c.sizes[1:]
	// Reclaim the dropped front once it is most of the backing array.
	if cap(c.recs) > 64 && len(c.recs) < cap(c.recs)/4 {
		c.recs = append([]Record(nil), c.recs...)
		c.sizes = append([]int(nil), c.sizes...)
	}
}

func (c *tailCache) clear() {
	c.total.Add(-int64(c.bytes))
	clear(c.recs)
	c.recs, c.sizes, c.bytes = c.recs[:0], c.sizes[:0], 0
}

// read returns cached records from offset from up to end (exclusive), at
// most maxBytes (0: no bound) but at least one, or ok false when from is
// not cached. Only records below end are returned, so a caller bounded by
// the durable tail or the confirm watermark stays bounded.
func (c *tailCache) read(from, end uint64, maxBytes int) ([]Record, bool) {
	if len(c.recs) == 0 || from < c.recs[0].Offset || from >= c.end() {
		return nil, false
	}
	i := int(from - c.recs[0].Offset)
	j := i
	bytes := 0
	for j < len(c.recs) && c.recs[j].Offset < end {
		if maxBytes > 0 && j > i && bytes+c.sizes[j] > maxBytes {
			break
		}
		bytes += c.sizes[j]
		j++
	}
	return append([]Record(nil), c.recs[i:j]...), true
}
