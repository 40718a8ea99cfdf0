package tlsconfig

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The files of a certs dir (--certs-dir), as strandctl cert writes them.
const (
	CAFile      = "ca.crt"
	CAKeyFile   = "ca.key"
	NodeCert    = "node.crt"
	NodeKey     = "node.key"
	clientStem  = "client."
	certSuffix  = ".crt"
	keySuffix   = ".key"
	DefaultDir  = "certs"
	DefaultUser = "admin"
)

// ClientCert and ClientKey are the file names of principal's client
// certificate and key in a certs dir.
func ClientCert(principal string) string { return clientStem + principal + certSuffix }

// ClientKey is the key file of ClientCert.
func ClientKey(principal string) string { return clientStem + principal + keySuffix }

// Files names a CA bundle and, optionally, a certificate and its key.
// CertFile and KeyFile go together: both or neither (a client that
// authenticates with a token only needs the CA).
type Files struct {
	CAFile   string
	CertFile string
	KeyFile  string
}

// NodeFiles are the files of a node in a certs dir: ca.crt, node.crt and
// node.key.
func NodeFiles(dir string) Files {
	return Files{CAFile: filepath.Join(dir, CAFile), CertFile: filepath.Join(dir, NodeCert), KeyFile: filepath.Join(dir, NodeKey)}
}

// ClientFiles are the files of principal in a certs dir: ca.crt and
// client.PRINCIPAL.crt/.key.
func ClientFiles(dir, principal string) Files {
	return Files{CAFile: filepath.Join(dir, CAFile), CertFile: filepath.Join(dir, ClientCert(principal)), KeyFile: filepath.Join(dir, ClientKey(principal))}
}

// ErrNoCA is returned for Files without a CA file: a TLS config that trusts
// the system's roots would let any public CA vouch for a peer.
var ErrNoCA = errors.New("tlsconfig: no CA file")

// Reloader holds the certificate and CA pool of Files and reads them again
// when a file's modification time or size changes, checked at each
// handshake: a renewed certificate (rewritten in place or renamed over the
// old one) is served on the next connection, without a restart. A file
// that cannot be read or parsed, or a certificate and key that do not
// match (a handshake between the writes of the two), keeps what was loaded
// last; the change is tried again at the next handshake.
type Reloader struct {
	files Files

	mu    sync.Mutex
	stamp [3]stamp
	cert  *tls.Certificate // nil without CertFile
	pool  *x509.CertPool
	// lastErr is the last failed reload, for Err.
	lastErr error
}

// stamp is what tells that a file changed.
type stamp struct {
	mod  time.Time
	size int64
}

// New loads files and returns their Reloader; an error says which file is
// missing or wrong.
func New(files Files) (*Reloader, error) {
	if files.CAFile == "" {
		return nil, ErrNoCA
	}
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, fmt.Errorf("tlsconfig: a certificate (%q) and a key (%q) go together", files.CertFile, files.KeyFile)
	}
	r := &Reloader{files: files}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Files are the files r reads.
func (r *Reloader) Files() Files { return r.files }

func (r *Reloader) paths() [3]string {
	return [3]string{r.files.CAFile, r.files.CertFile, r.files.KeyFile}
}

func stampOf(path string) (stamp, error) {
	if path == "" {
		return stamp{}, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{mod: st.ModTime(), size: st.Size()}, nil
}

// reload reads the files again if any changed since the last load. The
// caller holds no lock.
func (r *Reloader) reload() error {
	var now [3]stamp
	for i, p := range r.paths() {
		s, err := stampOf(p)
		if err != nil {
			return r.failed(fmt.Errorf("tlsconfig: %w", err))
		}
		now[i] = s
	}
	r.mu.Lock()
	same := r.pool != nil && now == r.stamp
	r.mu.Unlock()
	if same {
		return nil
	}
	caPEM, err := os.ReadFile(r.files.CAFile)
	if err != nil {
		return r.failed(fmt.Errorf("tlsconfig: CA: %w", err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return r.failed(fmt.Errorf("tlsconfig: CA %s holds no PEM certificate", r.files.CAFile))
	}
	var cert *tls.Certificate
	if r.files.CertFile != "" {
		c, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
		if err != nil {
			return r.failed(fmt.Errorf("tlsconfig: certificate %s with key %s: %w", r.files.CertFile, r.files.KeyFile, err))
		}
		cert = &c
	}
	r.mu.Lock()
	r.stamp, r.cert, r.pool, r.lastErr = now, cert, pool, nil
	r.mu.Unlock()
	return nil
}

func (r *Reloader) failed(err error) error {
	r.mu.Lock()
	r.lastErr = err
	r.mu.Unlock()
	return err
}

// current reloads what changed and returns what is loaded: after a failed
// reload, what was loaded before.
func (r *Reloader) current() (*tls.Certificate, *x509.CertPool) {
	_ = r.reload()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert, r.pool
}

// Err is the error of the last reload that failed since the last that
// worked (nil when the files in use are the files on disk).
func (r *Reloader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// nextProtos are the protocols a server offers and a client asks for by
// ALPN: HTTP/2 first, which Connect's bidirectional streams (Follow) need.
var nextProtos = []string{"h2", "http/1.1"}

// ServerConfig is the TLS 1.3 configuration of a server presenting r's
// certificate. Client certificates are verified against r's CA pool when
// presented (requireClientCert: required): a client may connect without
// one and authenticate with a bearer token, while ReplicationService
// refuses every call without a node's (rpcserver.RequireNode). Both the
// certificate and the pool are read at each handshake (GetConfigForClient).
func (r *Reloader) ServerConfig(requireClientCert bool) *tls.Config {
	auth := tls.VerifyClientCertIfGiven
	if requireClientCert {
		auth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := r.current()
			if cert == nil {
				return nil, errors.New("tlsconfig: a server needs a certificate")
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{*cert},
				ClientCAs:    pool,
				ClientAuth:   auth,
			}, nil
		},
	}
}

// ClientConfig is the TLS 1.3 configuration of a client, as r's files are
// now: r's certificate (when r has one) and the CA pool to verify the
// server's against, by crypto/tls's own verification (chain to the pool,
// the server's name or IP, server auth usage). ServerName is left empty
// for http.Transport to fill in from the address. crypto/tls reads
// RootCAs once per config, so a client that must see a reloaded pool asks
// for a config per connection (DialTLSContext).
func (r *Reloader) ClientConfig() *tls.Config {
	cert, pool := r.current()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: nextProtos, RootCAs: pool}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// DialTLSContext dials with d and makes the TLS handshake with the
// ClientConfig of the moment, the server name taken from addr: every new
// connection presents the certificate on disk now and verifies against the
// CA pool on disk now. It is http.Transport's DialTLSContext.
func (r *Reloader) DialTLSContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := r.ClientConfig()
		cfg.ServerName = host
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := tls.Client(&readBufferedConn{Conn: raw, r: bufio.NewReaderSize(raw, readBufferSize)}, cfg)
		if err := c.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return c, nil
	}
}

// readBufferSize is the read buffer beneath a dialled TLS connection.
const readBufferSize = 32 << 10

// readBufferedConn reads through a buffer. TLS reads a record's header,
// then the rest of it, each with a read of the connection; a broker
// following an owner receives batches of many 16 KiB records, so
// unbuffered that was a read syscall or two per record. Buffered, one read
// takes in every record that has arrived (as rpcserver's listener does on
// the serving side).
type readBufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readBufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
