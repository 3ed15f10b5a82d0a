#!/usr/bin/env bash
# Build the example wasi:http components in policies/components/ to
# target/components/<name>.wasm: standard `wasi:http/proxy` 0.2 components
# that Inlay serves as backends (`inlay serve --component FILE`, or
# `[backends.NAME] component = "FILE"`) and `wasmtime serve` runs unchanged.
#
#   policies/components/build.sh          every language (rs js py)
#   policies/components/build.sh rs py    only these
#
# Each is rebuilt only when its sources (or the toolchain) are newer.
#   rs  hello-rs: the `wasip2` crate's bindings, compiled for
#       wasm32-unknown-unknown by the toolchain policies/build.sh uses
#       (rustup's target, or Debian's rustc-web with -Zbuild-std), made a
#       component by `inlay-componentize encode --export
#       wasi:http/incoming-handler`; hello-p3-rs: a wasi:http/service 0.3
#       component (wit-bindgen's async bindings against wit-p3/)
#   js  hello-js: ComponentizeJS 0.23 (guest-sdk/js's node_modules) against
#       wit/ (the fetch event of its StarlingMonkey engine)
#   py  hello-py: componentize-py 0.25.1 (target/lang/python-venv) against
#       wit/, world wasi:http/proxy
#
# Environment:
#   INLAY_COMPONENTIZE  an inlay-componentize already built (else the debug
#                       one is built)
set -euo pipefail

started=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/policies/components"
out="$root/target/components"
wit="$here/wit"
langs=()
for arg in "$@"; do
    case "$arg" in
        rs|js|py) langs+=("$arg") ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "components: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done
[ "${#langs[@]}" -gt 0 ] || langs=(rs js py)
wants() { [[ " ${langs[*]} " == *" $1 "* ]]; }
log() { echo "components: $*" >&2; }
die() { echo "components: error: $*" >&2; exit 1; }
# True when $1 is missing or any file under the other arguments is newer.
stale() {
    local target=$1
    shift
    [ -f "$target" ] || return 0
    [ -n "$(find "$@" -type f -newer "$target" -print -quit 2>/dev/null)" ]
}
mkdir -p "$out"
built=()

build_rs() {
    local tool="${INLAY_COMPONENTIZE:-}"
    if [ -z "$tool" ]; then
        cargo build -q --manifest-path "$root/Cargo.toml" -p inlay-componentize
        tool="$root/target/debug/inlay-componentize"
    fi
    local build=(cargo build --release --target wasm32-unknown-unknown) env=()
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        # What policies/build.sh uses when rustup has no wasm target (it
        # installs Debian's rustc-web, cargo-web and rust-web-src).
        [ -d /usr/lib/rustlib/src/rust/library ] ||
            die "no wasm32 Rust toolchain: run policies/build.sh once (it installs one)"
        local host linker
        host=$(rustc -vV | sed -n 's/^host: //p')
        linker="${INLAY_WASM_LINKER:-$(rustc --print sysroot)/lib/rustlib/$host/bin/rust-lld}"
        build=(/usr/bin/cargo build --release --target wasm32-unknown-unknown -Zbuild-std=std,panic_abort)
        env=(RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$linker")
    fi
    local target_dir="$root/target/components-build" name export t0
    # hello-rs serves wasi:http 0.2; hello-p3-rs 0.3 (wit-p3/).
    for name in hello-rs:wasi:http/incoming-handler hello-p3-rs:wasi:http/handler; do
        export=${name#*:}
        name=${name%%:*}
        stale "$out/$name.wasm" "$here/$name/src" "$here/$name/Cargo.toml" || continue
        t0=$(date +%s)
        env "${env[@]}" CARGO_TARGET_DIR="$target_dir" "${build[@]}" \
            --manifest-path "$here/$name/Cargo.toml"
        "$tool" encode "$target_dir/wasm32-unknown-unknown/release/component_${name//-/_}.wasm" \
            -o "$out/$name.wasm" --export "$export" >/dev/null
        built+=("$name ($(stat -c %s "$out/$name.wasm") bytes, $(( $(date +%s) - t0 ))s)")
    done
}

build_js() {
    local js="$root/guest-sdk/js"
    if [ ! -f "$js/node_modules/@bytecodealliance/componentize-js/src/cli.js" ]; then
        command -v npm >/dev/null || die "npm is missing: run policies/build-lang.sh js once (it installs node)"
        log "installing ComponentizeJS (npm ci in guest-sdk/js)"
        (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
    fi
    stale "$out/hello-js.wasm" "$here/hello-js" "$wit" "$js/package-lock.json" || return 0
    local t0=$(date +%s)
    node "$js/node_modules/@bytecodealliance/componentize-js/src/cli.js" \
        "$here/hello-js/app.js" -w "$wit" -n http -o "$out/hello-js.wasm.tmp"
    mv "$out/hello-js.wasm.tmp" "$out/hello-js.wasm"
    built+=("hello-js ($(stat -c %s "$out/hello-js.wasm") bytes, $(( $(date +%s) - t0 ))s)")
}

build_py() {
    local venv="${INLAY_LANG_DIR:-$root/target/lang}/python-venv"
    if [ ! -x "$venv/bin/componentize-py" ]; then
        log "installing componentize-py (pip, guest-sdk/python/requirements.txt)"
        python3 -m venv "$venv" || die "python3 -m venv failed: run policies/build-lang.sh py once"
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$root/guest-sdk/python/requirements.txt"
        touch "$venv/.requirements-installed"
    fi
    stale "$out/hello-py.wasm" "$here/hello-py" "$wit" "$venv/bin/componentize-py" || return 0
    local t0=$(date +%s)
    "$venv/bin/componentize-py" -d "$wit" -w wasi:http/proxy@0.2.10 componentize \
        -p "$here/hello-py" app -o "$out/hello-py.wasm.tmp" >/dev/null
    mv "$out/hello-py.wasm.tmp" "$out/hello-py.wasm"
    built+=("hello-py ($(stat -c %s "$out/hello-py.wasm") bytes, $(( $(date +%s) - t0 ))s)")
}

for lang in rs js py; do
    if wants "$lang"; then
        "build_$lang"
    fi
done
for line in "${built[@]}"; do
    log "built $line"
done
log "${#built[@]} built in $(( $(date +%s) - started ))s -> $out"
