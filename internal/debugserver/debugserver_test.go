package debugserver

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestListenServesProfiles(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if err := Listen(addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("status %d, body %.200q", resp.StatusCode, body)
	}
}

func TestListenRefusesABadAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = Listen(ln.Addr().String()) // taken
	if err == nil || !strings.Contains(err.Error(), "--debug-addr") {
		t.Fatalf("got %v, want an error naming --debug-addr", err)
	}
}

func TestEmptyAddressServesNothing(t *testing.T) {
	if err := Listen(""); err != nil {
		t.Fatal(err)
	}
}
