package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/rpcserver"
)

// A client configured with the controller that does not lead finds the
// leader through the LeaderHint that controller answers with (the only way
// it has: no error message is read), and its admin calls succeed there.
func TestAdminFindsTheLeaderThroughTheHint(t *testing.T) {
	leading, other := leader(t)
	// What the client is told by the controller it was given: Unavailable,
	// with the leader's address as a typed hint.
	raw := strandv1connect.NewAdminServiceClient(rpcserver.HTTPClient(), rpcserver.BaseURL(other))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := raw.ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if hint, ok := client.LeaderHint(err); connect.CodeOf(err) != connect.CodeUnavailable || !ok || hint.GetAddress() != leading {
		t.Fatalf("the controller that does not lead answered %v (hint %v), want Unavailable with a hint at %s", err, hint, leading)
	}

	c, err := client.New(client.Config{Controller: other, RetryBudget: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Admin().ListBrokers(ctx, connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		t.Fatalf("ListBrokers through the controller that does not lead: %v", err)
	}
	if n := len(res.Msg.GetBrokers()); n != 3 {
		t.Fatalf("ListBrokers listed %d brokers, want 3", n)
	}
	// Brokers are found from the controller too, through the redirect.
	if _, err := c.Locate(ctx, "no-such-stream"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Locate of a stream that does not exist: %v, want NotFound", err)
	}
}

// A client given an address where no controller listens gives up at its
// deadline with an error that says so: the call, the deadline, the attempts
// and the last answer (Unavailable: the connection was refused).
func TestAdminAtAWrongAddressFailsAtItsDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wrong := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	c, err := client.New(client.Config{Controller: wrong})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Admin().ListStreams(ctx, connect.NewRequest(&strandv1.ListStreamsRequest{}))
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ListStreams at an address with no controller did not return after its deadline")
	}
	if !errors.Is(err, context.DeadlineExceeded) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("ListStreams at %s: %v, want the deadline and the last answer, Unavailable", wrong, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "admin ListStreams") || !strings.Contains(msg, "attempts") || !strings.Contains(msg, wrong) {
		t.Fatalf("error %q does not name the call, its attempts and the address", msg)
	}
}
