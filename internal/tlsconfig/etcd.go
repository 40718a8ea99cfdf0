package tlsconfig

import (
	"crypto/tls"
	"fmt"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// EtcdClient is the TLS configuration of an etcd client with files (the
// --etcd-cacert, --etcd-cert and --etcd-key flags, named as etcdctl names
// them), built by etcd's own client TLS options (transport.TLSInfo): the
// certificate and key are read again at each handshake, so a renewed one is
// used on the next connection; the CA is read once.
func EtcdClient(files Files) (*tls.Config, error) {
	if files.CAFile == "" {
		return nil, ErrNoCA
	}
	info := transport.TLSInfo{CertFile: files.CertFile, KeyFile: files.KeyFile, TrustedCAFile: files.CAFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: etcd client: %w", err)
	}
	cfg.MinVersion = tls.VersionTLS13
	return cfg, nil
}
