package etcdtest

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Forwarder is a loopback TCP proxy in front of the server that a test can
// cut: Cut closes every connection it carries and closes new ones at once
// until Resume. A client through it loses its watches for real, as it
// would in a network partition or an etcd restart, while the server goes
// on taking writes from other clients.
//
// HoldReplies delays what the server sends until ReleaseReplies, while
// what the client sends still arrives: a server whose answers are late
// (a saturated machine) rather than one that is gone.
type Forwarder struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	open  bool
	conns []net.Conn
	// held is closed by ReleaseReplies (or Cut); nil while replies flow.
	held chan struct{}
}

// Forward starts a forwarder to the server's first endpoint; it stops at
// cleanup.
func (s *Server) Forward(t testing.TB) *Forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: forwarder: %v", err)
	}
	target := strings.TrimPrefix(s.Endpoints[0], "http://")
	f := &Forwarder{ln: ln, target: target, open: true}
	t.Cleanup(func() {
		_ = ln.Close()
		f.Cut()
	})
	go f.serve()
	return f
}

// Addr is the forwarder's address, host:port.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Client returns a client that reaches the server through the forwarder,
// closed at cleanup.
func (f *Forwarder) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"http://" + f.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (f *Forwarder) serve() {
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
		go f.pipe(up, c, false)
		go f.pipe(c, up, true)
	}
}

// pipe copies src to dst until either ends; with replies set (the server's
// side), each read waits while replies are held: delayed, never dropped.
func (f *Forwarder) pipe(dst, src net.Conn, replies bool) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if replies {
				f.waitReplies()
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitReplies returns once replies are not held.
func (f *Forwarder) waitReplies() {
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	if held != nil {
		<-held
	}
}

// HoldReplies holds what the server sends on every connection until
// ReleaseReplies.
func (f *Forwarder) HoldReplies() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == nil {
		f.held = make(chan struct{})
	}
}

// ReleaseReplies sends what was held, and lets replies flow again.
func (f *Forwarder) ReleaseReplies() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held != nil {
		close(f.held)
		f.held = nil
	}
}

// Cut closes every connection and refuses new ones until Resume. Held
// replies are released, to connections now closed.
func (f *Forwarder) Cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held != nil {
		close(f.held)
		f.held = nil
	}
	f.open = false
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
}

// Resume lets connections through again.
func (f *Forwarder) Resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = true
}
