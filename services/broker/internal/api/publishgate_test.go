package api

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
)

// A publish is weighed by its Content-Length when that is what it decodes
// from, by its envelope's length for an uncompressed gRPC message sent
// without one, otherwise by the read limit; never above the bound.
func TestPublishGateWeight(t *testing.T) {
	g := newPublishGate(1000, 600)
	envelope := func(flags byte, n uint32) []byte {
		b := []byte{flags, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], n)
		return append(b, bytes.Repeat([]byte{'x'}, int(n))...)
	}
	for _, c := range []struct {
		name    string
		length  int64
		headers map[string]string
		body    []byte
		want    int64
	}{
		{"sent as it is", 100, nil, nil, 100},
		{"empty", 0, nil, nil, 1},
		{"length unknown", -1, nil, nil, 600},
		{"compressed (Connect)", 100, map[string]string{"Content-Encoding": "gzip"}, nil, 600},
		{"compressed (gRPC)", 100, map[string]string{"Grpc-Encoding": "gzip"}, nil, 600},
		{"above the read limit", 800, nil, nil, 600},
		{"gRPC without a length", -1, map[string]string{"Content-Type": "application/grpc"}, envelope(0, 95), 100},
		{"gRPC-Web without a length", -1, map[string]string{"Content-Type": "application/grpc-web+proto"}, envelope(0, 45), 50},
		{"gRPC, a compressed message", -1, map[string]string{"Content-Type": "application/grpc"}, envelope(1, 95), 600},
		{"gRPC, a short body", -1, map[string]string{"Content-Type": "application/grpc"}, []byte{0, 0}, 600},
		{"gRPC, an envelope above the read limit", -1, map[string]string{"Content-Type": "application/grpc"}, envelope(0, 900), 600},
		{"gRPC-Web text", -1, map[string]string{"Content-Type": "application/grpc-web-text"}, []byte("AAAAAAU="), 600},
	} {
		r := httptest.NewRequest(http.MethodPost, "/strand.v1.StreamService/Publish", bytes.NewReader(c.body))
		r.ContentLength = c.length
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		if got := g.weight(r); got != c.want {
			t.Errorf("%s: weight %d, want %d", c.name, got, c.want)
		}
		// What was read to weigh the request is still its body.
		if got, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(got, c.body) {
			t.Errorf("%s: body after weighing %q (%v), want %q", c.name, got, err, c.body)
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

// An admitted publish whose body stops arriving gives its share of the
// bound back after the body timeout, not when TCP gives up on its client.
func TestPublishGateBodyTimeout(t *testing.T) {
	g := newPublishGate(1000, 600)
	g.bodyWait = 200 * time.Millisecond
	readErr := make(chan error, 1)
	srv := httptest.NewServer(g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
	})))
	defer srv.Close()
	body, stall := io.Pipe()
	defer stall.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 500
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	go func() { _, _ = stall.Write(make([]byte, 100)) }() // and then nothing more
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the stalled body was read to its end")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the handler still reads the stalled body")
	}
	clustertest.Eventually(t, 10*time.Second, "the stalled publish's share given back", func() bool {
		return g.held.Load() == 0
	})
}
