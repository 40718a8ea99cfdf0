package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/strandhq/strand/internal/tlsconfig"
)

// A dev cluster (strandctl dev, make run) records its endpoints in
// DevClusterFile in its data dir, DefaultDevClusterDir unless --data-dir
// says otherwise; strandctl and programs run in the same checkout find the
// cluster there with DevClusterConfig.
const (
	DevClusterFile       = "cluster.json"
	DefaultDevClusterDir = ".strand"
)

// ErrNoDevCluster is returned by DevClusterConfig when the directory holds
// no DevClusterFile: no dev cluster runs there.
var ErrNoDevCluster = errors.New("client: no cluster.json (is `strandctl dev` running?)")

// devClusterEndpoints is the part of DevClusterFile a client needs; the
// rest (process ids, etcd) is strandctl dev's own.
type devClusterEndpoints struct {
	Controller string `json:"controller"`
	Brokers    []struct {
		Address string `json:"address"`
	} `json:"brokers"`
	// TLS is set for a secure dev cluster (strandctl dev --secure): the
	// CA and the admin client certificate to dial it with.
	TLS *struct {
		CA   string `json:"ca"`
		Cert string `json:"cert"`
		Key  string `json:"key"`
	} `json:"tls"`
}

// DevClusterConfig returns a Config for the dev cluster whose data dir is
// dir: its controller and brokers, as DIR/cluster.json records them, and
// for a secure one (strandctl dev --secure) the TLS configuration with its
// CA and admin client certificate. An
// empty dir means the DefaultDevClusterDir of the working directory or of
// the nearest parent that has one, so a program run anywhere in a checkout
// (examples/, say) finds the cluster `make run` started at its root. An
// error wraps ErrNoDevCluster when the file does not exist.
func DevClusterConfig(dir string) (Config, error) {
	if dir == "" {
		dir = findDevClusterDir()
	}
	path := filepath.Join(dir, DevClusterFile)
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Config{}, fmt.Errorf("%w: %s", ErrNoDevCluster, path)
	}
	if err != nil {
		return Config{}, fmt.Errorf("client: dev cluster: %w", err)
	}
	var ep devClusterEndpoints
	if err := json.Unmarshal(raw, &ep); err != nil {
		return Config{}, fmt.Errorf("client: dev cluster: %s: %w", path, err)
	}
	cfg := Config{Controller: ep.Controller}
	for _, b := range ep.Brokers {
		if b.Address != "" {
			cfg.Brokers = append(cfg.Brokers, b.Address)
		}
	}
	if cfg.Controller == "" && len(cfg.Brokers) == 0 {
		return Config{}, fmt.Errorf("client: dev cluster: %s names no controller and no broker", path)
	}
	if ep.TLS != nil {
		r, err := tlsconfig.New(tlsconfig.Files{CAFile: ep.TLS.CA, CertFile: ep.TLS.Cert, KeyFile: ep.TLS.Key})
		if err != nil {
			return Config{}, fmt.Errorf("client: dev cluster: %s: %w", path, err)
		}
		cfg.TLS = r.ClientConfig()
	}
	return cfg, nil
}

// findDevClusterDir returns the DefaultDevClusterDir, holding a
// DevClusterFile, of the working directory or its nearest parent; the
// working directory's when none has one (its absence is then the error).
func findDevClusterDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return DefaultDevClusterDir
	}
	// Bounded by the path's depth: Dir of the root is the root.
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, DefaultDevClusterDir, DevClusterFile)); err == nil {
			return filepath.Join(d, DefaultDevClusterDir)
		}
		if filepath.Dir(d) == d {
			return DefaultDevClusterDir
		}
	}
}
