// Package e2e is Strand's end-to-end suite: every service runs in its own
// container, from the FROM scratch images `make images` builds, and the
// faults are real: containers are SIGKILLed and cut off the network while
// they run (docs/protocol.md).
//
// Each test starts its own cluster with testcontainers-go on two Docker
// networks made for the test run:
//
//   - the cluster network, where the services reach each other by network
//     alias (etcd, controller, recoverer, broker-N) and brokers advertise
//     broker-N:7110. A partition disconnects a container from this network.
//   - the client network, which only carries the host's published ports.
//     It is the container's first network, so Docker publishes its ports
//     there and the host can still reach a broker that is partitioned from
//     its peers (to show it confirms nothing).
//
// Owner hints and Locate answers carry advertise addresses, which only
// resolve inside the cluster network. The test's HTTP client dials through
// a table the test owns, from advertise address to the host port Docker
// mapped for that container, refreshed after every kill, restart, disconnect
// and reconnect (Docker may pick a new host port each time). The unmodified
// Go client (package client) and raw Connect clients run over it.
//
// The suite needs a reachable Docker engine. TestMain builds the images with
// `make images` (cached: a few seconds when nothing changed) unless
// STRAND_E2E_SKIP_IMAGES is set, and exits non-zero when Docker is missing:
// `make test` fails rather than skipping the suite. Ryuk is disabled
// (TESTCONTAINERS_RYUK_DISABLED=true); every test removes its containers,
// volumes and networks when it ends. When a test fails, the logs of every
// container it started are saved under e2e/logs/<test>/.
//
// Tests wait on conditions (polling with deadlines, see
// clustertest.Eventually), never on sleeps. Services run with short
// liveness settings (heartbeat 200ms, lease 2s) so that a failover takes a
// few seconds.
package e2e
