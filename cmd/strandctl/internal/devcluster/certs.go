package devcluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/strandhq/strand/internal/tlsconfig"
)

// CertsDir is the dir, in the data dir, of a secure dev cluster's CA
// (ca.crt, ca.key) and admin client certificate; each child's node
// certificate is in CertsDir/NAME (docs/operating.md, "strandctl dev").
const CertsDir = "certs"

// etcdCertName is the name of the embedded etcd's server certificate's
// dir under CertsDir.
const etcdCertName = "etcd"

// TLSInfo is where a secure dev cluster's client files are, as
// cluster.json records them: what strandctl and client.DevClusterConfig
// dial the cluster with.
type TLSInfo struct {
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// makeCerts makes what a secure dev cluster needs under DIR/certs, keeping
// what an earlier start made: a CA, a node certificate on loopback for each
// of names (and the embedded etcd), and the admin client certificate.
func makeCerts(dir string, names []string) (*tlsconfig.Reloader, TLSInfo, error) {
	root := filepath.Join(dir, CertsDir)
	if !exists(filepath.Join(root, tlsconfig.CAFile)) {
		if _, err := tlsconfig.CreateCA(root, 0, true); err != nil {
			return nil, TLSInfo{}, fmt.Errorf("devcluster: CA: %w", err)
		}
	}
	for _, n := range append([]string{etcdCertName}, names...) {
		if exists(filepath.Join(root, n, tlsconfig.NodeCert)) {
			continue
		}
		if _, err := tlsconfig.CreateNode(root, filepath.Join(root, n), n, []string{"127.0.0.1", "localhost", "::1"}, 0, true); err != nil {
			return nil, TLSInfo{}, fmt.Errorf("devcluster: certificate of %s: %w", n, err)
		}
	}
	files := tlsconfig.ClientFiles(root, tlsconfig.DefaultUser)
	if !exists(files.CertFile) {
		if _, err := tlsconfig.CreateClient(root, "", tlsconfig.DefaultUser, 0, true); err != nil {
			return nil, TLSInfo{}, fmt.Errorf("devcluster: admin certificate: %w", err)
		}
	}
	r, err := tlsconfig.New(files)
	if err != nil {
		return nil, TLSInfo{}, fmt.Errorf("devcluster: %w", err)
	}
	return r, TLSInfo{CA: files.CAFile, Cert: files.CertFile, Key: files.KeyFile}, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// nodeCertsDir is the certs dir of the child name.
func (c *Cluster) nodeCertsDir(name string) string {
	return filepath.Join(c.opts.Dir, CertsDir, name)
}

// ClientTLS is the admin client's TLS configuration of a secure cluster,
// nil for a plain one.
func (c *Cluster) ClientTLS() *tls.Config {
	if c.clientTLS == nil {
		return nil
	}
	return c.clientTLS.ClientConfig()
}

// Secure reports whether the cluster runs with TLS.
func (c *Cluster) Secure() bool { return c.opts.Secure }
