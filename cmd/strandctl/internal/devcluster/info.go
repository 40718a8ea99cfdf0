package devcluster

import (
	"bytes"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/rpcserver"
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
	// Control is the loopback address of the control endpoint that
	// `strandctl dev stop|start NODE` use (control.go).
	Control string `json:"control,omitempty"`
	// PeerTokenFile holds the cluster's peer token (mode 0600), for a
	// child started by hand: STRAND_PEER_TOKEN=$(cat FILE).
	PeerTokenFile string `json:"peer_token_file,omitempty"`
	// TLS names the admin client's files of a secure cluster (strandctl
	// dev --secure): strandctl and client.DevClusterConfig dial with
	// them. Absent: the cluster runs without TLS.
	TLS *TLSInfo `json:"tls,omitempty"`
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

// ErrNotRunning is what ReadRunning's error for a cluster.json whose
// strandctl dev process is gone matches: one killed with -9 (or with its
// machine) leaves the file behind, and every command would otherwise wait
// out its timeout on addresses nobody listens on.
var ErrNotRunning = errors.New("devcluster: dev cluster not running")

// notRunningError says which dir and process, and what to do.
type notRunningError struct {
	dir string
	pid int
}

func (e notRunningError) Error() string {
	return fmt.Sprintf("dev cluster in %s is not running (pid %d gone): start it with make run, or pass --controller/--broker", e.dir, e.pid)
}

func (e notRunningError) Is(target error) bool { return target == ErrNotRunning }

// ReadRunning reads DIR/cluster.json (ErrNoCluster when there is none) and
// checks that the strandctl dev process that wrote it is alive
// (ErrNotRunning when it is gone).
func ReadRunning(dir string) (Info, error) {
	info, err := ReadInfo(dir)
	if err != nil {
		return Info{}, err
	}
	if info.PID > 0 && !alive(info.PID) {
		return Info{}, notRunningError{dir: dir, pid: info.PID}
	}
	return info, nil
}

// alive reports whether a process with this pid exists (EPERM: it does, as
// another user's) and is not a zombie: a dev process killed a moment ago
// is one until its parent reaps it, and is as gone as a reaped one.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no procfs: the signal's answer is all there is
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

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

// writeInfo replaces DIR/cluster.json atomically.
func writeInfo(dir string, info Info) error {
	raw, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(dir, InfoFile, append(raw, '\n'))
}

// writeFile replaces DIR/NAME atomically (temp file and rename), so a reader
// never sees half a file, with mode 0600 (os.CreateTemp's).
func writeFile(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
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
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}

// PeerTokenFile is the file, in the data dir, that holds the dev cluster's
// peer token (docs/CONTRACTS.md, "strandctl dev").
const PeerTokenFile = "peer-token"

// loadPeerToken returns the token the children share (Follow and Seal are
// for peers only) and the file that holds it: the caller's STRAND_PEER_TOKEN
// when set, else the one DIR/peer-token kept from an earlier start, else a
// fresh one. The file always ends up holding the token in use, mode 0600,
// so a broker started by hand can join and the next start reuses it.
func loadPeerToken(dir string) (token, path string, err error) {
	path = filepath.Join(dir, PeerTokenFile)
	token = rpcserver.PeerToken()
	if token == "" {
		raw, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", "", fmt.Errorf("devcluster: %w", err)
		}
		token = strings.TrimSpace(string(raw))
	}
	if err := rpcserver.ValidatePeerTokens(token, nil); err != nil {
		return "", "", fmt.Errorf("devcluster: peer token (%s or %s): %w", rpcserver.PeerTokenEnv, path, err)
	}
	if token == "" {
		token = crand.Text()
	}
	if err := writeFile(dir, PeerTokenFile, []byte(token+"\n")); err != nil {
		return "", "", fmt.Errorf("devcluster: %w", err)
	}
	return token, path, nil
}

// ReadPeerToken reads the token file cluster.json names.
func ReadPeerToken(info Info) (string, error) {
	if info.PeerTokenFile == "" {
		return "", nil
	}
	raw, err := os.ReadFile(info.PeerTokenFile)
	if err != nil {
		return "", fmt.Errorf("devcluster: %w", err)
	}
	return strings.TrimSpace(string(raw)), nil
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
