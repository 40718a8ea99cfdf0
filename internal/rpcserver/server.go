// Package rpcserver serves Connect handlers over HTTP/1.1 and h2c, with the
// gRPC health and reflection services registered, and shuts down in order.
package rpcserver

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
)

// Mux builds a ServeMux with grpchealth and grpcreflect registered for the
// named services, so grpcurl works without proto files. The returned checker
// starts with every service serving.
func Mux(services ...string) (*http.ServeMux, *grpchealth.StaticChecker) {
	mux := http.NewServeMux()
	checker := grpchealth.NewStaticChecker(services...)
	mux.Handle(grpchealth.NewHandler(checker))
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
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

// Serve starts serving handler on ln in the background.
func Serve(ln net.Listener, handler http.Handler) *Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	s := &Server{
		srv: &http.Server{
			Handler:           handler,
			Protocols:         p,
			ReadHeaderTimeout: 10 * time.Second,
		},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s
}

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
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{
		Transport: &http.Transport{
			Protocols:           p,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			DialContext: (&net.Dialer{
				Timeout:   2 * time.Second,
				KeepAlive: 15 * time.Second,
			}).DialContext,
		},
	}
}

// BaseURL turns a host:port into the URL Connect clients take.
func BaseURL(addr string) string {
	if len(addr) >= 7 && (addr[:7] == "http://" || (len(addr) >= 8 && addr[:8] == "https://")) {
		return addr
	}
	return "http://" + addr
}
