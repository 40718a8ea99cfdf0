package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/strandhq/strand/internal/cluster"
)

func TestStartRefusesABadZone(t *testing.T) {
	_, err := Start(context.Background(), Config{Node: "b1", Zone: "rack 7", DataDir: t.TempDir()})
	if !errors.Is(err, cluster.ErrInvalidName) || !strings.Contains(err.Error(), "--zone") {
		t.Fatalf("Start with zone %q: %v, want an invalid name error naming --zone", "rack 7", err)
	}
}

func TestZoneInRegistration(t *testing.T) {
	h := newHarness(t)
	h.configure = func(c *Config) { c.Zone = "rack-7" }
	h.start("b1")
	resp, err := h.cli.Get(context.Background(), h.schema.BrokerKey("b1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("broker key: %v %v", resp, err)
	}
	info, err := cluster.Decode[cluster.BrokerInfo](resp.Kvs[0].Value)
	if err != nil || info.Zone != "rack-7" {
		t.Fatalf("registration %+v, %v; want zone rack-7", info, err)
	}
}
