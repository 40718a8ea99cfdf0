package main

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/cmd/strandctl/internal/devcluster"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/onebox/ledger"
	"github.com/strandhq/strand/internal/rpcserver"
)

// The cluster failover test with real processes, so the owner can be killed
// for real (docs/protocol.md, "Stream failover"): the dev cluster of strandctl
// (embedded etcd in this process, each service a child process built by
// TestMain) with short liveness timings. Publishers run through the Go
// client the whole time; a ledger of every confirm proves nothing confirmed
// was lost or moved.

// procCluster is a dev cluster of real processes for one test.
type procCluster struct {
	clustertest.View
	t      *testing.T
	cl     *devcluster.Cluster
	dir    string
	client *client.Client
}

func startProcCluster(t *testing.T) *procCluster {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("building the binaries: %v", buildErr)
	}
	dir := t.TempDir()
	log := &lockedBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Options{
		Dir: dir, Brokers: 3, PortBase: freePortBase(t, 3), BinDir: binDir, Log: log,
		BrokerArgs:    []string{"--heartbeat", "200ms", "--lease-ttl", "2s", "--confirm-timeout", "2s"},
		RecovererArgs: []string{"--seal-timeout", "1s"},
	})
	if err != nil {
		t.Fatalf("dev cluster: %v", err)
	}
	p := &procCluster{t: t, cl: cl, dir: dir, View: clustertest.View{T: t, Cli: cl.Etcd(), Schema: cluster.NewSchema("")}}
	t.Cleanup(func() {
		if p.client != nil {
			_ = p.client.Close()
		}
		if err := cl.Close(); err != nil {
			t.Logf("dev cluster close: %v", err)
		}
		if t.Failed() {
			t.Logf("dev cluster events:\n%s", log.String())
			dumpLogs(t, dir)
		}
	})
	info := cl.Info()
	p.client, err = client.New(client.Config{
		Controller: info.Controller, Brokers: info.BrokerAddresses(),
		RetryBudget: 30 * time.Second, AttemptTimeout: 3 * time.Second, ProbeAfter: 500 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *procCluster) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	p.t.Cleanup(cancel)
	return ctx
}

func (p *procCluster) recoveryPending(stream string) bool {
	return p.HasKey(p.Schema.RecoveryKey(stream))
}

func (p *procCluster) addr(node string) string {
	b, ok := p.cl.Info().Broker(node)
	if !ok {
		p.t.Fatalf("no broker %s", node)
	}
	return b.Address
}

// readAll reads every confirmed record node's copy shows, with raw Read
// calls to that broker.
func (p *procCluster) readAll(node, stream string) ([]*strandv1.StoredRecord, error) {
	sc := strandv1connect.NewStreamServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(p.addr(node)))
	return clustertest.ReadAll(sc, node, stream)
}

// ownerFault is what happens to the owner's process, and how it comes back.
type ownerFault struct {
	name  string
	fault func(p *procCluster, node string)
	back  func(p *procCluster, node string)
}

var (
	sigkill = ownerFault{
		name: "SIGKILL",
		fault: func(p *procCluster, node string) {
			if err := p.cl.Kill(node, syscall.SIGKILL); err != nil {
				p.t.Fatal(err)
			}
			if err := p.cl.Wait(p.ctx(), node); err != nil {
				p.t.Fatalf("%s did not exit after SIGKILL: %v", node, err)
			}
		},
		back: func(p *procCluster, node string) {
			if err := p.cl.Restart(p.ctx(), node); err != nil {
				p.t.Fatalf("restart %s: %v", node, err)
			}
		},
	}
	sigstop = ownerFault{
		name: "SIGSTOP",
		fault: func(p *procCluster, node string) {
			if err := p.cl.Kill(node, syscall.SIGSTOP); err != nil {
				p.t.Fatal(err)
			}
			// A stopped broker that the test fails before resuming would
			// hold the cluster's Close for its stop timeout.
			p.t.Cleanup(func() { _ = p.cl.Kill(node, syscall.SIGCONT) })
		},
		back: func(p *procCluster, node string) {
			if err := p.cl.Kill(node, syscall.SIGCONT); err != nil {
				p.t.Fatal(err)
			}
		},
	}
)

// TestOwnerSIGKILLFailover: the owner of a 3-copy majority_durable stream is
// SIGKILLed while publishers run. Its followers lose their follow
// connections and report it suspect, the controller's probe fails too, and
// the stream fails over eagerly, before the lease TTL.
func TestOwnerSIGKILLFailover(t *testing.T) { runOwnerFault(t, sigkill) }

// TestOwnerSIGSTOPFailover: the owner's process is stopped, so nothing but
// its lease expiring tells; after the failover it is continued, finds its
// lease gone and rejoins as a follower.
func TestOwnerSIGSTOPFailover(t *testing.T) { runOwnerFault(t, sigstop) }

func runOwnerFault(t *testing.T, f ownerFault) {
	p := startProcCluster(t)
	const stream = "owner-fault"
	if _, err := p.client.Admin().CreateStream(p.ctx(), connect.NewRequest(&strandv1.CreateStreamRequest{
		Name: stream, Copies: 3, Policy: &strandv1.ConfirmPolicy{Name: cluster.MajorityDurable},
	})); err != nil {
		t.Fatal(err)
	}
	a0, _ := p.Assignment(stream)
	p.WaitApplied(a0, 20*time.Second, nil)
	hist0 := p.History(stream)

	l := ledger.New()
	pub := ledger.Start(p.client.Publish, stream, "k", 4, 30*time.Second, l)
	stopped := false
	defer func() {
		if !stopped {
			pub.Stop()
		}
	}()
	clustertest.Eventually(t, 30*time.Second, "200 confirmed records before the fault", func() error {
		if n := l.Count(); n < 200 {
			return fmt.Errorf("%d confirmed; last error %q", n, pub.LastError())
		}
		return nil
	})

	owner := a0.Owner
	faultAt := time.Now()
	f.fault(p, owner)
	var a1 cluster.Assignment
	clustertest.Eventually(t, 30*time.Second, "the stream recovered onto another owner with no operator", func() error {
		a, ok := p.Assignment(stream)
		if !ok || a.Epoch == a0.Epoch || p.recoveryPending(stream) {
			return fmt.Errorf("assignment %+v", a)
		}
		a1 = a
		return nil
	})
	committed := time.Since(faultAt)
	// The old owner is not back yet, and stays a member, as a follower:
	// the recovery keeps every old copy, and replaces none before
	// --replace-after (docs/protocol.md, "Replacing a missing copy").
	if a1.Epoch != a0.Epoch+1 || a1.Owner == owner || !slices.Contains(a1.Followers, owner) || a1.Copies() != a0.Copies() {
		t.Fatalf("after the %s: %+v, was %+v", f.name, a1, a0)
	}
	clustertest.Eventually(t, 30*time.Second, "publishes confirm at the new epoch", func() error {
		if n := l.AtEpoch(a1.Epoch); n < 100 {
			return fmt.Errorf("%d confirmed at epoch %d; last error %q", n, a1.Epoch, pub.LastError())
		}
		return nil
	})
	pub.Stop()
	stopped = true
	// Clients ride through the failover: the Go client relocates and
	// retries within its budget, so no publish fails.
	if n := pub.Errors(); n > 0 {
		t.Errorf("%d publishes failed across the %s; the last: %s", n, f.name, pub.LastError())
	}
	t.Logf("%s of owner %s: recovery to epoch %d on %s observed %s after; first confirm at the new epoch %s after; %d confirmed, %d publishes cut short by the end of publishing",
		f.name, owner, a1.Epoch, a1.Owner, committed.Round(10*time.Millisecond),
		l.FirstAt(a1.Epoch).Sub(faultAt).Round(10*time.Millisecond), l.Count(), l.Failures())

	hist1 := p.History(stream)
	if s, _ := hist1.Latest(); len(hist1) != len(hist0)+1 || s.Epoch != a1.Epoch || s.Node != a1.Owner {
		t.Fatalf("history after the failover %+v (was %+v), want one start at epoch %d on %s", hist1, hist0, a1.Epoch, a1.Owner)
	}

	// The old owner comes back with its data and rejoins as the follower
	// it already is, with no new recovery.
	f.back(p, owner)
	clustertest.Eventually(t, 40*time.Second, owner+" rejoined as a follower", func() error {
		a, _ := p.Assignment(stream)
		if !slices.Contains(a.Followers, owner) {
			return fmt.Errorf("assignment %+v", a)
		}
		ot, _ := p.Tails(a.Owner, stream)
		tt, ok := p.Tails(owner, stream)
		if !ok || tt.Role != cluster.RoleFollower || tt.Epoch != a1.Epoch || tt.SealEpoch != 0 || tt.RecordTail != ot.RecordTail {
			return fmt.Errorf("%s publishes %+v (present %v); owner %+v", owner, tt, ok, ot)
		}
		return nil
	})
	a2, _ := p.Assignment(stream)
	if a2.Epoch != a1.Epoch || a2.Owner != a1.Owner {
		t.Errorf("the rejoin moved the stream: %+v, was %+v", a2, a1)
	}
	if h := p.History(stream); len(h) != len(hist1) {
		t.Errorf("the rejoin changed the history: %+v, was %+v", h, hist1)
	}
	if p.recoveryPending(stream) {
		t.Error("a recovery is pending after the rejoin")
	}

	recs, err := p.readAll(a1.Owner, stream)
	if err != nil {
		t.Fatal(err)
	}
	found, problems := l.Verify(recs)
	for _, pr := range problems {
		t.Error(pr)
	}
	if found != l.Count() || found < 300 {
		t.Errorf("%d of %d confirmed records found at their offsets", found, l.Count())
	}
	clustertest.Eventually(t, 20*time.Second, "the rejoined copy shows the owner's records", func() error {
		got, err := p.readAll(owner, stream)
		if err != nil {
			return err
		}
		if len(got) != len(recs) {
			return fmt.Errorf("%s shows %d records, owner %d", owner, len(got), len(recs))
		}
		for i := range got {
			if got[i].GetOffset() != recs[i].GetOffset() || got[i].GetChain() != recs[i].GetChain() || string(got[i].GetPayload()) != string(recs[i].GetPayload()) {
				return fmt.Errorf("offset %d differs: %v vs owner %v", i, got[i], recs[i])
			}
		}
		return nil
	})
	t.Logf("%d confirmed records verified at their offsets on the owner and the rejoined copy", found)
}
