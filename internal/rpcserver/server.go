// Package rpcserver serves Connect handlers over HTTP/1.1 and h2c, or over
// TLS (WithTLS), with the gRPC health and reflection services registered,
// and shuts down in order.
package rpcserver

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
)

// Mux builds a ServeMux with grpchealth and grpcreflect registered for the
// named services, so grpcurl works without proto files, each reading
// requests of at most ToolRequestMaxBytes (ReadLimit). The returned checker
// starts with every service serving.
func Mux(services ...string) (*http.ServeMux, *grpchealth.StaticChecker) {
	mux := http.NewServeMux()
	limit := ReadLimit(ToolRequestMaxBytes)
	checker := grpchealth.NewStaticChecker(services...)
	mux.Handle(grpchealth.NewHandler(checker, limit))
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, limit))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, limit))
	return mux, checker
}

// Server is an HTTP server speaking HTTP/1.1 and unencrypted HTTP/2.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// Listen binds addr ("127.0.0.1:0" picks a free port).
func Listen(addr string) (net.Listener, error) {
	return net.Listen("tcp", addr)
}

// Serve starts serving handler on ln in the background with the default
// Limits: HTTP/1.1 and h2c, or TLS with WithTLS.
func Serve(ln net.Listener, handler http.Handler, opts ...ServeOption) *Server {
	return ServeLimits(ln, handler, Limits{}, opts...)
}

// ServeLimits is Serve with limits (zero fields take their defaults).
func ServeLimits(ln net.Listener, handler http.Handler, limits Limits, opts ...ServeOption) *Server {
	var o serveOptions
	for _, opt := range opts {
		opt(&o)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	if o.tls != nil {
		p.SetHTTP2(true)
		handler = withPeer(handler)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	s := &Server{
		srv: &http.Server{
			Handler:   handler,
			Protocols: p,
			TLSConfig: o.tls,
		},
		ln:   bufferedListener{limits.listener(ln)},
		done: make(chan error, 1),
	}
	limits.apply(s.srv)
	go func() {
		var err error
		if o.tls != nil {
			// The TLS layer reads through the buffered connection, so a
			// read takes in every record that has arrived.
			err = s.srv.ServeTLS(s.ln, "", "")
		} else {
			err = s.srv.Serve(s.ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s
}

// bufferedListener gives every accepted connection a read buffer. The
// HTTP/2 server reads each frame straight from the connection, its 9-byte
// header and its payload with a read call each; an owner's follow streams
// are mostly small frames (acknowledgements, window updates), so that was
// most of a broker's syscalls. Buffered, one read takes in every frame that
// has arrived.
type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 32<<10)}, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Done delivers the serve loop's error (nil after a clean shutdown).
func (s *Server) Done() <-chan error { return s.done }

// Shutdown stops accepting connections and waits for in-flight requests
// until ctx ends, then closes what is left (long-lived streams).
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	return err
}

// Close stops the server at once.
func (s *Server) Close() error { return s.srv.Close() }

// HTTPClient returns a client that speaks h2c with prior knowledge to
// http:// addresses, which bidirectional Connect streams need.
func HTTPClient() *http.Client {
	tr := newTransport()
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// newTransport is the transport of every client: HTTPClient's, a
// Dialer's, HTTPClientTLS's; the caller sets the protocols.
func newTransport() *http.Transport {
	return &http.Transport{
		// Read frames of up to 1 MiB, as the server side does by
		// default: with the transport's 16 KiB, an owner ships a
		// follower's batch (about 130 KiB in the cluster bench) as
		// eight frames, each costing write syscalls on the owner and a
		// header read, a payload read and a window update on the
		// follower. One frame per batch halves a broker's syscalls.
		HTTP2:               &http.HTTP2Config{MaxReadFrameSize: 1 << 20},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         dialer().DialContext,
	}
}

// BaseURL turns a host:port into the URL Connect clients take.
func BaseURL(addr string) string {
	if len(addr) >= 7 && (addr[:7] == "http://" || (len(addr) >= 8 && addr[:8] == "https://")) {
		return addr
	}
	return "http://" + addr
}
