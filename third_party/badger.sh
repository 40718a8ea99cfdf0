#!/usr/bin/env bash
# Assembles the Badger tree the broker builds (go.mod replaces the module
# with third_party/badger; third_party/badger/README.md says why):
#   third_party/badger.sh OUT_DIR
# OUT_DIR (replaced if it exists) gets github.com/dgraph-io/badger/v4 at the
# version go.mod requires, as the module proxy serves it, trimmed to the
# packages Strand builds (their non-test .go files, go.mod and LICENSE),
# with third_party/badger-patches/*.patch applied in order, and our
# third_party/badger/README.md. `make badger` writes third_party/badger;
# `make check-badger` writes a temporary directory and compares.
set -euo pipefail
GO=${GO:-go}
out=${1:?usage: third_party/badger.sh OUT_DIR}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/.."
root=$PWD

mod=github.com/dgraph-io/badger/v4
# OUT_DIR is removed and written again: only a Badger tree may be there.
if [ -e "$out" ] && ! grep -qs "^module $mod\$" "$out/go.mod"; then
	echo "third_party/badger.sh: $out exists and is not a tree of $mod; not replacing it" >&2
	exit 1
fi
# The packages the broker's build reaches, "." being the module root.
pkgs=(. fb options pb skl table trie y)

# go.mod's require line; the replace does not change the required version.
version=$($GO list -m -f '{{.Version}}' "$mod")
# The download is verified against the checksum database (sum.golang.org,
# through the module proxy): go.sum holds no line for a module replaced by
# a directory, and `go mod tidy` would remove one.
json=$($GO mod download -json "$mod@$version") || { echo "$json" >&2; exit 1; }
src=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
if [ -z "$src" ] || [ ! -f "$src/go.mod" ]; then
	echo "third_party/badger.sh: go mod download $mod@$version gave no module directory:" >&2
	echo "$json" >&2
	exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
tree=$stage/badger
for p in "${pkgs[@]}"; do
	mkdir -p "$tree/$p"
	for f in "$src/$p"/*.go; do
		case $f in *_test.go) continue ;; esac
		cp "$f" "$tree/$p/"
	done
done
cp "$src/go.mod" "$src/LICENSE" "$tree/"
# The module cache is read-only.
chmod -R u+w "$tree"

# git apply, not patch(1): git is on every machine that builds Strand,
# patch is not on a fresh Debian. The tree is made a repository of its own
# so that git apply takes its paths from the tree's root even when the
# temporary directory lies inside another repository (there, git apply
# would skip the paths outside the current directory without a word).
git -C "$tree" init -q
shopt -s nullglob
for p in "$root"/third_party/badger-patches/*.patch; do
	name=third_party/badger-patches/${p##*/}
	if ! git -C "$tree" apply --whitespace=nowarn "$p"; then
		echo "third_party/badger.sh: $name does not apply to $mod@$version" >&2
		echo "(after the patches numbered before it): fix it, third_party/badger/README.md says how" >&2
		exit 1
	fi
done
rm -rf "$tree/.git"

cp "$root/third_party/badger/README.md" "$tree/"
rm -rf "$out"
mkdir -p "$(dirname "$out")"
cp -R "$tree" "$out"
