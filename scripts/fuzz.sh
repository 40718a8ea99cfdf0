#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a fixed budget each, one
# target at a time.
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
trap 'rm -rf "$work"' EXIT
start=$SECONDS
n=0
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
		# One worker: a target's broker or etcd is started per worker, and
		# a count of inputs then costs about the same on any machine. The
		# binary runs in its package's directory, where testdata/fuzz is.
		if ! (cd "$dir" && "$bin" -test.run '^$' -test.fuzz "^$t\$" -test.fuzztime "$budget" \
			-test.parallel 1 -test.fuzzcachedir "$cache" >"$work/out" 2>&1); then
			cat "$work/out"
			echo "FAIL	$path	$t: the failing input is under $pkg/testdata/fuzz/$t"
			exit 1
		fi
		echo "ok	$path	$t ($budget)"
		n=$((n + 1))
	done
done
echo "fuzz: $n targets, $budget each, in $((SECONDS - start))s"
echo "fuzz: $n passed, 0 failed"
