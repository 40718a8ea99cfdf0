package cluster

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// Brokers and controllers must agree on a stream's shard: the hash is
// pinned (FNV-1a 32 of the name, modulo 128, computed apart from this
// code), and spreads names over every shard.
func TestHeartbeatShard(t *testing.T) {
	for name, want := range map[string]int{"orders": 108, "a": 44, "s1": 73, "orders.eu-1": 110} {
		if got := HeartbeatShard(name); got != want {
			t.Errorf("HeartbeatShard(%q) = %d, want %d", name, got, want)
		}
	}
	seen := map[int]bool{}
	for i := range 1000 {
		seen[HeartbeatShard(fmt.Sprintf("s%d", i))] = true
	}
	if len(seen) != HeartbeatShards {
		t.Fatalf("1000 names fall in %d shards, want all %d", len(seen), HeartbeatShards)
	}
}

func TestHeartbeatKeyRoundTrip(t *testing.T) {
	s := NewSchema("/x")
	for _, shard := range []int{0, 7, HeartbeatShards - 1} {
		key := s.HeartbeatKey("broker-1", shard)
		node, got, err := s.ParseHeartbeatKey(key)
		if err != nil || node != "broker-1" || got != shard {
			t.Errorf("ParseHeartbeatKey(%q) = %q, %d, %v", key, node, got, err)
		}
	}
	// Two digits, as brokers wrote them with 16 shards, are read too, in
	// slots of their own past the shards.
	seen := map[int]string{}
	for _, key := range []string{"/x/heartbeats/broker-1/005", "/x/heartbeats/broker-1/05",
		"/x/heartbeats/broker-1/127", "/x/heartbeats/broker-1/15"} {
		node, slot, err := s.ParseHeartbeatKey(key)
		if err != nil || node != "broker-1" || slot < 0 || slot >= HeartbeatSlots {
			t.Errorf("ParseHeartbeatKey(%q) = %q, %d, %v", key, node, slot, err)
			continue
		}
		if other, ok := seen[slot]; ok {
			t.Errorf("%q and %q share slot %d", key, other, slot)
		}
		seen[slot] = key
	}
	if _, slot, _ := s.ParseHeartbeatKey("/x/heartbeats/broker-1/05"); slot < HeartbeatShards {
		t.Errorf("a two-digit key in slot %d, among the three-digit shards", slot)
	}
	for _, key := range []string{
		"/x/heartbeats/broker-1",       // the unsharded key of old brokers
		"/x/heartbeats/broker-1/",      // no shard
		"/x/heartbeats/broker-1/7",     // one digit
		"/x/heartbeats/broker-1/0007",  // four digits
		"/x/heartbeats/broker-1/128",   // past the last shard
		"/x/heartbeats/broker-1/16",    // past the last shard of 16
		"/x/heartbeats/broker-1/-1",    // a sign
		"/x/heartbeats/broker-1/+12",   // a sign
		"/x/heartbeats/broker-1/0a",    // not a number
		"/x/heartbeats/broker-1/01/02", // deeper
		"/x/heartbeats//01",            // no node
		"/x/brokers/broker-1",          // another directory
		"/y/heartbeats/broker-1/01",    // another prefix
	} {
		if _, _, err := s.ParseHeartbeatKey(key); err == nil {
			t.Errorf("ParseHeartbeatKey(%q) accepted", key)
		}
	}
}

func TestBoundHeartbeat(t *testing.T) {
	hb := Heartbeat{Node: "b1", Shard: 3, Streams: map[string]CopyTails{}}
	for i := range 100 {
		hb.Streams[fmt.Sprintf("s%03d", i)] = CopyTails{Epoch: 3, Role: RoleFollower, RecordTail: 1 << 40, CursorEventTail: 1 << 30}
	}
	whole := Encode(hb)
	if v, left := BoundHeartbeat(hb, len(whole)); v != whole || left != nil {
		t.Fatalf("a value at its bound changed: left out %v", left)
	}
	for _, limit := range []int{len(whole) - 1, len(whole) / 2, 300} {
		v, left := BoundHeartbeat(hb, limit)
		if len(v) > limit {
			t.Errorf("limit %d: value of %d bytes", limit, len(v))
		}
		got, err := Decode[Heartbeat]([]byte(v))
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		if got.Omitted != len(left) || len(got.Streams)+len(left) != len(hb.Streams) || len(left) == 0 {
			t.Errorf("limit %d: kept %d, omitted %d (field %d) of %d", limit, len(got.Streams), len(left), got.Omitted, len(hb.Streams))
		}
		// The copies kept are the first in name order.
		for _, name := range left {
			if _, ok := got.Streams[name]; ok {
				t.Errorf("limit %d: %s both kept and left out", limit, name)
			}
			for kept := range got.Streams {
				if kept > name {
					t.Errorf("limit %d: kept %s after omitted %s", limit, kept, name)
				}
			}
		}
	}
}

func TestOfIncarnation(t *testing.T) {
	const inc = "0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		status, assignment string
		want               bool
	}{
		{IncarnationTag(inc), inc, true},
		{"", inc, true},                 // a copy that recorded none
		{IncarnationTag(inc), "", true}, // a stream placed before incarnations
		{"fedcba98", inc, false},        // a deleted stream's copy
		{"01234567", "0123", false},     // a tag is not a prefix match the other way
		{"0123", "0123", true},          // ids shorter than a tag are whole
	} {
		if got := (CopyTails{Incarnation: c.status}).OfIncarnation(c.assignment); got != c.want {
			t.Errorf("status %q OfIncarnation(%q) = %v, want %v", c.status, c.assignment, got, c.want)
		}
	}
}

// A copy's head and cursor event tail are left out of its heartbeat
// encoding when 0, and a value that carries them (as brokers wrote before)
// or leaves them out decodes to the same status: readers of either
// version read both.
func TestCopyTailsLeavesZeroHeadAndCursorTailOut(t *testing.T) {
	zero := CopyTails{Epoch: 2, Role: RoleFollower, RecordTail: 5, ConfirmWatermark: 5, Incarnation: "7c98055c"}
	enc := Encode(zero)
	if strings.Contains(enc, `"head"`) || strings.Contains(enc, `"cursor_event_tail"`) {
		t.Fatalf("zero head and cursor event tail encoded: %s", enc)
	}
	old := `{"epoch":2,"role":"follower","head":0,"record_tail":5,"cursor_event_tail":0,"confirm_watermark":5,"inc":"7c98055c"}`
	for _, v := range []string{enc, old} {
		got, err := Decode[CopyTails]([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		if got != zero {
			t.Fatalf("%s decoded to %+v, want %+v", v, got, zero)
		}
	}
	set := CopyTails{Epoch: 2, Role: RoleOwner, Head: 3, RecordTail: 9, CursorEventTail: 4, ConfirmWatermark: 8}
	got, err := Decode[CopyTails]([]byte(Encode(set)))
	if err != nil {
		t.Fatal(err)
	}
	if got != set {
		t.Fatalf("round trip of %+v gave %+v", set, got)
	}
}

// SameStatus ignores exactly a copy's progress: every other field of a
// status, one added later included, is a status change.
func TestSameStatusIgnoresOnlyProgress(t *testing.T) {
	progress := map[string]bool{"Head": true, "RecordTail": true, "CursorEventTail": true, "ConfirmWatermark": true}
	base := CopyTails{Epoch: 3, Role: RoleFollower, RecordTail: 5}
	typ := reflect.TypeFor[CopyTails]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		o := base
		v := reflect.ValueOf(&o).Elem().Field(i)
		switch v.Kind() {
		case reflect.Uint64:
			v.SetUint(v.Uint() + 1)
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Bool:
			v.SetBool(!v.Bool())
		default:
			t.Fatalf("field %s of kind %v: extend the test", f.Name, v.Kind())
		}
		if got := base.SameStatus(o); got != progress[f.Name] {
			t.Errorf("%s changed: SameStatus %v, want %v", f.Name, got, progress[f.Name])
		}
	}
	if !base.SameStatus(base) {
		t.Error("a status is not the same as itself")
	}
}
