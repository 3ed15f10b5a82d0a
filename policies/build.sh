#!/usr/bin/env bash
# Build the Rust policies in policies/ to WebAssembly components at
# target/policies/<name>.wasm (the folder the host loads policies from).
#
#   policies/build.sh             build every one (incremental: fast when
#                                 nothing changed)
#   policies/build.sh headers     build only the named policies (folder
#                                 names; `make demo` builds the one it serves)
#   policies/build.sh --test      also run the policies' native unit tests
#                                 (of the named policies only, if any)
#
# Steps: (1) compile the policies workspace for wasm32-unknown-unknown into
# core modules (policies/target); (2) build the `inlay-componentize` tool
# from the root workspace; (3) turn each core module into a component and
# validate it.
#
# Toolchain: if rustup already has the wasm32-unknown-unknown target, its
# cargo builds the guests. Otherwise (the usual case here: `rustup target
# add` cannot download) Debian's rustc-web/cargo-web/rust-web-src build
# them with -Zbuild-std, installed with apt-get when missing, and rustup's
# rust-lld links them (Debian's rust-lld points at an lld it does not ship).
#
# Environment:
#   POLICIES_TARGET_DIR  cargo target dir of the guest build (policies/target)
#   CARGO_TARGET_DIR     target dir of the componentize tool (<repo>/target)
#   INLAY_COMPONENTIZE   an inlay-componentize already built (`make demo` and
#                        `make test` build it with the host binaries, which
#                        share its dependencies): step (2) is skipped
#   INLAY_WASM_LINKER    wasm linker to use instead of rustup's rust-lld
set -euo pipefail

started=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
policies="$root/policies"
out="$root/target/policies"
wasm_target_dir="${POLICIES_TARGET_DIR:-$policies/target}"
tool_target_dir="${CARGO_TARGET_DIR:-$root/target}"
run_tests=false
names=()

for arg in "$@"; do
    case "$arg" in
        --test) run_tests=true ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "build.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
        *) names+=("$arg") ;;
    esac
done

log() { echo "policies: $*" >&2; }
die() { echo "policies: error: $*" >&2; exit 1; }

# The policies' folders, and the cargo packages to build: every policy, or
# the named ones (package policy-<folder>).
every=()
for manifest in "$policies"/*/Cargo.toml; do
    every+=("$(basename "$(dirname "$manifest")")")
done
selection=(--workspace)
if [ "${#names[@]}" -eq 0 ]; then
    names=("${every[@]}")
else
    selection=()
    for name in "${names[@]}"; do
        [ -f "$policies/$name/Cargo.toml" ] ||
            die "no Rust policy named '$name' (the Rust policies: ${every[*]})"
        selection+=(-p "policy-$name")
    done
fi

command -v cargo >/dev/null || die "cargo not found (install Rust with rustup)"

# --- (1) guest toolchain -----------------------------------------------------
debian_packages=(rustc-web cargo-web rust-web-src)

debian_toolchain_ready() {
    local status
    status=$(dpkg-query -W -f='${Status}\n' "${debian_packages[@]}" 2>/dev/null) || return 1
    [ "$(grep -c 'install ok installed' <<<"$status")" -eq "${#debian_packages[@]}" ] &&
        [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] &&
        [ -d /usr/lib/rustlib/src/rust/library ]
}

install_debian_toolchain() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${debian_packages[*]}"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null || die "no apt-get: install ${debian_packages[*]} or the rustup wasm32-unknown-unknown target"
    log "installing ${debian_packages[*]} with apt-get"
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${debian_packages[@]}"
}

if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    log "guest toolchain: rustup ($(rustc --version))"
    wasm_build=(cargo build --release --target wasm32-unknown-unknown)
    wasm_env=()
else
    debian_toolchain_ready || install_debian_toolchain
    debian_toolchain_ready || die "Debian's ${debian_packages[*]} did not install"
    host=$(rustc -vV | sed -n 's/^host: //p')
    linker="${INLAY_WASM_LINKER:-$(rustc --print sysroot)/lib/rustlib/$host/bin/rust-lld}"
    if [ -z "${INLAY_WASM_LINKER:-}" ] && [ ! -x "$linker" ] && command -v wasm-ld >/dev/null; then
        linker=$(command -v wasm-ld)
    fi
    [ -x "$linker" ] || die "no wasm linker at $linker (set INLAY_WASM_LINKER to a rust-lld or wasm-ld)"
    log "guest toolchain: Debian $(/usr/bin/rustc --version) with -Zbuild-std, linker $linker"
    wasm_build=(/usr/bin/cargo build --release --target wasm32-unknown-unknown
        -Zbuild-std=std,panic_abort)
    # RUSTC_BOOTSTRAP lets this stable toolchain take -Zbuild-std.
    wasm_env=(RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
        CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$linker")
fi

log "compiling guests into $wasm_target_dir"
env "${wasm_env[@]}" CARGO_TARGET_DIR="$wasm_target_dir" \
    "${wasm_build[@]}" --manifest-path "$policies/Cargo.toml" "${selection[@]}"

# --- (2) the componentize tool (host toolchain, root workspace) ---------------
if [ -n "${INLAY_COMPONENTIZE:-}" ]; then
    tool=$INLAY_COMPONENTIZE
else
    log "building inlay-componentize"
    CARGO_TARGET_DIR="$tool_target_dir" cargo build --release -q \
        --manifest-path "$root/Cargo.toml" -p inlay-componentize
    tool="$tool_target_dir/release/inlay-componentize"
fi
[ -x "$tool" ] || die "inlay-componentize was not built at $tool"

# --- (3) core modules -> components ---------------------------------------------
mkdir -p "$out"
core_dir="$wasm_target_dir/wasm32-unknown-unknown/release"
built=0 fresh=0 components=()
for name in "${names[@]}"; do
    core="$core_dir/policy_${name//-/_}.wasm"
    component="$out/$name.wasm"
    components+=("$component")
    [ -f "$core" ] || die "no core module for policy $name at $core (package must be named policy-$name, crate-type cdylib)"
    if [ "$component" -nt "$core" ] && [ "$component" -nt "$tool" ]; then
        fresh=$((fresh + 1))
        continue
    fi
    "$tool" encode "$core" -o "$component" >/dev/null
    built=$((built + 1))
done
"$tool" check "${components[@]}"
log "$built componentized, $fresh up to date, in $(( $(date +%s) - started ))s -> $out"

# --- native unit tests -----------------------------------------------------------
if $run_tests; then
    log "running native unit tests"
    CARGO_TARGET_DIR="$wasm_target_dir" cargo test --manifest-path "$policies/Cargo.toml" "${selection[@]}"
fi
