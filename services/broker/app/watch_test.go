package app

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

// A broken etcd watch is not a lost lease. The broker's watches break when
// its connection to etcd does and, once it is back, resume from a revision
// that was compacted meanwhile (or etcd is briefly without a leader). The
// broker lists and watches again in the same session: closing the session
// revoked its lease, and every stream it owned failed over although the
// broker never stopped.
func TestBrokenWatchKeepsTheLease(t *testing.T) {
	h := newHarness(t)
	target, err := url.Parse(h.etcd.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	fwd := startForwarder(t, target.Host)
	h.configure = func(c *Config) {
		c.Etcd = []string{"http://" + fwd.addr()}
		// Room for the etcd client's reconnect backoff: the lease must
		// outlive the cut, so only the watch can break.
		c.LeaseTTL = 15 * time.Second
	}
	h.start("b1")
	ctx := context.Background()
	lease := func() int64 {
		t.Helper()
		resp, err := h.cli.Get(ctx, h.schema.BrokerKey("b1"))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("broker key: %v, %d keys", err, len(resp.Kvs))
		}
		return resp.Kvs[0].Lease
	}
	before := lease()

	fwd.cut()
	// Written while the broker is cut off, then compacted away: its
	// watches cannot resume where they stopped.
	h.assign(cluster.Assignment{Stream: "during", Epoch: 1, Owner: "b1"})
	resp, err := h.cli.Put(ctx, "/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	fwd.resume()

	// The broker learns what it missed by listing again...
	h.publish("b1", "during", "after the cut")
	// ...and kept its lease throughout.
	if after := lease(); after != before {
		t.Fatalf("the broker registered again with lease %x (was %x): a broken watch gave up its lease, failing over its streams", after, before)
	}
}

// forwarder is a loopback TCP proxy that a test can cut: cut closes every
// connection it carries and closes new ones at once until resume.
type forwarder struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	open  bool
	conns []net.Conn
}

func startForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target, open: true}
	t.Cleanup(func() {
		_ = ln.Close()
		f.cut()
	})
	go f.serve()
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

func (f *forwarder) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if !f.open {
			f.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			f.mu.Unlock()
			_ = c.Close()
			continue
		}
		f.conns = append(f.conns, c, up)
		f.mu.Unlock()
		go pipe(c, up)
		go pipe(up, c)
	}
}

func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

func (f *forwarder) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = false
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
}

func (f *forwarder) resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = true
}
