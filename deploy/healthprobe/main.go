// Command strand-healthprobe is the health check of Strand's container
// images. The images are built FROM scratch and have no shell, curl or
// grpc-health-probe, so compose and the e2e suite run this static binary
// inside the container instead.
//
//	strand-healthprobe [--timeout 2s] ADDR       grpc.health.v1.Health/Check over Connect (JSON)
//	strand-healthprobe [--timeout 2s] --etcd URL  etcd's GET /health
//
// With --cacert (and --cert/--key for a server that wants a client
// certificate) it checks over TLS: ADDR is dialled as https://, and an
// https:// etcd URL is verified against the CA.
//
// It exits 0 when the target reports itself serving and 1 otherwise, printing
// why on stderr.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	fs := flag.NewFlagSet("strand-healthprobe", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 2*time.Second, "how long the check may take")
	service := fs.String("service", "", "service name to check (empty means the whole server)")
	etcd := fs.String("etcd", "", "check an etcd server's /health at this URL instead (http://host:port)")
	cacert := fs.String("cacert", "", "check over TLS, trusting this CA bundle (PEM)")
	cert := fs.String("cert", "", "client certificate to present over TLS (PEM)")
	key := fs.String("key", "", "key of --cert (PEM)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: strand-healthprobe [--timeout D] [--service NAME] ADDR | --etcd URL")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *cacert != "" {
		cfg, err := tlsConfig(*cacert, *cert, *key)
		if err != nil {
			fmt.Fprintln(os.Stderr, "strand-healthprobe:", err)
			os.Exit(2)
		}
		client.Transport = &http.Transport{TLSClientConfig: cfg}
		scheme = "https://"
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch {
	case *etcd != "" && fs.NArg() == 0:
		err = checkEtcd(ctx, *etcd)
	case *etcd == "" && fs.NArg() == 1:
		err = checkGRPCHealth(ctx, fs.Arg(0), *service)
	default:
		fs.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "strand-healthprobe:", err)
		os.Exit(1)
	}
}

// client and scheme are plain HTTP, or TLS with --cacert.
var (
	client = &http.Client{}
	scheme = "http://"
)

func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func baseURL(addr string) string {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return strings.TrimRight(addr, "/")
	}
	return scheme + addr
}

// checkGRPCHealth calls grpc.health.v1.Health/Check with the Connect unary
// protocol in JSON, which every Strand service serves (docs/operating.md, "Health").
func checkGRPCHealth(ctx context.Context, addr, service string) error {
	body, _ := json.Marshal(map[string]string{"service": service})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL(addr)+"/grpc.health.v1.Health/Check", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	var res struct {
		Status json.RawMessage `json:"status"`
	}
	if err := do(req, &res); err != nil {
		return err
	}
	// connectrpc.com/grpchealth names the enum SERVING_STATUS_SERVING; the
	// upstream grpc.health.v1 proto names it SERVING. Accept either, or its
	// number.
	switch strings.Trim(string(res.Status), `"`) {
	case "SERVING_STATUS_SERVING", "SERVING", "1":
		return nil
	}
	return fmt.Errorf("%s: status %s", addr, res.Status)
}

// checkEtcd reads etcd's /health, which reports false until the member has a
// leader and can serve linearizable reads.
func checkEtcd(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL(url)+"/health", nil)
	if err != nil {
		return err
	}
	var res struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}
	if err := do(req, &res); err != nil {
		return err
	}
	if res.Health != "true" {
		return fmt.Errorf("%s: health %q %s", url, res.Health, res.Reason)
	}
	return nil
}

func do(req *http.Request, out any) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", req.URL, resp.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return errors.Join(fmt.Errorf("%s: undecodable answer %q", req.URL, b), err)
	}
	return nil
}
