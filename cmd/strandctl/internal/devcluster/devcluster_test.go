package devcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A second start on the data dir of a running cluster is refused and
// leaves its cluster.json, which every other command reads to reach it.
func TestStartRefusesTheDirOfARunningCluster(t *testing.T) {
	dir := t.TempDir()
	// A live process stands for the running cluster's strandctl.
	running := Info{PID: os.Getppid(), Controller: "127.0.0.1:1"}
	if err := writeInfo(dir, running); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Fatalf("a start on a running cluster's dir: %v, want it refused", err)
	}
	if _, err := os.Stat(filepath.Join(dir, InfoFile)); err != nil {
		t.Fatalf("the running cluster's %s is gone: %v", InfoFile, err)
	}
}
