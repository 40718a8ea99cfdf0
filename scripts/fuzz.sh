#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a fixed budget each, one
# target at a time (`go test -fuzz` takes one target per package run).
#   scripts/fuzz.sh BUDGET [PACKAGE...]
# BUDGET is a -fuzztime: a duration (30s) or a count of inputs (200x).
# Without packages, every package with a *_fuzz_test.go file is fuzzed.
# A failing input is written under the package's testdata/fuzz/<target>:
# commit it, and plain `go test` runs it from then on.
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
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
n=0
for pkg in "${pkgs[@]}"; do
	# -list prints the package's targets, then its "ok" line.
	targets=$($GO test -run '^$' -list '^Fuzz' "$pkg" | grep '^Fuzz' || true)
	for t in $targets; do
		echo "fuzz: $pkg $t ($budget)"
		# One worker: a target's broker or etcd is started per worker, and
		# a fixed count of inputs then costs the same on any machine.
		$GO test -run '^$' -fuzz "^$t\$" -fuzztime "$budget" -parallel 1 "$pkg" >"$out" 2>&1 || {
			cat "$out"
			echo "fuzz: $t failed; its input is under $pkg/testdata/fuzz/$t"
			exit 1
		}
		tail -n 1 "$out"
		n=$((n + 1))
	done
done
echo "fuzz: $n targets, $budget each, $((SECONDS - start))s"
