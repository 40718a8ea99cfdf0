// Command strandctl runs a local Strand cluster (dev), talks to a cluster as
// a client and operator, and runs the cluster bench. Run `strandctl help`.
//
// Exit codes: 0 ok, 1 a runtime error, 2 a usage error.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
