package storage

import (
	"encoding/binary"
	"hash/crc64"
	"slices"
)

// chainTable is CRC-64/ECMA: deterministic across processes and machines
// (unlike hash/maphash) and fast on long payloads (slicing-by-8).
var chainTable = crc64.MakeTable(crc64.ECMA)

// Chain returns the chain value of rec given the chain of the prefix before
// it. It covers, in this order: the previous chain value, the record's
// offset, epoch, publish time (Unix nanoseconds; a zero time as
// math.MinInt64), producer id, sequence, the headers sorted by key and the
// payload. Integers are 8-byte big-endian; strings and byte slices are
// prefixed with their 4-byte big-endian length. The record's own Chain field
// is not covered. The chain of an empty log is 0; after ResetTo it continues
// from the value given there.
func Chain(prev uint64, rec *Record) uint64 {
	var buf [8]byte
	c := uint64(0)
	put := func(v uint64) {
		binary.BigEndian.PutUint64(buf[:], v)
		c = crc64.Update(c, chainTable, buf[:])
	}
	putBytes := func(b []byte) {
		binary.BigEndian.PutUint32(buf[:4], uint32(len(b)))
		c = crc64.Update(c, chainTable, buf[:4])
		c = crc64.Update(c, chainTable, b)
	}
	putString := func(s string) { putBytes([]byte(s)) }

	put(prev)
	put(rec.Offset)
	put(rec.Epoch)
	put(uint64(unixNanos(rec.PublishTime)))
	putString(rec.ProducerID)
	put(rec.Sequence)
	keys := make([]string, 0, len(rec.Headers))
	for k := range rec.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	put(uint64(len(keys)))
	for _, k := range keys {
		putString(k)
		putString(rec.Headers[k])
	}
	putBytes(rec.Payload)
	return c
}
