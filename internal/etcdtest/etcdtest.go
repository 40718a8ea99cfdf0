// Package etcdtest starts a real, embedded etcd server for tests.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/strandhq/strand/internal/etcdcfg"
)

// Server is an embedded etcd on loopback with a data dir in t.TempDir().
type Server struct {
	Etcd      *embed.Etcd
	Endpoints []string

	closeOnce sync.Once
}

// Start launches etcd and waits until it serves; it is stopped at cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, etcdcfg.Defaults())
}

// StartWith is Start with the given compaction and quota.
func StartWith(t testing.TB, opts etcdcfg.Options) *Server {
	t.Helper()
	s, err := startRetrying(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartIn launches etcd with its data in dir on free loopback ports. A
// port found free can be taken by another test's listener before etcd
// binds it; etcd then fails to start, before it writes anything in dir,
// and is started again on other ports (a few times).
func StartIn(dir string) (*Server, error) {
	return startRetrying(dir, etcdcfg.Defaults())
}

func startRetrying(dir string, opts etcdcfg.Options) (*Server, error) {
	var err error
	for range 3 {
		var s *Server
		if s, err = startIn(dir, opts); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return s, err
		}
	}
	return nil, err
}

func startIn(dir string, opts etcdcfg.Options) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	clientURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	peerURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	// The compaction and quota of every etcd Strand starts, so tests run
	// against the configuration operators are told to run (docs/etcd.md).
	opts.Apply(cfg)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcdtest: not ready after 30s")
	}
	return &Server{Etcd: e, Endpoints: []string{clientURL.String()}}, nil
}

// Client returns a client for the server, closed at cleanup.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Close stops the server. A test may stop it early; the cleanup's Close
// then does nothing.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.Etcd.Close()
		<-s.Etcd.Server.StopNotify()
	})
}

func freeURL() (*url.URL, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return url.Parse("http://" + addr)
}
