package main

import (
	"context"
	"errors"
	"flag"
)

func benchCommand() *command {
	return &command{
		name: "bench", summary: "cluster bench: publish with a bounded window, optionally kill the owner, verify every confirm",
		run: func(ctx context.Context, e *env, _ *flag.FlagSet, args []string) error {
			return errors.New("not implemented yet")
		},
	}
}
