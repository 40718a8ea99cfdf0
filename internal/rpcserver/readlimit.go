package rpcserver

import (
	"compress/gzip"
	"fmt"
	"io"

	"connectrpc.com/connect"
)

// ToolRequestMaxBytes is the read limit of the health and reflection
// services Mux registers: their requests are a service name, a symbol or a
// file name.
const ToolRequestMaxBytes = 64 << 10

// ReadLimit is the handler option that reads request messages of at most
// maxBytes, sent as they are or inflated: connect.WithReadMaxBytes, and
// gzip that stops inflating just past maxBytes. connect-go stops taking a
// message at its read limit but then inflates the rest of it to report its
// size, and a body of zeros inflates a thousandfold: a body within the
// limit would cost a service a thousand times the limit in inflating.
func ReadLimit(maxBytes int) connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithReadMaxBytes(maxBytes),
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &cappedGzip{max: int64(maxBytes)} },
			func() connect.Compressor { return gzip.NewWriter(io.Discard) }),
	)
}

// cappedGzip is connect-go's gzip decompressor, failing once it has
// inflated more than max+1 bytes (connect-go reads max+1 to tell a message
// above the limit).
type cappedGzip struct {
	gzip.Reader
	max, n int64
}

func (g *cappedGzip) Reset(r io.Reader) error {
	g.n = 0
	return g.Reader.Reset(r)
}

func (g *cappedGzip) Read(p []byte) (int, error) {
	if g.n > g.max {
		return 0, fmt.Errorf("gzip body inflates past %d bytes", g.max+1)
	}
	n, err := g.Reader.Read(p)
	g.n += int64(n)
	return n, err
}
