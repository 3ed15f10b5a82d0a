#!/usr/bin/env bash
# A profile-guided (PGO) release build of inlay, opt-in: target/pgo/inlay.
#
# 1. inlay built with `-Cprofile-generate` (the release profile, in
#    target/pgo-gen, for the host triple given explicitly so that build
#    scripts and proc macros are not instrumented);
# 2. a training run of that binary on loopback: a wasi:http 0.3
#    component's pages passed (hello, 16 KiB) and cached, then an
#    origin's pages as hits, passed, and an ESI page of ten fragments
#    (wrk, 4 s each);
# 3. the profiles merged with the llvm-profdata of rustc's own LLVM
#    (Debian's `llvm-profdata-N`, package `llvm-N`);
# 4. inlay built again with `-Cprofile-use` (target/pgo-use), copied to
#    target/pgo/inlay.
#
# About 20 minutes on 2 cores (two release builds from scratch). Needs
# target/release/inlay-origin (`make build`) and
# target/components/hello-p3-rs.wasm (`make components`).
# docs/performance.md ("This round (stop 42)") has what it gains.
#
# Usage: bash loadtests/scripts/pgo-build.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh"

need_cmds wrk curl rustc cargo
need_bins inlay-origin
component=$root/target/components/hello-p3-rs.wasm
[ -f "$component" ] || { echo "no $component (make components)" >&2; exit 1; }
triple=$(rustc -vV | sed -n 's/^host: //p')
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=$(command -v "llvm-profdata-$llvm" || true)
[ -n "$profdata" ] || {
    echo "pgo-build: no llvm-profdata-$llvm (rustc's LLVM is $llvm): apt-get install llvm-$llvm" >&2
    exit 1
}
data=$root/target/pgo-data
rm -rf "$data"
mkdir -p "$data"

# build NAME FLAG: inlay for $triple in target/pgo-NAME with rustc FLAG.
build() {
    (cd "$root" && cargo build --release -p inlay --target "$triple" \
        --target-dir "$root/target/pgo-$1" \
        --config "target.$triple.rustflags=[\"$2\"]")
}

# train CONFIG PATH...: the instrumented inlay on CONFIG, each PATH at
# `wrk -t2 -c8 -d4s` (a path after `nocookie` is sent without the
# cookie that makes the built-in rules pass), then a clean stop, which
# writes its profile.
train() {
    local config=$1 port cookie=(-H 'Cookie: session=train') path
    shift
    port=$(sed -n 's/^listen = \["127.0.0.1:\([0-9]*\)"\]/\1/p' "$config")
    LLVM_PROFILE_FILE="$data/inlay-%p.profraw" \
        "$root/target/pgo-gen/$triple/release/inlay" serve --config "$config" \
        >"$work/train.out" 2>&1 &
    local pid=$!
    wait_port "$port"
    for path in "$@"; do
        if [ "$path" = nocookie ]; then cookie=(); continue; fi
        curl -fsS -o /dev/null "${cookie[@]}" "http://127.0.0.1:$port$path"
        wrk -t2 -c8 -d4s "${cookie[@]}" "http://127.0.0.1:$port$path" |
            awk -v path="$path" '/Requests\/sec/ { print "  " path ": " $2 " req/s" }'
    done
    kill -TERM "$pid"
    wait "$pid"
}

echo "pgo-build: instrumented build (target/pgo-gen)"
build gen "-Cprofile-generate=$data"

# config NAME BACKEND: a config on a free port whose default backend is
# BACKEND (its `component = ...` or `address = ...` line), in
# $work/NAME.toml.
config() {
    cat >"$work/$1.toml" <<EOF
[server]
listen = ["127.0.0.1:$(free_port)"]
[backends.default]
$2
[log]
access_log = "off"
EOF
}

echo "pgo-build: training"
config component "component = \"$component\""
train "$work/component.toml" /hello '/big?kb=16' nocookie /hello
start_origin
config origin "address = \"http://$origin\""
train "$work/origin.toml" /static/177 nocookie /static/177 /static/16384 \
    '/esi/page?n=10&delay_ms=0'

"$profdata" merge -o "$data/merged.profdata" "$data"/*.profraw
echo "pgo-build: profile-guided build (target/pgo-use)"
build use "-Cprofile-use=$data/merged.profdata"
mkdir -p "$root/target/pgo"
cp "$root/target/pgo-use/$triple/release/inlay" "$root/target/pgo/inlay"
echo "pgo-build: target/pgo/inlay"
