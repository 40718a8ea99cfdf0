#!/usr/bin/env bash
# Runs every test package of the module with -race (make test):
#   scripts/test.sh [PACKAGE...]
# Each package's test binary is built and linked once, every package in
# parallel, then the binaries run one at a time, each in its package's
# directory with no stdin, as `go test -p 1` runs them: the process,
# in-process and container clusters run on short leases and must not
# starve each other's etcd on a 2-core machine.
# `go test -p 1` alone would build and link one package after the other
# too, and linking a -race test binary that embeds etcd takes seconds by
# itself; a compile pass ahead of it (`go test -run '^$' ./...`) builds in
# parallel, but links every binary a first time for nothing and runs every
# TestMain twice (the strandctl binaries and the e2e images built twice).
# `go test` also runs a few go vet checks; make lint runs all of them.
# The output is go test's: ok or FAIL per package with the binary's run
# time, a failing package's whole output; the exit status is 1 when any
# package failed.
set -euo pipefail
GO=${GO:-go}
timeout=${TEST_TIMEOUT:-25m}
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
	set -- ./...
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Packages with tests: import path and directory.
# (Listed into a file first: a failing go list must fail the run, not
# leave it with no packages.)
$GO list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "$@" >"$work/pkgs"
mapfile -t pkgs < <(grep . "$work/pkgs")
if [ ${#pkgs[@]} -eq 0 ]; then
	echo "scripts/test.sh: no test packages in $*"
	exit 1
fi
# `go test -c -o DIR/` names each binary after the last element of its
# import path and refuses two packages of one name (the services' app
# packages), so the packages go into rounds of distinct names: round r holds
# the r-th package of each name. The first round builds almost everything.
declare -A seen
declare -a round_of rounds
for i in "${!pkgs[@]}"; do
	imp=${pkgs[$i]%% *}
	name=${imp##*/}
	r=${seen[$name]:-0}
	seen[$name]=$((r + 1))
	round_of[$i]=$r
	rounds[$r]+=" $imp"
done
echo "building ${#pkgs[@]} test binaries with -race (the first time takes several minutes)..."
for r in "${!rounds[@]}"; do
	mkdir -p "$work/$r"
	# shellcheck disable=SC2086 # the round is a list of import paths
	if ! $GO test -race -c -o "$work/$r/" ${rounds[$r]} >"$work/build.out" 2>&1; then
		cat "$work/build.out"
		exit 1
	fi
done
echo "running the test packages one at a time..."
failed=0
for i in "${!pkgs[@]}"; do
	imp=${pkgs[$i]%% *}
	dir=${pkgs[$i]#* }
	bin="$work/${round_of[$i]}/${imp##*/}.test"
	if [ ! -x "$bin" ]; then
		echo "FAIL	$imp: no test binary at $bin"
		failed=1
		continue
	fi
	start=${EPOCHREALTIME/./}
	status=ok
	if ! (cd "$dir" && "$bin" -test.paniconexit0 -test.timeout "$timeout" </dev/null >"$work/out" 2>&1); then
		cat "$work/out"
		status=FAIL
		failed=1
	fi
	us=$((${EPOCHREALTIME/./} - start))
	printf '%-4s\t%s\t%d.%03ds\n' "$status" "$imp" $((us / 1000000)) $((us / 1000 % 1000))
done
exit $failed
