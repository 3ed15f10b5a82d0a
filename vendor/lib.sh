# shellcheck shell=bash
# Shared by vendor/check.sh and vendor/update.sh (sourced, not run): the
# record of a vendored release (vendor/CRATE-patches/UPSTREAM), and how to
# obtain a release's .crate file.

vendor_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The vendored crate a script works on: VENDOR_CRATE (wasmtime, hyper).
vendor_crate=${VENDOR_CRATE:-wasmtime}
patches_dir=$vendor_dir/$vendor_crate-patches
record=$patches_dir/UPSTREAM
[ -f "$record" ] || { echo "${0##*/}: no vendored crate '$vendor_crate' ($record)" >&2; exit 1; }

fail() {
  echo "${0##*/}: $*" >&2
  exit 1
}

# The value of `key=value` in the record; `field key optional` may be empty.
field() {
  local value
  value=$(sed -n "s/^$1=//p" "$record")
  [ -n "$value" ] || [ "${2:-}" = optional ] || fail "$record has no '$1=' line"
  printf '%s\n' "$value"
}

# Sets crate, version, sha256, vendored, not_vendored[] and inlay_files[]
# from the record, for the scripts that source this file.
# shellcheck disable=SC2034
load_record() {
  local list
  crate=$(field crate)
  version=$(field version)
  sha256=$(field sha256)
  vendored=$vendor_dir/$crate
  list=$(field not-vendored optional)
  read -r -a not_vendored <<<"$list"
  list=$(field inlay-files optional)
  read -r -a inlay_files <<<"$list"
  local path
  for path in "${not_vendored[@]}" "${inlay_files[@]}"; do
    case "$path" in
      "" | /* | *..* | */*) fail "'$path' in $record must name a top-level path of the crate" ;;
    esac
  done
}

# The patches, in the order they apply.
patch_files() {
  local files
  files=("$patches_dir"/[0-9][0-9][0-9][0-9]-*.patch)
  [ -e "${files[0]}" ] || fail "no patches in $patches_dir"
  printf '%s\n' "${files[@]}"
}

sha256_of() {
  sha256sum <"$1" | cut -d' ' -f1
}

# A throwaway cargo project in $1 depending on exactly `$crate $2`: cargo
# resolves and downloads through whatever registry configuration it has
# (mirrors, proxies), and without default features it pulls in few others.
cargo_fetch_release() {
  mkdir -p "$1/src"
  : >"$1/src/lib.rs"
  cat >"$1/Cargo.toml" <<EOF
[package]
name = "vendor-fetch"
version = "0.0.0"
edition = "2024"

[dependencies]
$crate = { version = "=$2", default-features = false }

[workspace]
EOF
  (cd "$1" && cargo fetch --quiet)
}

# The registry's checksum of `$crate $1`, as cargo writes it in Cargo.lock.
registry_checksum() {
  local work
  work=$(mktemp -d)
  cargo_fetch_release "$work" "$1" || { rm -rf "$work"; fail "cargo cannot fetch $crate $1"; }
  awk -v name="$crate" -v vers="$1" '
    /^\[\[package\]\]/ { n = ""; v = "" }
    /^name = / { n = $3; gsub(/"/, "", n) }
    /^version = / { v = $3; gsub(/"/, "", v) }
    /^checksum = / && n == name && v == vers { c = $3; gsub(/"/, "", c); print c }
  ' "$work/Cargo.lock"
  rm -rf "$work"
}

# Copies a cached $1 whose sha256 is $2 to $3.
from_cargo_cache() {
  local cached
  for cached in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$1"; do
    [ -f "$cached" ] || continue
    if [ "$(sha256_of "$cached")" = "$2" ]; then
      cp "$cached" "$3"
      return 0
    fi
    echo "${0##*/}: ignoring $cached: its sha256 is not $2" >&2
  done
  return 1
}

# Writes `$crate $1`'s .crate file, whose sha256 must be $2, to $3: from
# cargo's cache, else crates.io by curl, else by cargo.
obtain_release() {
  local file=$crate-$1.crate release_version=$1 want=$2 dest=$3
  if ! from_cargo_cache "$file" "$want" "$dest"; then
    local url=https://static.crates.io/crates/$crate/$file
    if ! { command -v curl >/dev/null 2>&1 && curl -fsSL --retry 2 -o "$dest" "$url"; }; then
      local work
      work=$(mktemp -d)
      if ! { cargo_fetch_release "$work" "$release_version" && from_cargo_cache "$file" "$want" "$dest"; }; then
        rm -rf "$work"
        fail "cannot obtain $file from cargo's cache, $url or cargo fetch"
      fi
      rm -rf "$work"
    fi
  fi
  local got
  got=$(sha256_of "$dest")
  [ "$got" = "$want" ] || fail "$file has sha256 $got, not the recorded $want"
}

# Unpacks the .crate file $1 as directory $2.
unpack_release() {
  local work
  work=$(mktemp -d "$(dirname "$2")/unpack.XXXXXX")
  tar -xzf "$1" -C "$work"
  local top=("$work"/*)
  if [ ${#top[@]} != 1 ] || [ ! -d "${top[0]}" ]; then
    fail "$1 does not hold one directory"
  fi
  mv "${top[0]}" "$2"
  rmdir "$work"
}
