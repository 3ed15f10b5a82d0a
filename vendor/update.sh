#!/usr/bin/env bash
# Changes a vendored crate (VENDOR_CRATE: wasmtime, the default, or hyper)
# through a git repository of its own, where each patch is a commit on the
# release: to move to another release, or to edit, add or drop a patch.
# vendor/CRATE-patches/README.md has the steps.
#
#   bash vendor/update.sh start DIR [VERSION]
#       DIR becomes a repository: branch `upstream` holds the recorded
#       release, branch `inlay` (checked out) one commit per patch on top.
#       With VERSION, `upstream` moves on to that release (checksum from
#       the registry) and `inlay` is rebased onto it; resolve what stops the
#       rebase as usual (edit, git add, git rebase --continue; or git rebase
#       --skip to drop a patch the release made unnecessary).
#   bash vendor/update.sh finish DIR
#       Writes branch `inlay` back: vendor/CRATE-patches/*.patch,
#       vendor/CRATE, and the release's version and sha256 in
#       vendor/CRATE-patches/UPSTREAM; then runs vendor/check.sh.
set -euo pipefail
# shellcheck source=vendor/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  sed -n '2,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 2
}

# Commits in DIR under a fixed name unless the user has one configured.
in_dir() {
  git -C "$dir" -c user.name="$(git config user.name || echo vendor-update)" \
    -c user.email="$(git config user.email || echo vendor-update@localhost)" "$@"
}

# Replaces DIR's work tree by the release $1 (sha256 $2) and commits it.
commit_release() {
  local tmp
  tmp=$(mktemp -d)
  obtain_release "$1" "$2" "$tmp/release.crate"
  unpack_release "$tmp/release.crate" "$tmp/tree"
  in_dir rm -rq --ignore-unmatch .
  cp -a "$tmp/tree/." "$dir/"
  rm -rf "$tmp"
  in_dir add -A -f .
  in_dir commit -q -m "$crate $1 as published on crates.io"
  in_dir config inlay.version "$1"
  in_dir config inlay.sha256 "$2"
}

start() {
  local new_version=${1:-}
  [ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || fail "$dir exists and is not empty"
  mkdir -p "$dir"
  git -C "$dir" -c init.defaultBranch=upstream init -q
  commit_release "$version" "$sha256"
  in_dir checkout -q -b inlay
  local patch_list
  patch_list=$(patch_files)
  mapfile -t patches <<<"$patch_list"
  in_dir am -q "${patches[@]}"
  echo "$dir: branch inlay = $crate $version + ${#patches[@]} patches" >&2
  [ -n "$new_version" ] || return 0

  local new_sha256
  new_sha256=$(registry_checksum "$new_version")
  [ -n "$new_sha256" ] || fail "the registry lists no checksum for $crate $new_version"
  in_dir checkout -q upstream
  commit_release "$new_version" "$new_sha256"
  in_dir checkout -q inlay
  # rust-version "1.95" means 1.95.0; sort -V would put it before "1.95.0".
  local needs ours
  needs=$(in_dir show upstream:Cargo.toml | sed -n 's/^rust-version = "\([0-9]*\.[0-9]*\).*"/\1/p')
  ours=$(sed -n 's/^rust-version = "\([0-9]*\.[0-9]*\).*"/\1/p' "$vendor_dir/../Cargo.toml")
  if [ -n "$needs" ] && [ -n "$ours" ] &&
    [ "$(printf '%s\n%s\n' "$needs" "$ours" | sort -V | tail -n1)" != "$ours" ]; then
    echo "$dir: WARNING: $crate $new_version needs Rust $needs; the workspace's rust-version is $ours" >&2
  fi
  if in_dir rebase -q upstream; then
    echo "$dir: the patches apply to $crate $new_version; check them, then: bash vendor/update.sh finish $dir" >&2
  else
    echo "$dir: resolve the rebase onto $crate $new_version (git status), then: bash vendor/update.sh finish $dir" >&2
  fi
}

finish() {
  [ -d "$dir/.git" ] || fail "$dir is not a repository made by 'start'"
  if [ -d "$dir/.git/rebase-merge" ] || [ -d "$dir/.git/rebase-apply" ]; then
    fail "$dir is in the middle of a rebase"
  fi
  [ "$(in_dir rev-parse --abbrev-ref HEAD)" = inlay ] || fail "$dir: check out branch inlay"
  [ -z "$(in_dir status --porcelain)" ] || fail "$dir has uncommitted changes"
  in_dir merge-base --is-ancestor upstream inlay || fail "$dir: inlay is not based on upstream"
  local new_version new_sha256
  new_version=$(in_dir config inlay.version)
  new_sha256=$(in_dir config inlay.sha256)

  rm -f "$patches_dir"/[0-9][0-9][0-9][0-9]-*.patch
  in_dir format-patch -q --zero-commit --no-signature -o "$patches_dir" upstream..inlay

  # The vendored tree: branch inlay, without what the record leaves out,
  # with Inlay's own files kept.
  local keep=() path
  for path in "${inlay_files[@]}"; do keep+=(! -name "$path"); done
  find "$vendored" -mindepth 1 -maxdepth 1 "${keep[@]}" -exec rm -rf {} +
  in_dir archive inlay | tar -x -C "$vendored"
  for path in "${not_vendored[@]}"; do
    rm -rf "${vendored:?}/$path"
  done

  sed -i -e "s/^version=.*/version=$new_version/" -e "s/^sha256=.*/sha256=$new_sha256/" "$record"
  VENDOR_CRATE=$crate bash "$vendor_dir/check.sh"
}

[ $# -ge 2 ] || usage
command=$1
dir=$(realpath -m "$2")
load_record
case "$command" in
  start) [ $# -le 3 ] || usage; start "${3:-}" ;;
  finish) [ $# = 2 ] || usage; finish ;;
  *) usage ;;
esac
