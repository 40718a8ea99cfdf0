package cluster

import (
	"maps"
	"slices"

	"github.com/segmentio/encoding/json"
)

// MaxHeartbeatBytes bounds one heartbeat shard's value. etcd refuses a
// request above its --max-request-bytes (1.5 MiB by default), and a broker
// that could not write its heartbeat could not report a seal or a suspect
// owner either, so a value is bounded well under it: at about 110 bytes a
// copy, 512 KiB holds some 4,700 copies in a shard, 75,000 on a broker.
const MaxHeartbeatBytes = 512 << 10

// MaxHeartbeatTxnBytes bounds the values one heartbeat transaction carries:
// a broker writes its changed shards together (one revision), split over
// several transactions only when their values pass this bound, which keeps
// each request under etcd's --max-request-bytes with room for the keys.
const MaxHeartbeatTxnBytes = 1 << 20

// Heartbeat shards are the one value type written and read in bulk: a
// mass failover rewrites every shard holding a changed copy several times,
// and the controller decodes each value a broker writes (docs/limits.md,
// "A mass failover takes seconds"). They are encoded and decoded with
// segmentio's encoding/json, which reads and writes them as the standard
// library does (TestHeartbeatCodecMatchesStandardLibrary, and its fuzz
// target for any bytes a key may hold) at about a third of its CPU. Not
// every value type: it writes a time.Duration as text where the standard
// library writes nanoseconds (a stream's retention), so the others keep
// Encode.

// EncodeHeartbeat is Encode for a heartbeat shard.
func EncodeHeartbeat(hb Heartbeat) string { return encodeWith(json.Marshal, hb) }

// DecodeHeartbeat is Decode for a heartbeat shard. A value the fast
// codec refuses is read again with the standard library, whose reading is
// the one the format means: the fast codec parses times more strictly
// (a one-digit hour, which no broker writes but the standard library
// takes; testdata/fuzz/FuzzHeartbeatCodec), and a refused value would
// otherwise hide the broker's copies from the controller.
func DecodeHeartbeat(raw []byte) (Heartbeat, error) {
	if hb, err := decodeWith[Heartbeat](json.Unmarshal, raw); err == nil {
		return hb, nil
	}
	return Decode[Heartbeat](raw)
}

// BoundHeartbeat encodes hb within limit bytes. A value that fits is hb
// itself. One that does not keeps the copies in name order while the
// value fits and leaves the rest out, counting them in Omitted: a value
// etcd would refuse is never sent (it would fail every heartbeat after
// it, the ones that fit included). It returns the encoded value and the
// streams left out. limit must leave room for a shard with no copies (a
// few hundred bytes); MaxHeartbeatBytes does, by far.
func BoundHeartbeat(hb Heartbeat, limit int) (string, []string) {
	v := EncodeHeartbeat(hb)
	if len(v) <= limit {
		return v, nil
	}
	names := slices.Sorted(maps.Keys(hb.Streams))
	kept := make(map[string]CopyTails, len(names))
	empty := hb
	empty.Streams = kept
	empty.Omitted = len(names)
	// The envelope with every copy omitted, plus per copy its name, its
	// status and two bytes of separators: a bound on the value's size.
	size := len(EncodeHeartbeat(empty))
	n := 0
	for _, name := range names {
		k, _ := json.Marshal(name)
		t, _ := json.Marshal(hb.Streams[name])
		if size+len(k)+len(t)+2 > limit {
			break
		}
		size += len(k) + len(t) + 2
		kept[name] = hb.Streams[name]
		n++
	}
	out := hb
	out.Streams = kept
	out.Omitted = len(names) - n
	return EncodeHeartbeat(out), names[n:]
}
