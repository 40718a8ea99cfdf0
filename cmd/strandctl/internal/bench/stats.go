package bench

import (
	"slices"
	"time"
)

// Payload returns a size-byte payload that starts with prefix (the record's
// unique id) and is padded with filler; a prefix longer than size is kept
// whole, since the id must survive.
func Payload(prefix string, size int) []byte {
	b := make([]byte, max(size, len(prefix)))
	copy(b, prefix)
	// The filler is 'a'+i%26 at position i: copied from one precomputed
	// run of it, which keeps the bench's own CPU (it shares the machine
	// with the cluster it measures) off a per-byte loop.
	for i := len(prefix); i < len(b); {
		i += copy(b[i:], payloadFiller[i%26:])
	}
	return b
}

// payloadFiller is 'a'..'z' repeated: payloadFiller[k] = 'a'+k%26.
var payloadFiller = func() []byte {
	b := make([]byte, 26*1024)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}()

// Latency summarises confirm latencies in milliseconds.
type Latency struct {
	P50 float64
	P99 float64
	Max float64
}

// Summarize computes nearest-rank percentiles of lat (it sorts a copy).
func Summarize(lat []time.Duration) Latency {
	if len(lat) == 0 {
		return Latency{}
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return Latency{P50: ms(Percentile(s, 50)), P99: ms(Percentile(s, 99)), Max: ms(s[len(s)-1])}
}

// Percentile returns the nearest-rank p-th percentile of sorted values:
// the smallest value with at least p% of the values at or below it.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted)) + 0.999999999)
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
