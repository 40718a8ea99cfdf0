package app_test

import (
	"context"
	"errors"
	"testing"

	"github.com/strandhq/strand/internal/tlsconfig"
	"github.com/strandhq/strand/services/recoverer/app"
)

func TestStartRefusedWithoutTLSOrInsecure(t *testing.T) {
	_, err := app.Start(context.Background(), app.Config{Listen: "127.0.0.1:0"})
	if !errors.Is(err, tlsconfig.ErrNoTLS) {
		t.Fatalf("start without --certs-dir or --insecure: %v, want ErrNoTLS", err)
	}
}
