#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a fixed budget each.
#   scripts/fuzz.sh BUDGET [PACKAGE...]
# BUDGET is a -fuzztime: a duration (30s) or a count of inputs (200x).
# Without packages, every package with a *_fuzz_test.go file is fuzzed.
# FUZZ_CACHE=go keeps what the fuzzer learns in Go's fuzz cache, as
# `go test -fuzz` does (make fuzz); otherwise each run starts from the
# seeds and testdata/fuzz alone, so a short run costs the same every time
# (make test).
# A failing input is written under the package's testdata/fuzz/<target>:
# commit it, and plain `go test` runs it from then on.
#
# `go test -fuzz` takes one target per run and links a test binary each
# time; here each package's instrumented binary is built once
# (`go test -c -fuzz`) and run once per target, which is what
# `go test -fuzz` does itself.
set -euo pipefail
GO=${GO:-go}
budget=${1:?usage: scripts/fuzz.sh BUDGET [PACKAGE...]}
shift
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
	mapfile -t pkgs < <(git ls-files '*_fuzz_test.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')
else
	pkgs=("$@")
fi
work=$(mktemp -d)
# With a count of inputs for budget (make test's 200x), two targets run at
# once, one per core of the CI machine: a count costs the same inputs
# however the cores are shared, a target's coordinator and its one worker
# take about a core between them, the fuzz brokers and the admin
# targets' etcd grant no lease that sharing the cores could let run out,
# and each target keeps its own inputs, cache directory and
# testdata/fuzz/<target>. A duration (make fuzz's 30s) buys inputs with
# CPU time, so targets then run one at a time. FUZZ_JOBS overrides both.
case $budget in
*x) parallel=${FUZZ_JOBS:-2} ;;
*) parallel=${FUZZ_JOBS:-1} ;;
esac
trap 'kill $(jobs -p) 2>/dev/null || true; wait; rm -rf "$work"' EXIT
start=$SECONDS
n=0
# Builds first, one package at a time (they share most of their
# instrumented dependencies through the build cache), then every target.
targets=()
for pkg in "${pkgs[@]}"; do
	dir=$($GO list -f '{{.Dir}}' "$pkg")
	path=$($GO list -f '{{.ImportPath}}' "$pkg")
	bin="$work/$(basename "$dir").test"
	$GO test -c -fuzz '^Fuzz' -o "$bin" "$pkg"
	if [ "${FUZZ_CACHE:-}" = go ]; then
		cache="$($GO env GOCACHE)/fuzz/$path"
	else
		cache="$work/cache/$path"
	fi
	for t in $("$bin" -test.list '^Fuzz'); do
		targets+=("$pkg|$dir|$path|$bin|$cache|$t")
	done
done
# fuzz_one runs one target; its output goes to $work/out.<index>.
fuzz_one() {
	local i=$1 pkg dir path bin cache t
	IFS='|' read -r pkg dir path bin cache t <<<"${targets[$i]}"
	# One worker: a target's broker or etcd is started per worker, and
	# a count of inputs then costs about the same on any machine. The
	# binary runs in its package's directory, where testdata/fuzz is.
	(cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^$t\$" -test.fuzztime "$budget" \
		-test.parallel 1 -test.fuzzcachedir "$cache" >"$work/out.$i" 2>&1)
}
# report prints target i's result; a failure ends the run.
report() {
	local i=$1 status=$2 pkg dir path bin cache t
	IFS='|' read -r pkg dir path bin cache t <<<"${targets[$i]}"
	if [ "$status" -ne 0 ]; then
		cat "$work/out.$i"
		echo "FAIL	$path	$t: the failing input is under $pkg/testdata/fuzz/$t"
		exit 1
	fi
	echo "ok	$path	$t ($budget)"
	n=$((n + 1))
}
declare -A running=() # pid -> target index
for i in "${!targets[@]}"; do
	while [ ${#running[@]} -ge "$parallel" ]; do
		status=0
		wait -n -p done "${!running[@]}" || status=$?
		report "${running[$done]}" "$status"
		unset "running[$done]"
	done
	fuzz_one "$i" &
	running[$!]=$i
done
while [ ${#running[@]} -gt 0 ]; do
	status=0
	wait -n -p done "${!running[@]}" || status=$?
	report "${running[$done]}" "$status"
	unset "running[$done]"
done
echo "fuzz: $n targets, $budget each, $parallel at a time, in $((SECONDS - start))s"
echo "fuzz: $n passed, 0 failed"
