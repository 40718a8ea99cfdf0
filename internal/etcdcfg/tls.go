package etcdcfg

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/strandhq/strand/internal/tlsconfig"
)

// NodeTLS is what every service (broker, controller, recoverer) starts
// with: its node certificate from s (nil when Insecure) and its etcd
// client's TLS for endpoints (ClientTLS). An error of the etcd client's is
// prefixed "etcd: ", so a service's message says which failed.
func NodeTLS(s tlsconfig.Settings, endpoints []string) (*tlsconfig.Reloader, *tls.Config, error) {
	certs, err := s.Node()
	if err != nil {
		return nil, nil, err
	}
	etcdTLS, err := ClientTLS(s, endpoints)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd: %w", err)
	}
	return certs, etcdTLS, nil
}

// ClientTLS is the TLS of a service's etcd client for endpoints: s's
// --etcd-cacert, --etcd-cert and --etcd-key when given, else its certs
// dir's ca.crt, node.crt and node.key when an endpoint is https://, else
// nil (plain etcd). It is built by etcd's own client TLS options
// (transport.TLSInfo): the certificate and key are read again at each
// handshake, so a renewed one is used on the next connection; the CA is
// read once, at the start.
func ClientTLS(s tlsconfig.Settings, endpoints []string) (*tls.Config, error) {
	files := tlsconfig.Files{CAFile: s.EtcdCA, CertFile: s.EtcdCert, KeyFile: s.EtcdKey}
	if files.CAFile == "" {
		secure := false
		for _, e := range endpoints {
			secure = secure || strings.HasPrefix(e, "https://")
		}
		if !secure {
			return nil, nil
		}
		if s.CertsDir == "" {
			return nil, errors.New("https:// etcd endpoints need --etcd-cacert (or --certs-dir)")
		}
		files = tlsconfig.NodeFiles(s.CertsDir)
		if s.EtcdCert != "" {
			files.CertFile, files.KeyFile = s.EtcdCert, s.EtcdKey
		}
	}
	return FilesTLS(files)
}

// FilesTLS is the TLS of an etcd client with files, by transport.TLSInfo.
func FilesTLS(files tlsconfig.Files) (*tls.Config, error) {
	if files.CAFile == "" {
		return nil, tlsconfig.ErrNoCA
	}
	info := transport.TLSInfo{CertFile: files.CertFile, KeyFile: files.KeyFile, TrustedCAFile: files.CAFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd client TLS: %w", err)
	}
	cfg.MinVersion = tls.VersionTLS13
	return cfg, nil
}
