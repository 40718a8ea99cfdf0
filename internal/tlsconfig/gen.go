package tlsconfig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Default lifetimes, as `cockroach cert` has them: a CA for 10 years, the
// certificates it issues for 5. A renewed certificate is picked up without
// a restart (Reloader), so short ones cost nothing but the renewals.
const (
	DefaultCALifetime   = 10 * 365 * 24 * time.Hour
	DefaultCertLifetime = 5 * 365 * 24 * time.Hour
)

// CA is a certificate authority that issues node and client certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	PEM  []byte
}

// PEMPair is a certificate and its private key, PEM encoded.
type PEMPair struct {
	Cert, Key []byte
	// Serial is the certificate's serial number.
	Serial *big.Int
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// NewCA makes a self-signed CA valid for lifetime (0: DefaultCALifetime).
func NewCA(name string, lifetime time.Duration) (*CA, PEMPair, error) {
	if lifetime <= 0 {
		lifetime = DefaultCALifetime
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, PEMPair{}, err
	}
	sn, err := serial()
	if err != nil {
		return nil, PEMPair{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Strand"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, PEMPair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, PEMPair{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &CA{Cert: cert, Key: key, PEM: certPEM}, PEMPair{Cert: certPEM, Key: keyPEM, Serial: sn}, nil
}

// LoadCA reads a CA's certificate and key (ca.crt and ca.key of a certs
// dir).
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: CA %s with key %s: %w", certFile, keyFile, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("tlsconfig: %s is not a CA certificate", certFile)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("tlsconfig: %s: key cannot sign", keyFile)
	}
	raw, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: signer, PEM: raw}, nil
}

// Issue makes a certificate for an identity of kind (KindNode or
// KindClient) named name, signed by ca and valid for lifetime (0:
// DefaultCertLifetime). A node's certificate serves and dials (server and
// client auth) and names hosts (DNS names or IPs) as the addresses it is
// reached at; a client's only dials.
func (ca *CA) Issue(kind, name string, hosts []string, lifetime time.Duration) (PEMPair, error) {
	if kind != KindNode && kind != KindClient {
		return PEMPair{}, fmt.Errorf("tlsconfig: kind %q: want %s or %s", kind, KindNode, KindClient)
	}
	if err := ValidateName(name); err != nil {
		return PEMPair{}, err
	}
	if lifetime <= 0 {
		lifetime = DefaultCertLifetime
	}
	key, keyPEM, err := newKey()
	if err != nil {
		return PEMPair{}, err
	}
	sn, err := serial()
	if err != nil {
		return PEMPair{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"Strand"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{IdentityURI(kind, name)},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter // never past its issuer's
	}
	if kind == KindNode {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return PEMPair{}, err
	}
	return PEMPair{Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Key: keyPEM, Serial: sn}, nil
}

// ErrExists is returned by WriteFiles for a file that is there already and
// overwrite was not asked for.
var ErrExists = errors.New("tlsconfig: file exists (pass --overwrite to replace it)")

// WriteFile writes data to path with mode 0600, by a temp file renamed over
// it: a reader (a Reloader at a handshake) sees the old file or the new
// one, never half of one. It refuses to replace a file unless overwrite.
func WriteFile(path string, data []byte, overwrite bool) error {
	if !overwrite {
		if _, err := os.Stat(path); err == nil {
			return fmt.Errorf("%w: %s", ErrExists, path)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// WritePair writes a certificate and its key (key first: a Reloader that
// sees the new certificate with the old key keeps the old pair until the
// key is there too, and that order makes the window one rename).
func WritePair(certPath, keyPath string, p PEMPair, overwrite bool) error {
	if !overwrite {
		for _, f := range []string{certPath, keyPath} {
			if _, err := os.Stat(f); err == nil {
				return fmt.Errorf("%w: %s", ErrExists, f)
			}
		}
	}
	if err := WriteFile(keyPath, p.Key, true); err != nil {
		return err
	}
	return WriteFile(certPath, p.Cert, true)
}

// CreateCA makes a CA and writes ca.crt and ca.key into dir.
func CreateCA(dir string, lifetime time.Duration, overwrite bool) (*CA, error) {
	ca, pair, err := NewCA("Strand CA", lifetime)
	if err != nil {
		return nil, err
	}
	if err := WritePair(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile), pair, overwrite); err != nil {
		return nil, err
	}
	return ca, nil
}

// CreateNode issues a node certificate with dir's CA and writes node.crt
// and node.key into outDir (dir itself when empty).
func CreateNode(dir, outDir, node string, hosts []string, lifetime time.Duration, overwrite bool) (PEMPair, error) {
	return create(dir, outDir, KindNode, node, hosts, lifetime, overwrite, NodeCert, NodeKey)
}

// CreateClient issues a client certificate with dir's CA and writes
// client.PRINCIPAL.crt and .key into outDir (dir itself when empty).
func CreateClient(dir, outDir, principal string, lifetime time.Duration, overwrite bool) (PEMPair, error) {
	if err := ValidateName(principal); err != nil {
		return PEMPair{}, err
	}
	return create(dir, outDir, KindClient, principal, nil, lifetime, overwrite, ClientCert(principal), ClientKey(principal))
}

func create(dir, outDir, kind, name string, hosts []string, lifetime time.Duration, overwrite bool, certName, keyName string) (PEMPair, error) {
	ca, err := LoadCA(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile))
	if err != nil {
		return PEMPair{}, err
	}
	pair, err := ca.Issue(kind, name, hosts, lifetime)
	if err != nil {
		return PEMPair{}, err
	}
	if outDir == "" {
		outDir = dir
	}
	if outDir != dir {
		// A node's dir holds the CA certificate it verifies peers with,
		// never the CA's key.
		if err := WriteFile(filepath.Join(outDir, CAFile), ca.PEM, true); err != nil {
			return PEMPair{}, err
		}
	}
	return pair, WritePair(filepath.Join(outDir, certName), filepath.Join(outDir, keyName), pair, overwrite)
}
