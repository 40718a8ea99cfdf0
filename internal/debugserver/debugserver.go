// Package debugserver serves a service's runtime profiles (net/http/pprof)
// on an address of its own, apart from the API listener: the API may be
// TLS with client certificates, and a profile is an operator's tool, so it
// is plain HTTP meant for loopback (docs/operating.md, "Flags").
package debugserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// Listen binds addr and serves the pprof handlers on it in the background
// until the process exits. An empty addr serves nothing. A bind that fails
// is returned, so a mistyped --debug-addr stops the service at start rather
// than leaving it without the profiles its operator asked for.
func Listen(addr string) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--debug-addr: %w", err)
	}
	srv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			// Nothing to do but say so: the service runs on without profiles.
			fmt.Fprintln(os.Stderr, "debug server:", err)
		}
	}()
	return nil
}

// Handler serves net/http/pprof's pages under /debug/pprof/.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
