package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

func TestMain(m *testing.M) {
	// Ryuk would be pulled from a registry; the tests clean up themselves.
	_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	tclog.SetDefault(tclog.NewNoopLogger())
	if err := dockerReachable(); err != nil {
		// Fail, never skip: a suite that cannot run must not look green.
		fmt.Fprintf(os.Stderr, "e2e: the suite needs a reachable Docker engine: %v\n", err)
		os.Exit(1)
	}
	if err := removeLeftovers(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: removing containers an earlier run left: %v\n", err)
		os.Exit(1)
	}
	if os.Getenv("STRAND_E2E_SKIP_IMAGES") == "" {
		if err := buildImages(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: make images: %v\n", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// removeLeftovers removes the containers and networks an earlier run left
// (labelled strand-e2e): a run stopped by its -timeout panics without its
// cleanups, and its brokers would keep using this machine's two cores.
func removeLeftovers() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	ours := make(client.Filters).Add("label", "strand-e2e")
	containers, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: ours})
	if err != nil {
		return fmt.Errorf("listing containers: %w", err)
	}
	for _, c := range containers.Items {
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
			return fmt.Errorf("removing container %s: %w", c.ID, err)
		}
	}
	networks, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: ours})
	if err != nil {
		return fmt.Errorf("listing networks: %w", err)
	}
	for _, n := range networks.Items {
		if _, err := cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil {
			return fmt.Errorf("removing network %s: %w", n.Name, err)
		}
	}
	if n := len(containers.Items) + len(networks.Items); n > 0 {
		fmt.Fprintf(os.Stderr, "e2e: removed %d containers and %d networks an earlier run left\n", len(containers.Items), len(networks.Items))
	}
	return nil
}

func dockerReachable() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.Ping(ctx, client.PingOptions{})
	return err
}

// buildImages runs `make images` at the repository root, so a fresh clone's
// `go test ./...` tests the code it has, not images left from another one.
func buildImages() error {
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	start := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "images")
	cmd.Dir = root
	// Not the make that may have started `go test`: its jobserver flags mean
	// nothing to this one.
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	fmt.Fprintf(os.Stderr, "e2e: images built in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}
