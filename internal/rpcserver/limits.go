package rpcserver

import (
	"flag"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits bounds what one client connection may cost a server before a
// handler runs: the slow or idle clients (slowloris) and the many-stream
// connections that would otherwise hold goroutines, buffers and sockets
// for as long as they like (docs/limits.md, "HTTP server"). A field left
// zero takes its Default*. Request messages are bounded per procedure by
// ReadLimit, not here: a Subscribe or Follow call's body is a stream that
// lives as long as the call, so no bound on a whole body fits it.
//
// Nothing here bounds how long a call may run: there is no WriteTimeout
// and no ReadTimeout, which would end every Subscribe and Follow stream at
// that age (and a Follow call carries every stream of a pair of brokers,
// docs/protocol.md, "One Follow call per pair of brokers").
type Limits struct {
	// MaxHeaderBytes bounds a request's header block: the HTTP/1.1 request
	// line and headers, and the HTTP/2 header list a client may send
	// (SETTINGS_MAX_HEADER_LIST_SIZE).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds the time from a connection's request start
	// to its headers read whole: a client that trickles its headers is
	// disconnected then, whatever its pace.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a connection with no request in flight (HTTP/1.1
	// keep-alive, or HTTP/2 with no open stream) after this long. A
	// connection carrying a Subscribe or Follow stream is not idle.
	IdleTimeout time.Duration
	// MaxConcurrentStreams bounds the HTTP/2 streams (calls) one
	// connection may have open at once; a client past it has its new
	// streams refused (REFUSED_STREAM) and Go's transport opens another
	// connection or waits.
	MaxConcurrentStreams int
	// WriteByteTimeout closes an HTTP/2 connection on which written data
	// makes no progress for this long: a client that stops reading its
	// responses (or a Subscribe stream) while keeping its socket open.
	// It runs only while there is something to write, so a quiet live
	// stream is not affected.
	WriteByteTimeout time.Duration
	// PingTimeout: an HTTP/2 connection with nothing received for this
	// long is sent a ping, and closed if no answer comes within the same
	// time again. A peer that vanished without a FIN (a killed machine)
	// under an open stream is noticed this way.
	PingTimeout time.Duration
	// MaxConnections bounds the connections served at once; a connection
	// past it waits in the listen backlog until one closes.
	MaxConnections int
}

// Defaults of Limits (the binaries' flag defaults).
const (
	DefaultMaxHeaderBytes       = 64 << 10
	DefaultReadHeaderTimeout    = 10 * time.Second
	DefaultIdleTimeout          = 2 * time.Minute
	DefaultMaxConcurrentStreams = 1000
	DefaultWriteByteTimeout     = 30 * time.Second
	DefaultPingTimeout          = 30 * time.Second
	DefaultMaxConnections       = 4096
)

// WithDefaults returns l with every zero field at its default.
func (l Limits) WithDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	defDur(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	defDur(&l.IdleTimeout, DefaultIdleTimeout)
	def(&l.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	defDur(&l.WriteByteTimeout, DefaultWriteByteTimeout)
	defDur(&l.PingTimeout, DefaultPingTimeout)
	def(&l.MaxConnections, DefaultMaxConnections)
	return l
}

// RegisterFlags adds the --http-* flags that set l to fs, with the
// defaults as their defaults (docs/limits.md, "HTTP server").
func (l *Limits) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.MaxHeaderBytes, "http-max-header-bytes", DefaultMaxHeaderBytes, "largest request header block accepted (HTTP/1.1 headers, HTTP/2 header list)")
	fs.DurationVar(&l.ReadHeaderTimeout, "http-read-header-timeout", DefaultReadHeaderTimeout, "how long a client may take to send a request's headers")
	fs.DurationVar(&l.IdleTimeout, "http-idle-timeout", DefaultIdleTimeout, "close a connection with no call in flight after this long")
	fs.IntVar(&l.MaxConcurrentStreams, "http-max-concurrent-streams", DefaultMaxConcurrentStreams, "HTTP/2 calls one connection may have open at once")
	fs.DurationVar(&l.WriteByteTimeout, "http-write-byte-timeout", DefaultWriteByteTimeout, "close an HTTP/2 connection whose pending writes make no progress this long")
	fs.DurationVar(&l.PingTimeout, "http-ping-timeout", DefaultPingTimeout, "ping an HTTP/2 connection silent this long, close it if the ping is not answered as long again")
	fs.IntVar(&l.MaxConnections, "http-max-connections", DefaultMaxConnections, "connections served at once; more wait to be accepted")
}

// apply sets l (with its defaults) on srv, the server Serve builds.
func (l Limits) apply(srv *http.Server) {
	l = l.WithDefaults()
	srv.MaxHeaderBytes = l.MaxHeaderBytes
	srv.ReadHeaderTimeout = l.ReadHeaderTimeout
	srv.IdleTimeout = l.IdleTimeout
	// No ReadTimeout or WriteTimeout: they would end long-lived streams
	// (see Limits).
	srv.ReadTimeout, srv.WriteTimeout = 0, 0
	if srv.HTTP2 == nil {
		srv.HTTP2 = &http.HTTP2Config{}
	}
	srv.HTTP2.MaxConcurrentStreams = l.MaxConcurrentStreams
	srv.HTTP2.WriteByteTimeout = l.WriteByteTimeout
	srv.HTTP2.SendPingTimeout = l.PingTimeout
	srv.HTTP2.PingTimeout = l.PingTimeout
}

// listener bounds ln to l's connections at once.
func (l Limits) listener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, l.WithDefaults().MaxConnections)
}
