package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// DefaultPrefix is where Strand keeps its coordination state in etcd.
const DefaultPrefix = "/strand"

// Schema names every etcd key Strand uses. It is the only place keys are
// built or parsed (docs/etcd-schema.md).
//
//	<prefix>/brokers/<node>        BrokerInfo, bound to the broker's lease
//	<prefix>/heartbeats/<node>     Heartbeat, bound to the broker's lease
//	<prefix>/streams/<stream>      StreamSpec
//	<prefix>/assignments/<stream>  Assignment
//	<prefix>/recoveries/<stream>   Recovery (a pending recovery)
//	<prefix>/history/<stream>      HistoryStarts
//	<prefix>/refusals/<stream>     SealRefusals (next to a pending recovery)
//	<prefix>/election/controller   controller election prefix
//	<prefix>/election/recoverer    recoverer election prefix
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

// Keys of one broker or one stream.
func (s Schema) BrokerKey(node string) string       { return s.BrokersDir() + node }
func (s Schema) HeartbeatKey(node string) string    { return s.HeartbeatsDir() + node }
func (s Schema) StreamKey(stream string) string     { return s.StreamsDir() + stream }
func (s Schema) AssignmentKey(stream string) string { return s.AssignmentsDir() + stream }
func (s Schema) RecoveryKey(stream string) string   { return s.RecoveriesDir() + stream }
func (s Schema) HistoryKey(stream string) string    { return s.HistoryDir() + stream }
func (s Schema) RefusalsKey(stream string) string   { return s.RefusalsDir() + stream }

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

// Encode marshals a value stored in etcd.
func Encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value type here is plain data; a failure is a programming error.
		panic(fmt.Sprintf("cluster: encode %T: %v", v, err))
	}
	return string(b)
}

// ErrCorrupt is returned when a stored value cannot be decoded.
var ErrCorrupt = errors.New("cluster: corrupt value")

// Decode unmarshals a value stored in etcd.
func Decode[T any](raw []byte) (T, error) {
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("%w: %T: %v", ErrCorrupt, v, err)
	}
	return v, nil
}
