package etcdcfg_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// NodeTLS: insecure against plain etcd is no TLS at all; settings the
// node refuses fail as Node does; an etcd client that cannot be built
// fails with "etcd: " before its reason.
func TestNodeTLS(t *testing.T) {
	certs, etcdTLS, err := etcdcfg.NodeTLS(tlsconfig.Settings{Insecure: true}, []string{"http://127.0.0.1:2379"})
	if err != nil || certs != nil || etcdTLS != nil {
		t.Fatalf("insecure, plain etcd: %v %v %v, want no TLS", certs, etcdTLS, err)
	}
	if _, _, err := etcdcfg.NodeTLS(tlsconfig.Settings{}, nil); !errors.Is(err, tlsconfig.ErrNoTLS) {
		t.Fatalf("neither --insecure nor --certs-dir: %v, want ErrNoTLS", err)
	}
	_, _, err = etcdcfg.NodeTLS(tlsconfig.Settings{Insecure: true}, []string{"https://127.0.0.1:2379"})
	if err == nil || !strings.HasPrefix(err.Error(), "etcd: ") || !strings.Contains(err.Error(), "--etcd-cacert") {
		t.Fatalf("https:// etcd without a CA: %v, want an etcd: error naming --etcd-cacert", err)
	}
}
