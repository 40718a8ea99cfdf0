package devcluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"

	"github.com/strandhq/strand/client"
)

// InfoFile is the name of the file, in the data dir, that records a running
// dev cluster (docs/operating.md, "strandctl dev"). Its endpoints are read
// by client.DevClusterConfig, for strandctl's commands and for programs
// alike; this package writes the file and reads its process ids.
const InfoFile = client.DevClusterFile

// Info is what cluster.json holds: endpoints and process ids. The JSON
// names of Controller and Brokers' Address are what client.DevClusterConfig
// reads.
type Info struct {
	Etcd          []string     `json:"etcd"`
	Prefix        string       `json:"prefix"`
	Controller    string       `json:"controller"`
	Recoverer     string       `json:"recoverer,omitempty"`
	Brokers       []BrokerInfo `json:"brokers"`
	ControllerPID int          `json:"controller_pid"`
	RecovererPID  int          `json:"recoverer_pid"`
	PID           int          `json:"pid"`
}

// BrokerInfo is one broker of a dev cluster.
type BrokerInfo struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	PID     int    `json:"pid"`
}

// BrokerAddresses lists the brokers' addresses.
func (i Info) BrokerAddresses() []string {
	out := make([]string, len(i.Brokers))
	for j, b := range i.Brokers {
		out[j] = b.Address
	}
	return out
}

// Broker returns the broker with node id node.
func (i Info) Broker(node string) (BrokerInfo, bool) {
	for _, b := range i.Brokers {
		if b.Node == node {
			return b, true
		}
	}
	return BrokerInfo{}, false
}

// ErrNoCluster is returned by ReadInfo when no dev cluster runs in the dir:
// the client's error for the same case, so either reader's answer matches.
var ErrNoCluster = client.ErrNoDevCluster

// ReadInfo reads DIR/cluster.json.
func ReadInfo(dir string) (Info, error) {
	raw, err := os.ReadFile(filepath.Join(dir, InfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("%w: %s", ErrNoCluster, filepath.Join(dir, InfoFile))
	}
	if err != nil {
		return Info{}, err
	}
	var info Info
	if err := json.Unmarshal(raw, &info); err != nil {
		return Info{}, fmt.Errorf("devcluster: %s: %w", filepath.Join(dir, InfoFile), err)
	}
	return info, nil
}

// writeInfo replaces DIR/cluster.json atomically (temp file and rename), so
// a reader never sees half a file.
func writeInfo(dir string, info Info) error {
	raw, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, InfoFile+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, InfoFile))
}

// FreePortBase picks a random port base P whose ports (etcd P and P+1,
// controller P+2, recoverer P+3, broker i P+10+i) are free on loopback now.
func FreePortBase(brokers int) (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(40000)
		ports := []int{p, p + 1, p + 2, p + 3}
		for i := 1; i <= brokers; i++ {
			ports = append(ports, p+10+i)
		}
		free := true
		for _, port := range ports {
			ln, err := net.Listen("tcp", loopback(port))
			if err != nil {
				free = false
				break
			}
			_ = ln.Close()
		}
		if free {
			return p, nil
		}
	}
	return 0, errors.New("devcluster: no free port range on loopback")
}
