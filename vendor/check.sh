#!/usr/bin/env bash
# Checks that each vendored crate, vendor/CRATE (wasmtime, hyper), is
# exactly the crates.io release named in vendor/CRATE-patches/UPSTREAM with
# vendor/CRATE-patches/*.patch applied in order; prints the difference and
# fails otherwise.
#
# Run: make vendor-check   (or: bash vendor/check.sh; VENDOR_CRATE=hyper
# bash vendor/check.sh checks one)
#
# The release comes from cargo's download cache when it is there, else from
# crates.io (curl, or cargo through a throwaway project), and must have the
# recorded sha256. Writes only to a temporary directory.
set -euo pipefail
if [ -z "${VENDOR_CRATE:-}" ]; then
  for record in "$(dirname "${BASH_SOURCE[0]}")"/*-patches/UPSTREAM; do
    name=$(basename "$(dirname "$record")")
    VENDOR_CRATE=${name%-patches} bash "${BASH_SOURCE[0]}"
  done
  exit 0
fi
# shellcheck source=vendor/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

load_record
patch_list=$(patch_files)
mapfile -t patches <<<"$patch_list"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

obtain_release "$version" "$sha256" "$tmp/release.crate"
expected=$tmp/$crate-$version+patches
unpack_release "$tmp/release.crate" "$expected"

# A repository of its own, so that git apply never resolves paths against
# an enclosing one.
git -C "$expected" -c init.defaultBranch=main init -q
for patch in "${patches[@]}"; do
  git -C "$expected" apply --whitespace=nowarn "$patch" ||
    fail "${patch#"$vendor_dir"/} does not apply to $crate $version"
done
rm -rf "$expected/.git"

for path in "${not_vendored[@]}"; do
  rm -rf "${expected:?}/$path"
done
for path in "${inlay_files[@]}"; do
  [ -f "$vendored/$path" ] || fail "vendor/$crate/$path is missing"
  cp "$vendored/$path" "$expected/$path"
done

# Short names, so that the diff reads `wasmtime-X+patches/...` against
# `vendor/wasmtime/...`.
mkdir "$tmp/vendor"
ln -s "$vendored" "$tmp/vendor/$crate"
if ! (cd "$tmp" && diff -ru "$crate-$version+patches" "vendor/$crate"); then
  fail "vendor/$crate is not $crate $version with vendor/$crate-patches applied (diff above).
If the change to vendor/$crate is meant, make it a patch: see vendor/$crate-patches/README.md."
fi
echo "vendor-check: vendor/$crate is $crate $version (sha256 ${sha256:0:12}...) + ${#patches[@]} patches"
