// Package cluster holds what the Strand services share about coordination:
// the etcd key schema (schema.go is the one file that names every key), the
// JSON values stored under those keys, and the one rule for W (policy.go).
//
// Services coordinate only through etcd. Guarded commits compare the mod
// revisions they read; nothing else stores cluster metadata.
package cluster
