package state

import "github.com/strandhq/strand/internal/cluster"

// Builder assembles a Snapshot by hand, for tests of the pure decisions
// taken on snapshots.
type Builder struct{ s *Snapshot }

// Build starts an empty snapshot.
func Build() *Builder {
	return &Builder{s: empty()}
}

// Live registers brokers.
func (b *Builder) Live(nodes ...string) *Builder {
	for _, n := range nodes {
		b.s.Brokers[n] = cluster.BrokerInfo{Node: n, Address: n + ":1"}
		b.Heartbeat(n) // a registered broker heartbeats at once
	}
	return b
}

// Zone sets the zone of registered brokers.
func (b *Builder) Zone(zone string, nodes ...string) *Builder {
	for _, n := range nodes {
		info := b.s.Brokers[n]
		info.Zone = zone
		b.s.Brokers[n] = info
	}
	return b
}

// Tails adds stream's tails to node's heartbeat, in the shard stream
// hashes to.
func (b *Builder) Tails(node, stream string, t cluster.CopyTails) *Builder {
	hb := b.heartbeat(node)
	shard := cluster.HeartbeatShard(stream)
	sh := hb.slots[shard]
	if sh.streams == nil {
		sh.streams = map[string]cluster.CopyTails{}
	}
	sh.streams[stream] = t
	hb.setShard(shard, sh)
	return b
}

// Heartbeat adds an empty heartbeat for node.
func (b *Builder) Heartbeat(node string) *Builder {
	b.heartbeat(node)
	return b
}

// heartbeat returns node's heartbeat, added when missing with its shards
// written after every other key the builder writes (revisions below 100).
// The builder's snapshot is not handed out yet, so it is changed in place.
func (b *Builder) heartbeat(node string) *Heartbeat {
	hb := b.s.Heartbeats[node]
	if hb == nil {
		hb = new(Heartbeat)
		b.setRevs(hb, 100)
		b.s.Heartbeats[node] = hb
	}
	return hb
}

func (b *Builder) setRevs(hb *Heartbeat, rev int64) {
	for i := range cluster.HeartbeatShards {
		sh := hb.slots[i]
		sh.rev = rev
		hb.setShard(i, sh)
	}
}

// StaleHeartbeat marks node's heartbeat shards as written before the
// assignments: a broker that died but whose lease has not ended yet.
func (b *Builder) StaleHeartbeat(node string) *Builder {
	b.setRevs(b.heartbeat(node), 1)
	return b
}

// Stream adds a spec and its assignment.
func (b *Builder) Stream(a cluster.Assignment) *Builder {
	b.s.Streams[a.Stream] = Versioned[cluster.StreamSpec]{Value: cluster.StreamSpec{Name: a.Stream, Copies: a.Copies(), Policy: a.Policy}, ModRev: 1}
	b.s.Assignments[a.Stream] = Versioned[cluster.Assignment]{Value: a, ModRev: 2}
	return b
}

// Recovery adds a pending recovery.
func (b *Builder) Recovery(r cluster.Recovery) *Builder {
	b.s.Recoveries[r.Stream] = Versioned[cluster.Recovery]{Value: r, ModRev: 3}
	return b
}

// History sets a stream's history starts.
func (b *Builder) History(stream string, h ...cluster.HistoryStart) *Builder {
	b.s.History[stream] = Versioned[cluster.HistoryStarts]{Value: h, ModRev: 4}
	return b
}

// Drain marks nodes draining.
func (b *Builder) Drain(nodes ...string) *Builder {
	for _, n := range nodes {
		b.s.Draining[n] = Versioned[cluster.Drain]{Value: cluster.Drain{Node: n}, ModRev: 5}
	}
	return b
}

// Refusals adds the seal refusals the recoverer recorded for a stream.
func (b *Builder) Refusals(r cluster.SealRefusals) *Builder {
	b.s.Refusals[r.Stream] = Versioned[cluster.SealRefusals]{Value: r, ModRev: 5}
	return b
}

// Snapshot returns the built snapshot.
func (b *Builder) Snapshot() *Snapshot { return b.s }
