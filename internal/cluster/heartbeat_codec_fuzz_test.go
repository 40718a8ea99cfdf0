package cluster

import (
	stdjson "encoding/json"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"
)

// heartbeatSamples are shards as brokers write them, the first with
// copies copies: every field of a copy's status set and left out, names
// that JSON escapes.
func heartbeatSamples(copies int) []Heartbeat {
	at := time.Date(2026, 12, 4, 14, 30, 0, 123456789, time.UTC)
	full := Heartbeat{Node: "broker-1", Shard: 12, Time: at, Streams: map[string]CopyTails{}, Omitted: 2}
	for i := range copies {
		full.Streams[fmt.Sprintf("durable-%04d", i*37)] = CopyTails{Epoch: uint64(i % 3), Role: []string{RoleOwner, RoleFollower, RoleSealed}[i%3],
			Head: uint64(i % 2 * 17), RecordTail: 1<<40 + uint64(i), CursorEventTail: uint64(i % 5), ConfirmWatermark: 1 << 39,
			SealEpoch: uint64(i % 4), Suspect: []string{"", "broker-2"}[i%2], ChainMismatch: i%7 == 0, Incarnation: "a1b2c3d4"}
	}
	return []Heartbeat{
		full,
		{Node: "b", Streams: map[string]CopyTails{"s\u00e9\"\\<>&\u2028": {Role: RoleOwner, RecordTail: ^uint64(0)}}},
		{Node: "b", Shard: 127, Time: at.In(time.FixedZone("x", 3600))},
		{},
	}
}

// Heartbeat values are a documented format (docs/etcd-schema.md) that
// older controllers, etcdctl and operators' tools read: EncodeHeartbeat
// writes the standard library's JSON byte for byte, and DecodeHeartbeat
// reads it back as the standard library does.
func TestHeartbeatCodecMatchesStandardLibrary(t *testing.T) {
	for _, hb := range heartbeatSamples(80) {
		want, err := stdjson.Marshal(hb)
		if err != nil {
			t.Fatal(err)
		}
		if got := EncodeHeartbeat(hb); got != string(want) {
			t.Errorf("encodes as\n%s\nthe standard library as\n%s", got, want)
		}
		sameAsStandard(t, want)
		// And what it writes it reads back: every field kept.
		back, err := DecodeHeartbeat([]byte(EncodeHeartbeat(hb)))
		if err != nil {
			t.Fatal(err)
		}
		if !back.Time.Equal(hb.Time) || back.Node != hb.Node || back.Shard != hb.Shard || back.Omitted != hb.Omitted ||
			len(back.Streams) != len(hb.Streams) || !maps.Equal(back.Streams, hb.Streams) {
			t.Errorf("read back as %+v, wrote %+v", back, hb)
		}
	}
}

// FuzzHeartbeatCodec: whatever bytes a heartbeat key holds (a value an
// older or newer broker wrote, a corrupt one), DecodeHeartbeat refuses
// exactly what the standard library refuses and reads the rest as it does.
func FuzzHeartbeatCodec(f *testing.F) {
	// Small seeds: the fuzzer minimises what it finds, slowly for a
	// shard of many copies, and one copy already has every field.
	for _, hb := range heartbeatSamples(3) {
		f.Add([]byte(Encode(hb)))
	}
	f.Add([]byte(`{"node":"b","streams":{"s":{"EPOCH":3,"Role":"owner","record_tail":1e2}}}`))
	f.Add([]byte(`{"node":"b","node":"c","streams":null,"time":"2026-12-04T14:30:00Z","omitted":-1}`))
	f.Add([]byte(`{"streams":{"s":{"epoch":-1,"chain_mismatch":"yes"}},"shard":1.5}`))
	f.Add([]byte("{\"node\":\"\xff\",\"streams\":{\"\\ud800\":{}}}"))
	f.Add([]byte(`[{"node":"b"}]`))
	f.Fuzz(sameAsStandard)
}

func sameAsStandard(t *testing.T, raw []byte) {
	t.Helper()
	var want Heartbeat
	stdErr := stdjson.Unmarshal(raw, &want)
	got, err := DecodeHeartbeat(raw)
	if (err == nil) != (stdErr == nil) {
		t.Fatalf("from %q: DecodeHeartbeat error %v, standard library error %v", raw, err, stdErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("from %q: DecodeHeartbeat %+v, standard library %+v", raw, got, want)
	}
}
