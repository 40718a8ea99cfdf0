package rpcserver_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/strandhq/strand/internal/rpcserver"
)

// serveLimits serves handler on loopback with limits until the test ends.
func serveLimits(t *testing.T, handler http.Handler, limits rpcserver.Limits) *rpcserver.Server {
	t.Helper()
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := rpcserver.ServeLimits(ln, handler, limits)
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// waitClosed reads c until the server closes it, failing if that has not
// happened by within. What the server sent before closing is returned.
func waitClosed(t *testing.T, c net.Conn, within time.Duration) []byte {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %v (read %q)", within, got)
	}
	return got
}

// A client that sends its headers a byte at a time, however steadily, is
// disconnected once ReadHeaderTimeout has passed since its request began:
// slowloris holds no connection or goroutine for longer.
func TestSlowHeadersAreDisconnected(t *testing.T) {
	srv := serveLimits(t, http.NotFoundHandler(), rpcserver.Limits{ReadHeaderTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		// The trickle: a header that never ends, one byte per tick, until
		// the server closes the connection or the test ends.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		if _, err := io.WriteString(c, "POST /x HTTP/1.1\r\nHost: a\r\nX-Slow: "); err != nil {
			return
		}
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := c.Write([]byte("a")); err != nil {
					return
				}
			}
		}
	}()
	if got := waitClosed(t, c, 5*time.Second); len(got) != 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 408")) {
		t.Errorf("the server answered %q to a request whose headers never ended", got)
	}
}

// A header block above MaxHeaderBytes is refused before any handler runs.
func TestHeadersAboveTheLimitAreRefused(t *testing.T) {
	reached := make(chan struct{}, 1)
	srv := serveLimits(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached <- struct{}{} }),
		rpcserver.Limits{MaxHeaderBytes: 4 << 10})
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// net/http allows 4 KiB of slack over MaxHeaderBytes: 64 KiB is past
	// both.
	req := "GET /x HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n"
	go func() { _, _ = io.WriteString(c, req) }()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("status %d, want 431", resp.StatusCode)
	}
	select {
	case <-reached:
		t.Error("the handler ran for a request whose headers are above the limit")
	default:
	}
}

// h2conn is the client side of a raw h2c connection (prior knowledge),
// frames read by a goroutine of its own.
type h2conn struct {
	c      net.Conn
	fr     *http2.Framer
	frames chan frame
}

// frame is what the tests look at of a frame the server sent (a Framer
// reuses its frames' memory).
type frame struct {
	typ      http2.FrameType
	stream   uint32
	code     http2.ErrCode
	ack      bool
	settings map[http2.SettingID]uint32
}

func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	h := &h2conn{c: c, fr: http2.NewFramer(c, c), frames: make(chan frame, 64)}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(h.frames)
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				return
			}
			out := frame{typ: f.Header().Type, stream: f.Header().StreamID, ack: f.Header().Flags.Has(http2.FlagSettingsAck)}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				out.settings = map[http2.SettingID]uint32{}
				_ = f.ForeachSetting(func(s http2.Setting) error { out.settings[s.ID] = s.Val; return nil })
			case *http2.RSTStreamFrame:
				out.code = f.ErrCode
			case *http2.GoAwayFrame:
				out.code = f.ErrCode
			}
			h.frames <- out
		}
	}()
	return h
}

// next returns the next frame the server sent that match accepts, failing
// if the connection closes or none comes within 10 s. SETTINGS frames are
// acknowledged as they pass.
func (h *h2conn) next(t *testing.T, what string, match func(frame) bool) frame {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-h.frames:
			if !ok {
				t.Fatalf("the connection closed before %s", what)
			}
			if f.typ == http2.FrameSettings && !f.ack {
				if err := h.fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			}
			if match(f) {
				return f
			}
		case <-timeout:
			t.Fatalf("no %s within 10 s", what)
		}
	}
}

// get opens stream id with a GET of path.
func (h *h2conn) get(t *testing.T, id uint32, path string) {
	t.Helper()
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: ":authority", Value: "strand"}} {
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: buf.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
}

// An HTTP/2 connection with no stream open is closed after IdleTimeout,
// and the server advertises its stream limit in its settings.
func TestIdleHTTP2ConnectionIsClosed(t *testing.T) {
	srv := serveLimits(t, http.NotFoundHandler(), rpcserver.Limits{IdleTimeout: 300 * time.Millisecond, MaxConcurrentStreams: 7})
	h := dialH2(t, srv.Addr())
	s := h.next(t, "the server's settings", func(f frame) bool { return f.typ == http2.FrameSettings && !f.ack })
	if got := s.settings[http2.SettingMaxConcurrentStreams]; got != 7 {
		t.Errorf("the server advertises %d concurrent streams, want 7", got)
	}
	h.next(t, "a GOAWAY for the idle connection", func(f frame) bool { return f.typ == http2.FrameGoAway })
	for range h.frames { //nolint:revive // drain until the server closes
	}
}

// A client opening more streams on one connection than
// MaxConcurrentStreams has the stream past the limit reset; the streams
// within it go on, and a stream opened once one of them ended is served.
func TestStreamsPastTheLimitAreRefused(t *testing.T) {
	release := make(chan struct{})
	started := make(chan string, 8)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- r.URL.Path
		if r.URL.Path == "/hold" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := serveLimits(t, handler, rpcserver.Limits{MaxConcurrentStreams: 2})
	h := dialH2(t, srv.Addr())
	h.next(t, "the acknowledgement of our settings", func(f frame) bool { return f.typ == http2.FrameSettings && f.ack })
	h.get(t, 1, "/hold")
	h.get(t, 3, "/hold")
	for range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the streams within the limit did not reach the handler")
		}
	}
	h.get(t, 5, "/over")
	rst := h.next(t, "a reset of the third stream", func(f frame) bool { return f.typ == http2.FrameRSTStream || f.typ == http2.FrameHeaders })
	if rst.typ != http2.FrameRSTStream || rst.stream != 5 {
		t.Fatalf("got %v on stream %d, want the third stream (5) reset", rst.typ, rst.stream)
	}
	if rst.code != http2.ErrCodeRefusedStream && rst.code != http2.ErrCodeProtocol {
		t.Errorf("stream 5 reset with %v, want REFUSED_STREAM or PROTOCOL_ERROR", rst.code)
	}
	close(release)
	answered := map[uint32]bool{}
	for len(answered) < 2 {
		f := h.next(t, "the held streams' answers", func(f frame) bool { return f.typ == http2.FrameHeaders || f.typ == http2.FrameRSTStream })
		if f.typ != http2.FrameHeaders {
			t.Fatalf("stream %d reset (%v), want it answered", f.stream, f.code)
		}
		answered[f.stream] = true
	}
	if !answered[1] || !answered[3] {
		t.Fatalf("answered streams %v, want 1 and 3", answered)
	}
	h.get(t, 7, "/after")
	if f := h.next(t, "an answer on stream 7", func(f frame) bool { return f.typ == http2.FrameHeaders || f.typ == http2.FrameRSTStream }); f.typ != http2.FrameHeaders || f.stream != 7 {
		t.Fatalf("got %v on stream %d, want stream 7 answered", f.typ, f.stream)
	}
}

// A request message above its procedure's read limit is refused with
// ResourceExhausted before the handler decodes it (ReadLimit; here the
// health service's ToolRequestMaxBytes).
func TestRequestAboveTheReadLimitIsResourceExhausted(t *testing.T) {
	mux, _ := rpcserver.Mux("strand.v1.StreamService")
	srv := serveLimits(t, mux, rpcserver.Limits{})
	for _, n := range []int{16, rpcserver.ToolRequestMaxBytes + 1} {
		body := fmt.Sprintf(`{"service":%q}`, strings.Repeat("s", n))
		resp, err := http.Post(rpcserver.BaseURL(srv.Addr())+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		wantCode := `"code":"not_found"` // a service not registered, read whole
		if n > rpcserver.ToolRequestMaxBytes {
			wantCode = `"code":"resource_exhausted"`
		}
		if !strings.Contains(string(got), wantCode) {
			t.Errorf("a %d-byte service name: status %d, %s; want %s", n, resp.StatusCode, got, wantCode)
		}
	}
}

// The defaults apply to zero fields and leave set ones.
func TestLimitsDefaults(t *testing.T) {
	l := rpcserver.Limits{MaxConcurrentStreams: 3}.WithDefaults()
	if l.MaxConcurrentStreams != 3 || l.ReadHeaderTimeout != rpcserver.DefaultReadHeaderTimeout ||
		l.MaxHeaderBytes != rpcserver.DefaultMaxHeaderBytes || l.IdleTimeout != rpcserver.DefaultIdleTimeout ||
		l.MaxConnections != rpcserver.DefaultMaxConnections {
		t.Errorf("WithDefaults = %+v", l)
	}
}

// A connection whose stream is open (a Subscribe or a Follow that has
// nothing to send) is not idle: while an idle connection to the same
// server is closed by IdleTimeout, the one carrying the stream stays, and
// its stream is answered when the handler gets to it. No ReadTimeout or
// WriteTimeout cuts it either.
func TestOpenStreamOutlivesTheIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		started <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	const idle = 200 * time.Millisecond
	srv := serveLimits(t, handler, rpcserver.Limits{IdleTimeout: idle, ReadHeaderTimeout: idle})
	busy := dialH2(t, srv.Addr())
	busy.next(t, "the acknowledgement of our settings", func(f frame) bool { return f.typ == http2.FrameSettings && f.ack })
	busy.get(t, 1, "/stream")
	busy.next(t, "the stream's response headers", func(f frame) bool { return f.typ == http2.FrameHeaders && f.stream == 1 })
	<-started
	// The clock: an idle connection opened after the stream began is
	// closed only once IdleTimeout has passed on it, so the stream's
	// connection has been open at least that long too, twice over.
	for range 2 {
		quiet := dialH2(t, srv.Addr())
		quiet.next(t, "a GOAWAY for the idle connection", func(f frame) bool { return f.typ == http2.FrameGoAway })
	}
	for drained := false; !drained; {
		select {
		case f, ok := <-busy.frames:
			if !ok || f.typ == http2.FrameGoAway || f.typ == http2.FrameRSTStream {
				t.Fatalf("the connection with an open stream was ended (%v, open %v)", f.typ, ok)
			}
		default:
			drained = true
		}
	}
	close(release)
	busy.next(t, "the end of the stream", func(f frame) bool {
		if f.typ == http2.FrameGoAway || f.typ == http2.FrameRSTStream {
			t.Fatalf("the stream was ended with %v %v", f.typ, f.code)
		}
		return f.typ == http2.FrameData && f.stream == 1
	})
}
