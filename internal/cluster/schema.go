package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
)

// DefaultPrefix is where Strand keeps its coordination state in etcd.
const DefaultPrefix = "/strand"

// Schema names every etcd key Strand uses. It is the only place keys are
// built or parsed (docs/etcd-schema.md).
//
//	<prefix>/brokers/<node>        BrokerInfo, bound to the broker's lease
//	<prefix>/heartbeats/<node>/<shard>  Heartbeat: one shard of the broker's copy statuses, bound to its lease
//	<prefix>/streams/<stream>      StreamSpec
//	<prefix>/assignments/<stream>  Assignment
//	<prefix>/recoveries/<stream>   Recovery (a pending recovery)
//	<prefix>/history/<stream>      HistoryStarts
//	<prefix>/refusals/<stream>     SealRefusals (next to a pending recovery)
//	<prefix>/draining/<node>       Drain (an operator drains the broker)
//	<prefix>/election/controller   controller election prefix
//	<prefix>/election/recoverer    recoverer election prefix
//	<prefix>/auth/tokens/<id>      auth.TokenRecord: a bearer token's SHA-256 and principal
//	<prefix>/auth/grants/<principal>/<permission>/<pattern>  auth.GrantRecord
type Schema struct {
	prefix string
}

// NewSchema returns the schema rooted at prefix ("/strand" when empty).
func NewSchema(prefix string) Schema {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Schema{prefix: strings.TrimRight(prefix, "/")}
}

// Prefix is the schema's root.
func (s Schema) Prefix() string { return s.prefix }

// Directories of the schema. Each ends in "/" so a prefix read or watch of one
// never matches another whose name starts the same way.
func (s Schema) BrokersDir() string     { return s.prefix + "/brokers/" }
func (s Schema) HeartbeatsDir() string  { return s.prefix + "/heartbeats/" }
func (s Schema) StreamsDir() string     { return s.prefix + "/streams/" }
func (s Schema) AssignmentsDir() string { return s.prefix + "/assignments/" }
func (s Schema) RecoveriesDir() string  { return s.prefix + "/recoveries/" }
func (s Schema) HistoryDir() string     { return s.prefix + "/history/" }
func (s Schema) RefusalsDir() string    { return s.prefix + "/refusals/" }
func (s Schema) DrainingDir() string    { return s.prefix + "/draining/" }

// Keys of one broker or one stream.
func (s Schema) BrokerKey(node string) string       { return s.BrokersDir() + node }
func (s Schema) StreamKey(stream string) string     { return s.StreamsDir() + stream }
func (s Schema) AssignmentKey(stream string) string { return s.AssignmentsDir() + stream }
func (s Schema) RecoveryKey(stream string) string   { return s.RecoveriesDir() + stream }
func (s Schema) HistoryKey(stream string) string    { return s.HistoryDir() + stream }
func (s Schema) RefusalsKey(stream string) string   { return s.RefusalsDir() + stream }
func (s Schema) DrainingKey(node string) string     { return s.DrainingDir() + node }

// HeartbeatShards is how many keys a broker's copy statuses are spread
// over. A broker rewrites only the shards whose statuses changed, so one
// change costs a value of about 1/HeartbeatShards of its copies, and a
// broker's shards fit in one transaction (HeartbeatShards is at most
// etcd's default --max-txn-ops of 128; a pass past 1 MiB of values is
// split, and its transactions sent together). Under publish load every
// shard holding a busy copy is rewritten about once per tail step, so what
// etcd keeps as history grows with the size of a shard: 128 shards keep a
// shard at about 8 copies (under 1 KB) for 1,000 streams on three brokers,
// where 16 shards made it 7 KB and the history of a 5-minute retention
// about 150 MB (docs/etcd.md, "Sizing"). 1,024 shards were measured too:
// at 10,000 streams they halved the bytes a mass failover wrote to etcd
// (10 against 20 MB in the 8 s after a kill) but multiplied the puts by
// 3.6 (8,700 against 2,400), and the recording of the lost owner's
// recoveries took longer, not shorter. Changing the count moves streams
// between shards: readers take every shard key under a broker's
// directory, and look a stream up in every shard while a broker's shards
// hold streams that hash elsewhere, so a broker restarted with another
// count is read correctly, before and after its old lease (and its old
// shards) is gone.
const HeartbeatShards = 128

// HeartbeatShard is the shard of a broker's heartbeat that carries the
// status of its copy of stream: a stable hash of the name (FNV-1a), the
// same on every broker and controller.
func HeartbeatShard(stream string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(stream))
	return int(h.Sum32() % HeartbeatShards)
}

// HeartbeatDir is the directory of node's heartbeat shards.
func (s Schema) HeartbeatDir(node string) string { return s.HeartbeatsDir() + node + "/" }

// HeartbeatKey is the key of one shard of node's heartbeat.
func (s Schema) HeartbeatKey(node string, shard int) string {
	return s.HeartbeatDir(node) + fmt.Sprintf("%03d", shard)
}

// Heartbeat keys are read in two widths: three digits, the 128 shards
// brokers write, and two, the 16 shards brokers wrote before, so a
// controller reads a broker not yet upgraded. A broker restarted on the
// new version may have shard 5 under "05" (its old lease, until that
// ends) and "005" (its new one) at once, so each width is a slot range of
// its own: the delete of one key never takes away what the other holds
// (ParseHeartbeatKey).
const (
	heartbeatSlots16 = HeartbeatShards
	// HeartbeatSlots counts the keys of one broker's heartbeat a reader
	// tells apart.
	HeartbeatSlots = heartbeatSlots16 + 16
)

// ParseHeartbeatKey returns the node and slot of a heartbeat shard key:
// the shard, for a three-digit key; for a two-digit key, a slot past
// HeartbeatShards, one per shard of that width (HeartbeatSlots). A reader
// looks a stream up in the slot of its shard first, and takes a stream
// named by another slot all the same (a broker with another shard count).
func (s Schema) ParseHeartbeatKey(key string) (node string, slot int, err error) {
	rest, ok := strings.CutPrefix(key, s.HeartbeatsDir())
	if !ok {
		return "", 0, fmt.Errorf("%w: %q under %q", ErrNotInDir, key, s.HeartbeatsDir())
	}
	node, num, ok := strings.Cut(rest, "/")
	if !ok || node == "" || (len(num) != 3 && len(num) != 2) {
		return "", 0, fmt.Errorf("%w: %q is not <node>/<shard> under %q", ErrNotInDir, key, s.HeartbeatsDir())
	}
	shard, err := strconv.Atoi(num)
	base, shards := 0, HeartbeatShards
	if len(num) == 2 {
		base, shards = heartbeatSlots16, 16
	}
	if err != nil || shard < 0 || shard >= shards || strings.ContainsAny(num, "+-") {
		return "", 0, fmt.Errorf("%w: %q: shard %q outside 0..%d for %d digits", ErrNotInDir, key, num, shards-1, len(num))
	}
	return node, base + shard, nil
}

// Keys of client authentication and permissions (internal/auth,
// docs/operating.md, "Security"). Nothing else under the prefix starts with
// auth/, so brokers and controllers watch AuthDir alone for their
// credential cache.
func (s Schema) AuthDir() string   { return s.prefix + "/auth/" }
func (s Schema) TokensDir() string { return s.AuthDir() + "tokens/" }
func (s Schema) GrantsDir() string { return s.AuthDir() + "grants/" }

// TokenKey is the key of the token whose id is id.
func (s Schema) TokenKey(id string) string { return s.TokensDir() + id }

// PrincipalGrantsDir is the directory of one principal's grants.
func (s Schema) PrincipalGrantsDir(principal string) string {
	return s.GrantsDir() + principal + "/"
}

// GrantKey is the key of one grant: one key per (principal, permission,
// pattern), so a grant made twice is one key and a revoke deletes exactly
// it. None of the three may contain "/" (auth validates them).
func (s Schema) GrantKey(principal, permission, pattern string) string {
	return s.PrincipalGrantsDir(principal) + permission + "/" + pattern
}

// Election prefixes for concurrency.Election.
func (s Schema) ControllerElection() string { return s.prefix + "/election/controller" }
func (s Schema) RecovererElection() string  { return s.prefix + "/election/recoverer" }

// ErrNotInDir is returned when a key does not belong to the directory asked for.
var ErrNotInDir = errors.New("cluster: key not in directory")

// NameIn returns the last path element of key below dir.
func NameIn(dir, key string) (string, error) {
	name, ok := strings.CutPrefix(key, dir)
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: %q under %q", ErrNotInDir, key, dir)
	}
	return name, nil
}

var (
	streamName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)
	nodeName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	zoneName   = nodeName
)

// ErrInvalidName is returned for stream or node names outside the allowed form.
var ErrInvalidName = errors.New("cluster: invalid name")

// ValidateStreamName checks a stream name against [a-z0-9][a-z0-9._-]{0,127}.
func ValidateStreamName(name string) error {
	if !streamName.MatchString(name) {
		return fmt.Errorf("%w: stream name %q must match [a-z0-9][a-z0-9._-]{0,127}", ErrInvalidName, name)
	}
	return nil
}

// ValidateNodeName checks a broker node id.
func ValidateNodeName(name string) error {
	if !nodeName.MatchString(name) {
		return fmt.Errorf("%w: node id %q must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}", ErrInvalidName, name)
	}
	return nil
}

// ValidateZone checks a broker's zone: empty (none), or a name of the
// node id's form.
func ValidateZone(zone string) error {
	if zone != "" && !zoneName.MatchString(zone) {
		return fmt.Errorf("%w: zone %q must be empty or match [A-Za-z0-9][A-Za-z0-9._-]{0,63}", ErrInvalidName, zone)
	}
	return nil
}

// Encode marshals a value stored in etcd.
func Encode(v any) string { return encodeWith(json.Marshal, v) }

// ErrCorrupt is returned when a stored value cannot be decoded.
var ErrCorrupt = errors.New("cluster: corrupt value")

// Decode unmarshals a value stored in etcd.
func Decode[T any](raw []byte) (T, error) { return decodeWith[T](json.Unmarshal, raw) }

// encodeWith and decodeWith are Encode and Decode with the JSON codec
// given: the standard library's, or the heartbeat's (EncodeHeartbeat).
func encodeWith(marshal func(any) ([]byte, error), v any) string {
	b, err := marshal(v)
	if err != nil {
		// Every value type here is plain data; a failure is a programming error.
		panic(fmt.Sprintf("cluster: encode %T: %v", v, err))
	}
	return string(b)
}

func decodeWith[T any](unmarshal func([]byte, any) error, raw []byte) (T, error) {
	var v T
	if err := unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("%w: %T: %v", ErrCorrupt, v, err)
	}
	return v, nil
}
