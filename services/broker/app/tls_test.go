package app

import (
	"context"
	"errors"
	"testing"

	"github.com/strandhq/strand/internal/tlsconfig"
)

// A broker without TLS settings refuses to start: running without TLS is
// asked for with --insecure, never fallen into.
func TestStartRefusedWithoutTLSOrInsecure(t *testing.T) {
	_, err := Start(context.Background(), Config{Node: "b1", DataDir: t.TempDir()})
	if !errors.Is(err, tlsconfig.ErrNoTLS) {
		t.Fatalf("start without --certs-dir or --insecure: %v, want ErrNoTLS", err)
	}
	_, err = Start(context.Background(), Config{Node: "b1", DataDir: t.TempDir(), TLS: tlsconfig.Settings{CertsDir: t.TempDir()}})
	if err == nil {
		t.Fatal("a broker started with an empty certs dir")
	}
}
