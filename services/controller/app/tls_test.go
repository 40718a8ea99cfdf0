package app

import (
	"context"
	"errors"
	"testing"

	"github.com/strandhq/strand/internal/tlsconfig"
)

func TestStartRefusedWithoutTLSOrInsecure(t *testing.T) {
	_, err := Start(context.Background(), Config{Listen: "127.0.0.1:0"})
	if !errors.Is(err, tlsconfig.ErrNoTLS) {
		t.Fatalf("start without --certs-dir or --insecure: %v, want ErrNoTLS", err)
	}
}
