package tlsconfig

import (
	"errors"
	"flag"
	"fmt"
)

// Settings are the TLS flags every service takes (docs/operating.md,
// "Security"): a certs dir with the CA and the node's certificate, or
// --insecure, and the etcd client's TLS.
type Settings struct {
	// Insecure serves and dials without TLS; the service logs that it is
	// insecure. It is never the default: a service refuses to start with
	// neither it nor CertsDir.
	Insecure bool
	// CertsDir holds ca.crt, node.crt and node.key (strandctl cert).
	CertsDir string
	// RequireClientCert refuses connections without a client certificate
	// the CA signed; without it a client may connect with none (and
	// authenticate with a bearer token), while ReplicationService always
	// requires a node's.
	RequireClientCert bool
	// EtcdCA, EtcdCert and EtcdKey are the etcd client's TLS files (named
	// as etcdctl's --cacert, --cert, --key). Empty: the certs dir's
	// ca.crt, node.crt and node.key when an etcd endpoint is https://.
	EtcdCA, EtcdCert, EtcdKey string
}

// Flags registers the settings' flags on fs.
func (s *Settings) Flags(fs *flag.FlagSet) {
	fs.BoolVar(&s.Insecure, "insecure", false, "serve and dial without TLS (anyone who reaches a port may call anything); the default is TLS with --certs-dir")
	fs.StringVar(&s.CertsDir, "certs-dir", "", "directory with ca.crt, node.crt and node.key (strandctl cert); required unless --insecure")
	fs.BoolVar(&s.RequireClientCert, "tls-require-client-cert", false, "refuse connections without a client certificate signed by the CA (default: clients may present none and use a token)")
	fs.StringVar(&s.EtcdCA, "etcd-cacert", "", "CA bundle of the etcd servers (default: the certs dir's ca.crt for https:// endpoints)")
	fs.StringVar(&s.EtcdCert, "etcd-cert", "", "client certificate for etcd (default: the certs dir's node.crt for https:// endpoints)")
	fs.StringVar(&s.EtcdKey, "etcd-key", "", "client key for etcd (default: the certs dir's node.key for https:// endpoints)")
}

// ErrNoTLS is returned by Validate for settings with neither a certs dir
// nor Insecure.
var ErrNoTLS = errors.New("no TLS: pass --certs-dir DIR (ca.crt, node.crt, node.key; see strandctl cert), or --insecure to run without TLS")

// Validate refuses settings with neither a certs dir nor Insecure, and
// with both.
func (s Settings) Validate() error {
	switch {
	case s.Insecure && s.CertsDir != "":
		return errors.New("--insecure and --certs-dir: choose one")
	case !s.Insecure && s.CertsDir == "":
		return ErrNoTLS
	case (s.EtcdCert == "") != (s.EtcdKey == ""):
		return errors.New("--etcd-cert and --etcd-key go together")
	}
	return nil
}

// Node loads the node's certificate and CA from the certs dir: nil when
// Insecure.
func (s Settings) Node() (*Reloader, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.Insecure {
		return nil, nil
	}
	r, err := New(NodeFiles(s.CertsDir))
	if err != nil {
		return nil, fmt.Errorf("--certs-dir %s: %w", s.CertsDir, err)
	}
	return r, nil
}
