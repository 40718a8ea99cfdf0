package storage

import (
	"encoding/binary"
	"fmt"
)

// Key kinds. Every key starts with one kind byte; stream keys follow it with
// the stream name, length-prefixed so that no stream's prefix is a prefix of
// another's. Offsets are 8-byte big-endian so Badger's byte order is offset
// order. The layout is documented in doc.go; change both together.
const (
	kindMeta     byte = 'm' // m | len | name            -> meta (JSON)
	kindRecord   byte = 'r' // r | len | name | last     -> record segment (segment.go)
	kindEvent    byte = 'e' // e | len | name | offset   -> cursor event (codec.go)
	kindSnapshot byte = 's' // s | len | name            -> cursor snapshot (JSON)
	// p | len | name | generation | chunk -> producer table checkpoint
	// chunk (checkpoint.go, producers.go)
	kindProducers byte = 'p'
	// t | seq | chunk -> the tails of the streams one group changed
	// (tails.go): 8-byte group, 2-byte chunk, both big-endian
	kindTails byte = 't'
	// g: never written, the engine's (engine.ReservedKeyByte): its value
	// log GC drops it to make Badger flush its rotated memtables.
)

// maxStreamName bounds a stream name so its length fits the one-byte prefix.
const maxStreamName = 255

func validStreamName(name string) error {
	if name == "" || len(name) > maxStreamName {
		return fmt.Errorf("%w: stream name of %d bytes (want 1..%d)", ErrInvalidArgument, len(name), maxStreamName)
	}
	return nil
}

// streamKey is kind | len(name) | name.
func streamKey(kind byte, name string) []byte {
	k := make([]byte, 0, 2+len(name)+8)
	k = append(k, kind, byte(len(name)))
	return append(k, name...)
}

// offsetKey is kind | len(name) | name | offset (big-endian).
func offsetKey(prefix []byte, off uint64) []byte {
	k := make([]byte, len(prefix), len(prefix)+8)
	copy(k, prefix)
	return binary.BigEndian.AppendUint64(k, off)
}

// keyOffset returns the offset at the end of a record or event key.
func keyOffset(k []byte) uint64 {
	return binary.BigEndian.Uint64(k[len(k)-8:])
}

// nameFromMetaKey returns the stream name of a meta key.
func nameFromMetaKey(k []byte) (string, bool) {
	if len(k) < 2 || k[0] != kindMeta || int(k[1]) != len(k)-2 {
		return "", false
	}
	return string(k[2:]), true
}
