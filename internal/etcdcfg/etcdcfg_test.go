package etcdcfg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/etcdtest"
)

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		o  etcdcfg.Options
		ok bool
	}{
		{etcdcfg.Defaults(), true},
		{etcdcfg.Options{}.WithDefaults(), true},
		{etcdcfg.Options{Mode: "periodic", Retention: "1h"}.WithDefaults(), true},
		{etcdcfg.Options{Mode: "periodic", Retention: "0"}.WithDefaults(), true},
		{etcdcfg.Options{Mode: "revision", Retention: "10000"}.WithDefaults(), true},
		{etcdcfg.Options{Mode: "revision", Retention: "5m"}.WithDefaults(), false},
		{etcdcfg.Options{Mode: "periodic", Retention: "10000"}.WithDefaults(), false},
		{etcdcfg.Options{Mode: "periodic", Retention: "-5m"}.WithDefaults(), false},
		{etcdcfg.Options{Mode: "hourly"}.WithDefaults(), false},
		{etcdcfg.Options{QuotaBytes: -1}.WithDefaults(), false},
	} {
		err := c.o.Validate("etcd-")
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, etcdcfg.ErrInvalid)) {
			t.Errorf("%+v: %v, want ok %v", c.o, err, c.ok)
		}
	}
}

// The options reach the etcd they configure: with a retention of one
// second, history is compacted away within seconds, and a read at the
// first revisions is refused as compacted.
func TestApplyCompacts(t *testing.T) {
	e := etcdtest.StartWith(t, etcdcfg.Options{Mode: etcdcfg.ModePeriodic, Retention: "1s"}.WithDefaults())
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := cli.Put(ctx, "/k", "0")
	if err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 20*time.Second, "history compacted", func() error {
		if _, err := cli.Put(ctx, "/k", "1"); err != nil {
			return err
		}
		_, err := cli.Get(ctx, "/k", clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil
		}
		return fmt.Errorf("read at revision %d: %v", first.Header.Revision, err)
	})
}
