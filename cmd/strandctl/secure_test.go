package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// strandctl dev --secure: the processes run with TLS, cluster.json names
// the admin client's files, and strandctl's commands work with no flags;
// the same commands with --certs-dir of a CA the cluster does not trust
// fail.
func TestDevSecure(t *testing.T) {
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	dir := t.TempDir()
	port := freePortBase(t, 1)
	dev := startDev(t, dir, port, 1, "--secure")
	info, err := devcluster.ReadInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.TLS == nil || !strings.HasPrefix(info.Etcd[0], "https://") {
		t.Fatalf("cluster.json of a secure cluster: tls %+v, etcd %v", info.TLS, info.Etcd)
	}
	raw, err := os.ReadFile(info.TLS.Cert)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := tlsconfig.CertIdentity(cert); !ok || id.Kind != tlsconfig.KindClient || id.Name != tlsconfig.DefaultUser {
		t.Fatalf("admin certificate names %+v (%v)", id, ok)
	}

	clustertest.Eventually(t, 30*time.Second, "a live broker", func() bool {
		r := ctl(t, dir, "", "brokers", "--json")
		return r.code == 0 && strings.Count(r.stdout, `"live":true`) == 1
	})
	mustCtl(t, dir, "", "stream", "create", "sec", "--copies", "1")
	mustCtl(t, dir, "", "publish", "sec", "over-tls")
	if out := mustCtl(t, dir, "", "read", "sec", "--from", "0", "--timeout", "5s"); !strings.Contains(out, "over-tls") {
		t.Fatalf("read over TLS: %q", out)
	}

	// Authentication is on with TLS: the tour's commands run as the admin
	// certificate's principal, which dev bootstrapped with admin on "*".
	if out := mustCtl(t, dir, "", "acl", "list"); !strings.Contains(out, tlsconfig.DefaultUser) || !strings.Contains(out, "admin") {
		t.Fatalf("acl list of a secure dev cluster lacks the admin grant: %q", out)
	}
	mustCtl(t, dir, "", "cursor", "commit", "sec", "billing", "1")
	if out := mustCtl(t, dir, "", "cursor", "get", "sec", "billing"); strings.TrimSpace(out) != "1" {
		t.Fatalf("cursor get: %q", out)
	}
	// acl bootstrap reaches the https etcd with the admin's files: the
	// grant is there already, and is kept.
	if out := mustCtl(t, dir, "", "acl", "bootstrap", tlsconfig.DefaultUser, "--etcd", info.Etcd[0],
		"--etcd-cacert", info.TLS.CA, "--etcd-cert", info.TLS.Cert, "--etcd-key", info.TLS.Key); !strings.Contains(out, "granted admin admin on *") {
		t.Fatalf("acl bootstrap over etcd TLS: %q", out)
	}
	if r := ctl(t, dir, "", "acl", "bootstrap", tlsconfig.DefaultUser, "--etcd", info.Etcd[0], "--timeout", "3s"); r.code == 0 {
		t.Fatalf("acl bootstrap reached an etcd that wants client certificates without any: %s", r.stdout)
	}
	mustCtl(t, dir, "", "stream", "get", "sec")
	mustCtl(t, dir, "", "stream", "list")
	// A token of a principal with read only on sec reads it and is refused
	// publish: the token names the caller, not the certificate beside it.
	created := mustCtl(t, dir, "", "token", "create", "reader")
	lines := strings.Split(strings.TrimSpace(created), "\n")
	secret := lines[len(lines)-1]
	mustCtl(t, dir, "", "acl", "grant", "reader", "read", "sec")
	clustertest.Eventually(t, 30*time.Second, "the reader's token reads sec", func() bool {
		r := ctl(t, dir, "", "read", "sec", "--from", "0", "--timeout", "5s", "--token", secret)
		return r.code == 0 && strings.Contains(r.stdout, "over-tls")
	})
	if r := ctl(t, dir, "", "publish", "sec", "denied", "--token", secret); r.code == 0 || !strings.Contains(r.stderr, "permission_denied") {
		t.Fatalf("publish with a read-only token: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := ctl(t, dir, "", "stream", "create", "sec2", "--token", secret); r.code == 0 || !strings.Contains(r.stderr, "permission_denied") {
		t.Fatalf("stream create with a read-only token: exit %d, stderr %q", r.code, r.stderr)
	}

	// Another CA's client certificate is refused.
	other := t.TempDir()
	mustCtl(t, dir, "", "cert", "create-ca", "--dir", other)
	mustCtl(t, dir, "", "cert", "create-client", "admin", "--dir", other)
	if st, err := os.Stat(filepath.Join(other, tlsconfig.ClientKey("admin"))); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("client key written as %v (%v), want mode 0600", st.Mode(), err)
	}
	if r := ctl(t, dir, "", "stream", "get", "sec", "--certs-dir", other, "--timeout", "3s"); r.code == 0 {
		t.Fatalf("a client of another CA was answered: %s", r.stdout)
	}
	dev.stop(t)
}
