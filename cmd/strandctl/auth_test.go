package main

import (
	"fmt"
	"github.com/strandhq/strand/internal/clustertest"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/onebox"
)

// secretOf reads the secret `token create` printed (its last line).
func secretOf(t *testing.T, out string) (id, secret string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], auth.TokenPrefix) {
		t.Fatalf("token create printed %q: want a header line and the secret", out)
	}
	f := strings.Fields(lines[0])
	return f[1], lines[1]
}

// The token and acl commands against a cluster checking credentials: the
// first admin bootstrapped straight into etcd, which is refused once an
// admin exists; tokens made, listed without secrets and revoked; grants
// made, listed and revoked.
func TestTokenAndACLCommands(t *testing.T) {
	t.Parallel()
	c := onebox.Start(t, onebox.Options{Brokers: []string{"b1"}, Controllers: 1, Auth: auth.Options{Enabled: true}})
	etcd := strings.Join(c.Etcd.Endpoints, ",")

	code, _, stderr := inProcess(t, c, "token", "create", "ops", "--bootstrap", "--etcd", etcd)
	if code != 1 || !strings.Contains(stderr, "already has an admin") {
		t.Fatalf("bootstrap with an admin in place: exit %d, %q", code, stderr)
	}
	// Without the onebox's admin, the cluster has none: bootstrap makes one.
	if _, err := c.Cli.Delete(c.Ctx(), c.Schema.GrantsDir(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := inProcess(t, c, "token", "create", "ops", "--bootstrap", "--etcd", etcd)
	if code != 0 {
		t.Fatalf("bootstrap: exit %d, %s", code, stderr)
	}
	_, ops := secretOf(t, out)

	// Without a token, an admin command is refused.
	code, _, stderr = inProcess(t, c, "token", "list")
	if code != 1 || !strings.Contains(stderr, "unauthenticated") {
		t.Fatalf("token list without a token: exit %d, %q", code, stderr)
	}
	as := func(token string, args ...string) (int, string, string) {
		return inProcess(t, c, append(args, "--token", token)...)
	}
	var aliceID, alice string
	clustertest.Eventually(t, 10*time.Second, "the bootstrapped admin makes a token", func() error {
		code, out, stderr := as(ops, "token", "create", "alice")
		if code != 0 {
			return fmt.Errorf("exit %d: %s", code, stderr)
		}
		aliceID, alice = secretOf(t, out)
		return nil
	})
	if code, out, stderr := as(ops, "acl", "grant", "alice", "read", "orders.*"); code != 0 || !strings.Contains(out, "granted alice read on orders.*") {
		t.Fatalf("acl grant: exit %d, %q, %q", code, out, stderr)
	}
	if code, _, stderr := as(ops, "acl", "grant", "alice", "write", "orders.*"); code != 1 || !strings.Contains(stderr, "permission") {
		t.Fatalf("acl grant of an unknown permission: exit %d, %q", code, stderr)
	}
	code, out, _ = as(ops, "acl", "list", "alice")
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "orders.*") {
		t.Fatalf("acl list: exit %d, %q", code, out)
	}
	code, out, _ = as(ops, "token", "list")
	if code != 0 || !strings.Contains(out, aliceID) || strings.Contains(out, alice) || strings.Contains(out, ops) {
		t.Fatalf("token list: exit %d, %q: want alice's id and no secret", code, out)
	}
	// alice reads streams under orders. but may not manage tokens.
	if code, _, stderr := as(alice, "token", "list"); code != 1 || !strings.Contains(stderr, "permission_denied") {
		t.Fatalf("token list as alice: exit %d, %q", code, stderr)
	}
	if code, out, stderr := as(ops, "acl", "revoke", "alice", "read", "orders.*"); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("acl revoke: exit %d, %q, %q", code, out, stderr)
	}
	if code, _, _ := as(ops, "acl", "revoke", "alice", "read", "orders.*"); code != 1 {
		t.Fatalf("acl revoke of a grant that is gone: exit %d, want 1", code)
	}
	if code, out, stderr := as(ops, "token", "revoke", aliceID); code != 0 || !strings.Contains(out, "revoked token "+aliceID+" of alice") {
		t.Fatalf("token revoke: exit %d, %q, %q", code, out, stderr)
	}
	if code, _, _ := as(ops, "token", "revoke", "--principal", "alice"); code != 1 {
		t.Fatalf("token revoke of a principal without tokens: exit %d, want 1", code)
	}
	// The revoked token no longer works at the controller.
	clustertest.Eventually(t, 10*time.Second, "alice's token stops working", func() error {
		code, _, stderr := as(alice, "brokers")
		if code != 1 || !strings.Contains(stderr, "unauthenticated") {
			return fmt.Errorf("brokers as alice: exit %d, %q", code, stderr)
		}
		return nil
	})
}

// acl bootstrap grants a certificate principal admin on "*" straight in
// etcd: on a secure cluster whose admin grant is gone, the admin
// certificate is refused admin calls until it runs, and creates a stream
// after; a second principal is refused once one holds the grant.
func TestACLBootstrapCertificatePrincipal(t *testing.T) {
	t.Parallel()
	c := onebox.Start(t, onebox.Options{Brokers: []string{"b1"}, Controllers: 1, Secure: true})
	etcd := strings.Join(c.Etcd.Endpoints, ",")
	secure := func(args ...string) (int, string, string) {
		return inProcess(t, c, append(args, "--certs-dir", c.CertsDir())...)
	}
	if _, err := c.Cli.Delete(c.Ctx(), c.Schema.GrantsDir(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 10*time.Second, "the admin certificate refused once its grant is gone", func() error {
		code, _, stderr := secure("acl", "list")
		if code == 1 && strings.Contains(stderr, "permission_denied") {
			return nil
		}
		return fmt.Errorf("acl list: exit %d, %q", code, stderr)
	})
	code, out, stderr := inProcess(t, c, "acl", "bootstrap", "admin", "--etcd", etcd)
	if code != 0 || !strings.Contains(out, "granted admin admin on *") {
		t.Fatalf("acl bootstrap: exit %d, %q, %q", code, out, stderr)
	}
	if code, _, stderr := inProcess(t, c, "acl", "bootstrap", "admin", "--etcd", etcd); code != 0 {
		t.Fatalf("acl bootstrap again for the same principal: exit %d, %q", code, stderr)
	}
	if code, _, stderr := inProcess(t, c, "acl", "bootstrap", "other", "--etcd", etcd); code != 1 || !strings.Contains(stderr, "already has an admin") {
		t.Fatalf("acl bootstrap of a second principal: exit %d, %q", code, stderr)
	}
	clustertest.Eventually(t, 10*time.Second, "the admin certificate creates a stream once bootstrapped", func() error {
		code, _, stderr := secure("stream", "create", "s1", "--copies", "1")
		if code != 0 {
			return fmt.Errorf("stream create: exit %d, %q", code, stderr)
		}
		return nil
	})
	if code, _, stderr := inProcess(t, c, "acl", "bootstrap", "admin", "--etcd", etcd, "--etcd-cert", "x.crt"); code != 2 {
		t.Fatalf("--etcd-cert without --etcd-cacert: exit %d, %q", code, stderr)
	}
}
