package devcluster

import (
	"errors"
	"slices"
	"testing"

	"github.com/strandhq/strand/client"
)

// What dev writes is what the client reads: client.DevClusterConfig, the one
// reader of a dev cluster's endpoints, finds the controller and the brokers
// writeInfo recorded.
func TestClientReadsTheEndpointsDevWrites(t *testing.T) {
	dir := t.TempDir()
	if _, err := client.DevClusterConfig(dir); !errors.Is(err, client.ErrNoDevCluster) || !errors.Is(err, ErrNoCluster) {
		t.Fatalf("DevClusterConfig of an empty dir: %v, want ErrNoDevCluster", err)
	}
	info := Info{
		Etcd: []string{"127.0.0.1:1"}, Controller: "127.0.0.1:2", PID: 7,
		Brokers: []BrokerInfo{{Node: "b1", Address: "127.0.0.1:11", PID: 8}, {Node: "b2", Address: "127.0.0.1:12", PID: 9}},
	}
	if err := writeInfo(dir, info); err != nil {
		t.Fatal(err)
	}
	cfg, err := client.DevClusterConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Controller != info.Controller || !slices.Equal(cfg.Brokers, info.BrokerAddresses()) {
		t.Fatalf("DevClusterConfig = controller %q brokers %q, want %q %q", cfg.Controller, cfg.Brokers, info.Controller, info.BrokerAddresses())
	}
}
