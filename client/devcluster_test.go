package client

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Without a dir, the dev cluster is found in the nearest parent of the
// working directory that has one: a program run in examples/ finds the
// cluster started at the checkout's root.
func TestDevClusterConfigFindsTheNearestParent(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "examples", "quickstart")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	if _, err := DevClusterConfig(""); !errors.Is(err, ErrNoDevCluster) {
		t.Fatalf("no cluster anywhere: %v, want ErrNoDevCluster", err)
	}
	dir := filepath.Join(root, DefaultDevClusterDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	raw := `{"controller": "127.0.0.1:7102", "brokers": [{"node": "b1", "address": "127.0.0.1:7111"}, {"node": "b2", "address": "127.0.0.1:7112"}], "pid": 1}`
	if err := os.WriteFile(filepath.Join(dir, DevClusterFile), []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := DevClusterConfig("")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Controller != "127.0.0.1:7102" || !slices.Equal(cfg.Brokers, []string{"127.0.0.1:7111", "127.0.0.1:7112"}) {
		t.Fatalf("DevClusterConfig = %q %q", cfg.Controller, cfg.Brokers)
	}
	// An explicit dir is read as given, never searched for.
	if _, err := DevClusterConfig(filepath.Join(sub, DefaultDevClusterDir)); !errors.Is(err, ErrNoDevCluster) {
		t.Fatalf("explicit dir without a cluster: %v, want ErrNoDevCluster", err)
	}
}
