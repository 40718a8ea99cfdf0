package cluster

import (
	"slices"
	"time"
)

// BrokerInfo is stored at BrokerKey, bound to the broker's lease: the key
// disappearing is how the controller learns the broker is gone.
type BrokerInfo struct {
	Node      string    `json:"node"`
	Address   string    `json:"address"`
	StartTime time.Time `json:"start_time"`
	// Zone is the failure zone the broker runs in (its --zone; "" when
	// unset). Placement spreads a stream's copies over zones
	// (docs/architecture.md, "Placement and zones").
	Zone string `json:"zone,omitempty"`
}

// Role of a copy.
const (
	RoleOwner    = "owner"
	RoleFollower = "follower"
	RoleSealed   = "sealed"
)

// CopyTails is what a broker publishes about one copy in its heartbeat.
//
// Head and CursorEventTail are left out when 0, as they are for most
// copies (nothing retention dropped, no cursor committed): a mass failover
// rewrites every shard holding a changed copy several times, and their
// encodings were a quarter of what those writes carried. A reader takes a
// missing field as 0, as it did for values written with them.
type CopyTails struct {
	Epoch            uint64 `json:"epoch"`
	Role             string `json:"role"`
	Head             uint64 `json:"head,omitempty"`
	RecordTail       uint64 `json:"record_tail"`
	CursorEventTail  uint64 `json:"cursor_event_tail,omitempty"`
	ConfirmWatermark uint64 `json:"confirm_watermark"`
	SealEpoch        uint64 `json:"seal_epoch,omitempty"`
	// Suspect names an owner this copy could not follow (eager failover).
	Suspect string `json:"suspect,omitempty"`
	// ChainMismatch is set when the copy's prefix disagrees with its owner's.
	ChainMismatch bool `json:"chain_mismatch,omitempty"`
	// Incarnation is the tag (IncarnationTag) of the stream incarnation
	// the copy belongs to, empty for a copy that recorded none. A status
	// of another incarnation is about a deleted stream of the same name,
	// whose copy a broker still held or had not yet dropped when it wrote
	// the value: the controller reads it as no status for the stream now
	// assigned (OfIncarnation; docs/etcd-schema.md, "Heartbeat shards").
	Incarnation string `json:"inc,omitempty"`
}

// SameStatus reports whether t and o differ at most in the copy's
// progress: its head, record tail, cursor event tail and confirm
// watermark. What the controller's liveness loop decides on, whether an
// owner is lost, a copy sealed past its assignment, a member missing, is
// read from the rest, and from progress only to rank copies when it
// proposes a move; under publish load progress changes at every heartbeat
// interval, the rest only with a role, an epoch, a seal or a suspicion.
func (t CopyTails) SameStatus(o CopyTails) bool {
	t.Head, t.RecordTail, t.CursorEventTail, t.ConfirmWatermark = o.Head, o.RecordTail, o.CursorEventTail, o.ConfirmWatermark
	return t == o
}

// incarnationTagLen is how much of an incarnation a status carries: 8 of
// the controller's 32 random hex digits. Two lives of one name share a tag
// once in 2^32, and what that costs is one status read as the new
// stream's, as every status was read before tags; the full id would add
// 40 bytes to each copy's status in every heartbeat write.
const incarnationTagLen = 8

// IncarnationTag is the part of an incarnation id a copy's status carries.
func IncarnationTag(incarnation string) string {
	if len(incarnation) > incarnationTagLen {
		return incarnation[:incarnationTagLen]
	}
	return incarnation
}

// OfIncarnation reports whether the status may be of the stream
// incarnation named: it is, or either side names none (a copy that
// recorded none, a stream placed before incarnations).
func (t CopyTails) OfIncarnation(incarnation string) bool {
	return t.Incarnation == "" || incarnation == "" || t.Incarnation == IncarnationTag(incarnation)
}

// InSyncSlack is how many records a live follower at its assignment's
// epoch may be behind its owner's record tail, as both last published, and
// still be in sync (the controller's attention judges by it). Brokers
// publish moving tails by it too: a move of less than half of it waits
// until it adds up or the copy goes quiet (docs/etcd-schema.md, "Heartbeat
// shards"), so the judgement tolerates published tails that trail: under
// steady load a follower that keeps up reads a little behind the watermark
// its owner published later, and without the slack it would flap in and
// out of sync with every publish. It holds even below the owner's confirm
// watermark.
const InSyncSlack = 1000

// Heartbeat is stored at HeartbeatKey, bound to the broker's lease: the
// statuses of the broker's copies whose streams fall in one shard
// (HeartbeatShard). The controller keeps a broker's shards side by side
// (its state.Heartbeat), each as its value names it.
type Heartbeat struct {
	Node string `json:"node"`
	// Shard is the shard the value was written for.
	Shard int `json:"shard"`
	// Time is when the value was written. Values are written on change,
	// not on a clock, so an old Time says nothing about liveness: the
	// broker's lease does.
	Time    time.Time            `json:"time"`
	Streams map[string]CopyTails `json:"streams"`
	// Omitted counts copies left out of the shard's value because it
	// would have passed MaxHeartbeatBytes (BoundHeartbeat); the controller
	// sees no status for them.
	Omitted int `json:"omitted,omitempty"`
}

// Retention bounds a stream's retained log; zero values mean unbounded.
type Retention struct {
	MaxRecords uint64        `json:"max_records,omitempty"`
	MaxBytes   uint64        `json:"max_bytes,omitempty"`
	MaxAge     time.Duration `json:"max_age,omitempty"`
}

// StreamSpec is stored at StreamKey.
type StreamSpec struct {
	Name      string    `json:"name"`
	Copies    int       `json:"copies"`
	Policy    Policy    `json:"policy"`
	Retention Retention `json:"retention"`
	Created   time.Time `json:"created"`
}

// Assignment is stored at AssignmentKey: who holds the stream at which epoch.
type Assignment struct {
	Stream    string   `json:"stream"`
	Epoch     uint64   `json:"epoch"`
	Owner     string   `json:"owner"`
	Followers []string `json:"followers"`
	// Policy is the confirm policy stamped by the controller. An assignment
	// placed before streams had a policy carries the zero Policy, which the
	// one rule for W reads as local_durable (docs/protocol.md, "One rule for W").
	Policy Policy `json:"policy"`
	// Retention travels with the assignment so brokers need not read specs.
	Retention Retention `json:"retention"`
	// Incarnation identifies one life of the stream name: set at create and
	// kept by every later assignment. A broker holding a copy of an earlier
	// stream of the same name (deleted while it was away) drops that copy
	// instead of serving its records as the new stream's.
	Incarnation string `json:"incarnation,omitempty"`
}

// Members returns the owner followed by the followers.
func (a Assignment) Members() []string {
	return append([]string{a.Owner}, a.Followers...)
}

// Copies is E, the number of copies of the assignment.
func (a Assignment) Copies() int { return 1 + len(a.Followers) }

// Includes reports whether node holds a copy under this assignment.
func (a Assignment) Includes(node string) bool {
	return a.Owner == node || slices.Contains(a.Followers, node)
}

// Recovery is stored at RecoveryKey: a pending recovery the recoverer must
// finish (docs/protocol.md, "Stream failover").
type Recovery struct {
	Stream        string   `json:"stream"`
	FromEpoch     uint64   `json:"from_epoch"`
	FenceEpoch    uint64   `json:"fence_epoch"`
	TransitionID  string   `json:"transition_id"`
	OldOwner      string   `json:"old_owner"`
	OldFollowers  []string `json:"old_followers"`
	ProposedOwner string   `json:"proposed_owner"`
	AddedMembers  []string `json:"added_members,omitempty"`
	// RemovedMembers are old copies the recovered assignment leaves out
	// unless they answer their seal: members missing past --replace-after,
	// or at once when the stream cannot confirm without them
	// (docs/protocol.md, "Replacing a missing copy"). A removed copy that
	// answers after all stays, and the copy bound leaves its replacement
	// out. Every other old copy is kept, answered or not, and rejoins when
	// its broker returns.
	RemovedMembers []string `json:"removed_members,omitempty"`
	// DrainedMembers are old copies the recovered assignment leaves out
	// even when they answer their seal: a draining broker's copies, moved
	// elsewhere (docs/operating.md, "Draining a broker"). They are sealed
	// like every old copy, so leaving one out after the seal keeps every
	// confirmed record on the promoted copy.
	DrainedMembers []string `json:"drained_members,omitempty"`
	// Copies is how many copies the recovered assignment keeps at most
	// when it adds members: added members replace removed copies, and a
	// removed copy that answers its seal after all needs no replacement.
	// Zero lets every added member join: a change that grows the stream,
	// and recoveries recorded before this field.
	Copies int `json:"copies,omitempty"`
	// Policy is the policy the recovered assignment will carry.
	Policy  Policy    `json:"policy"`
	Reason  string    `json:"reason"`
	Created time.Time `json:"created"`
}

// OldMembers returns every copy of the old assignment.
func (r Recovery) OldMembers() []string {
	return append([]string{r.OldOwner}, r.OldFollowers...)
}

// HistoryStart records where an owner's history starts at an epoch: its
// record and cursor event tails when it took over (docs/protocol.md, "The confirmed prefix").
type HistoryStart struct {
	Epoch           uint64 `json:"epoch"`
	RecordTail      uint64 `json:"record_tail"`
	CursorEventTail uint64 `json:"cursor_event_tail"`
	Node            string `json:"node"`
}

// HistoryStarts is stored at HistoryKey, ordered by epoch.
type HistoryStarts []HistoryStart

// Latest returns the start with the highest epoch.
func (h HistoryStarts) Latest() (HistoryStart, bool) {
	if len(h) == 0 {
		return HistoryStart{}, false
	}
	return h[len(h)-1], true
}

// MaxRefusalError bounds the error text a SealRefusal keeps, in bytes.
const MaxRefusalError = 256

// SealRefusals is stored at RefusalsKey, next to a pending recovery: the old
// copies whose brokers are registered yet did not seal in the recovery's
// last seal round, when that round left the recovery waiting. The recovery
// waits rather than guess (docs/protocol.md, "Safety argument"), and this is how the
// controller's attention says why (docs/limits.md: it waits under controller
// attention until a copy answers or an operator accepts the loss).
//
// The recoverer writes it guarded by the mod revisions of the recovery and
// the assignment it sealed for and by its leader key, and rewrites or
// deletes it after each round that waits. Every write that records, commits
// or clears the recovery deletes it, so it never outlives the recovery it
// describes. It holds at most one refusal per old copy.
type SealRefusals struct {
	Stream       string `json:"stream"`
	FenceEpoch   uint64 `json:"fence_epoch"`
	TransitionID string `json:"transition_id"`
	// R is the seal threshold; Sealed are the copies that answered.
	R        int           `json:"r"`
	Sealed   []string      `json:"sealed,omitempty"`
	Refusals []SealRefusal `json:"refusals"`
}

// Drain marks a broker draining (docs/operating.md, "Draining a broker"):
// placement takes no new copy on it, the controller hands the streams it
// owns over to in-sync followers and replaces its copies elsewhere. It is
// not bound to the broker's lease: a drained broker that restarts stays
// drained until an operator undrains it.
type Drain struct {
	Node  string    `json:"node"`
	Who   string    `json:"who,omitempty"`
	Why   string    `json:"why,omitempty"`
	Since time.Time `json:"since"`
}

// SealRefusal is one registered copy that did not seal.
type SealRefusal struct {
	Node string `json:"node"`
	// Code is the Connect code the broker answered with, empty when it gave
	// none (no answer in time, an answer for another fence epoch).
	Code string `json:"code,omitempty"`
	// Error is what the seal failed with, at most MaxRefusalError bytes.
	Error string `json:"error"`
	// Since is when a round of this recovery first saw the copy refuse.
	Since time.Time `json:"since"`
}
