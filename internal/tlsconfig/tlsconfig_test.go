package tlsconfig_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// certsDir makes a CA, a node certificate for b1 on loopback and a client
// certificate for alice in a temp dir.
func certsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := tlsconfig.CreateCA(dir, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsconfig.CreateNode(dir, "", "b1", []string{"127.0.0.1", "localhost"}, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsconfig.CreateClient(dir, "", "alice", 0, false); err != nil {
		t.Fatal(err)
	}
	return dir
}

func reloader(t *testing.T, f tlsconfig.Files) *tlsconfig.Reloader {
	t.Helper()
	r, err := tlsconfig.New(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// whoami answers with the caller's identity as the server saw it.
func serveWhoami(t *testing.T, dir string) string {
	t.Helper()
	ln, err := rpcserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, principal, ok := rpcserver.PeerFromContext(r.Context())
		fmt.Fprintf(w, "node=%s principal=%s ok=%v proto=%s", node, principal, ok, r.Proto)
	})
	srv := rpcserver.Serve(ln, h, rpcserver.WithTLS(reloader(t, tlsconfig.NodeFiles(dir)).ServerConfig(false)))
	t.Cleanup(func() { _ = srv.Close() })
	return srv.Addr()
}

func get(hc *http.Client, url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestIdentitiesAndPlaintextRefused(t *testing.T) {
	dir := certsDir(t)
	addr := serveWhoami(t, dir)

	if _, err := get(rpcserver.HTTPClient(), rpcserver.BaseURL(addr)+"/"); err == nil {
		t.Fatal("an h2c request to a TLS server was answered")
	}
	for name, c := range map[string]struct {
		files tlsconfig.Files
		want  string
	}{
		"node":      {tlsconfig.NodeFiles(dir), "node=b1 principal= ok=true proto=HTTP/2.0"},
		"client":    {tlsconfig.ClientFiles(dir, "alice"), "node= principal=alice ok=true proto=HTTP/2.0"},
		"anonymous": {tlsconfig.Files{CAFile: filepath.Join(dir, tlsconfig.CAFile)}, "node= principal= ok=false proto=HTTP/2.0"},
	} {
		d := rpcserver.Dialer{TLS: reloader(t, c.files)}
		got, err := get(d.HTTPClient(), d.BaseURL(addr)+"/")
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, c.want)
		}
	}

	// A certificate from another CA is refused, whichever side holds it.
	other := certsDir(t)
	d := rpcserver.Dialer{TLS: reloader(t, tlsconfig.Files{CAFile: filepath.Join(other, tlsconfig.CAFile)})}
	if _, err := get(d.HTTPClient(), d.BaseURL(addr)+"/"); err == nil {
		t.Fatal("a client trusting another CA accepted the server")
	}
	mixed := tlsconfig.ClientFiles(other, "alice")
	mixed.CAFile = filepath.Join(dir, tlsconfig.CAFile)
	d = rpcserver.Dialer{TLS: reloader(t, mixed)}
	if _, err := get(d.HTTPClient(), d.BaseURL(addr)+"/"); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
}

// A renewed certificate, written over the old files, is what the next
// connection sees: no restart.
func TestRenewedCertificateServedWithoutRestart(t *testing.T) {
	dir := certsDir(t)
	addr := serveWhoami(t, dir)
	client := reloader(t, tlsconfig.ClientFiles(dir, "alice"))
	serial := func() (string, error) {
		cfg := client.ClientConfig()
		cfg.ServerName = "127.0.0.1"
		conn, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
	}
	before, err := serial()
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := tlsconfig.CreateNode(dir, "", "b1", []string{"127.0.0.1"}, time.Hour, true)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Serial.String() == before {
		t.Fatal("the renewed certificate has the old serial")
	}
	clustertest.Eventually(t, 10*time.Second, "a new connection sees the renewed certificate", func() error {
		got, err := serial()
		if err != nil {
			return err
		}
		if got != renewed.Serial.String() {
			return fmt.Errorf("serial %s, want %s", got, renewed.Serial)
		}
		return nil
	})
}

// A new CA (a rotation) is trusted once its file is rewritten: the pool is
// reloaded too.
func TestCAPoolReloaded(t *testing.T) {
	dir := certsDir(t)
	other := certsDir(t)
	addr := serveWhoami(t, other)
	caPath := filepath.Join(t.TempDir(), "ca.crt")
	copyFile(t, filepath.Join(dir, tlsconfig.CAFile), caPath)
	d := rpcserver.Dialer{TLS: reloader(t, tlsconfig.Files{CAFile: caPath})}
	if _, err := get(d.HTTPClient(), d.BaseURL(addr)+"/"); err == nil {
		t.Fatal("the server of another CA was accepted")
	}
	copyFile(t, filepath.Join(other, tlsconfig.CAFile), caPath)
	clustertest.Eventually(t, 10*time.Second, "the rewritten CA is trusted", func() error {
		hc := d.HTTPClient()
		_, err := get(hc, d.BaseURL(addr)+"/")
		return err
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := tlsconfig.WriteFile(to, b, true); err != nil {
		t.Fatal(err)
	}
}

func TestWrittenFilesArePrivateAndNotOverwritten(t *testing.T) {
	dir := certsDir(t)
	for _, f := range []string{tlsconfig.CAFile, tlsconfig.CAKeyFile, tlsconfig.NodeCert, tlsconfig.NodeKey, tlsconfig.ClientCert("alice"), tlsconfig.ClientKey("alice")} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	if _, err := tlsconfig.CreateCA(dir, 0, false); !errors.Is(err, tlsconfig.ErrExists) {
		t.Fatalf("CreateCA over an existing CA: %v, want ErrExists", err)
	}
	if _, err := tlsconfig.CreateClient(dir, "", "bad/name", 0, false); err == nil {
		t.Fatal("a principal with a slash was accepted")
	}
}

func TestSettingsValidate(t *testing.T) {
	for _, c := range []struct {
		s  tlsconfig.Settings
		ok bool
	}{
		{tlsconfig.Settings{}, false},
		{tlsconfig.Settings{Insecure: true}, true},
		{tlsconfig.Settings{CertsDir: "d"}, true},
		{tlsconfig.Settings{Insecure: true, CertsDir: "d"}, false},
		{tlsconfig.Settings{CertsDir: "d", EtcdCert: "c"}, false},
	} {
		if err := c.s.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.s, err, c.ok)
		}
	}
	if _, _, ok := tlsconfig.PeerIdentity(nil); ok {
		t.Fatal("PeerIdentity(nil) reports an identity")
	}
	if _, _, ok := tlsconfig.PeerIdentity(&tls.ConnectionState{}); ok {
		t.Fatal("PeerIdentity of a connection without a verified chain reports an identity")
	}
}
