package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A publish is weighed by its Content-Length only when that is what it
// decodes from; otherwise by the read limit, and never above the bound.
func TestPublishGateWeight(t *testing.T) {
	g := newPublishGate(1000, 600)
	for _, c := range []struct {
		name    string
		length  int64
		headers map[string]string
		want    int64
	}{
		{"sent as it is", 100, nil, 100},
		{"empty", 0, nil, 1},
		{"length unknown", -1, nil, 600},
		{"compressed (Connect)", 100, map[string]string{"Content-Encoding": "gzip"}, 600},
		{"compressed (gRPC)", 100, map[string]string{"Grpc-Encoding": "gzip"}, 600},
		{"above the read limit", 800, nil, 600},
	} {
		r := httptest.NewRequest(http.MethodPost, "/strand.v1.StreamService/Publish", strings.NewReader(""))
		r.ContentLength = c.length
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		if got := g.weight(r); got != c.want {
			t.Errorf("%s: weight %d, want %d", c.name, got, c.want)
		}
	}
	// A bound below the read limit: the largest publish takes all of it.
	small := newPublishGate(500, 600)
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(""))
	r.ContentLength = -1
	if got := small.weight(r); got != 500 {
		t.Errorf("bound below the read limit: weight %d, want 500", got)
	}
}
