#!/usr/bin/env bash
# The profile-guided (PGO) release build of inlay that `make build` ships:
# target/release/inlay.
#
# 1. inlay built with `-Cprofile-generate` (the release profile, in
#    target/pgo-gen, for the host triple given explicitly so that build
#    scripts and proc macros are not instrumented);
# 2. a training run of that binary on loopback, `wrk -t2 -c8 -d4s` (or
#    h2load) a path: a wasi:http 0.3 component's pages passed (hello,
#    16 KiB) and cached; an origin's pages as hits, passed, and an ESI
#    page of ten fragments, the access log on; the `headers` policy on
#    hits, replayed and run live; hits over TLS, HTTP/1.1 and h2;
# 3. the profiles merged with the llvm-profdata of rustc's own LLVM
#    (Debian's `llvm-profdata-N`, package `llvm-N`);
# 4. inlay built again with `-Cprofile-use` (target/pgo-use), copied to
#    target/release/inlay (a later `cargo build --release -p inlay`
#    replaces it with the plain build).
#
# About 40 minutes on 2 cores from scratch (two release builds of inlay:
# 21 and 16 minutes here, and 1.5 of training). When the instrumented
# binary and this script have not changed since the last run, nothing is
# trained or built again: target/release/inlay is left as it is, or, if a
# plain cargo build replaced it, the guided build of target/pgo-use is
# copied back (target/pgo-data/built-from keeps the three digests). A new
# training changes the profile every crate is built with: the guided
# build is then a build from scratch (16 minutes here).
# Needs target/release/inlay-origin, target/components/hello-p3-rs.wasm
# and target/policies/headers.wasm (`make build` builds them first), wrk,
# h2load, openssl and curl.
#
# Usage: bash loadtests/scripts/pgo-build.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh"

need_cmds wrk h2load openssl curl rustc cargo
need_bins inlay-origin
component=$root/target/components/hello-p3-rs.wasm
policy=$root/target/policies/headers.wasm
for f in "$component" "$policy"; do
    [ -f "$f" ] || { echo "pgo-build: no $f (make build builds it)" >&2; exit 1; }
done
triple=$(rustc -vV | sed -n 's/^host: //p')
llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=$(command -v "llvm-profdata-$llvm" || true)
[ -n "$profdata" ] || {
    echo "pgo-build: no llvm-profdata-$llvm (rustc's LLVM is $llvm): apt-get install llvm-$llvm," \
        "or \`make build PGO=off\` for the plain release build" >&2
    exit 1
}
data=$root/target/pgo-data
gen=$root/target/pgo-gen/$triple/release/inlay
use=$root/target/pgo-use/$triple/release/inlay
shipped=$bin/inlay
stamp=$data/built-from

# build NAME FLAG: inlay for $triple in target/pgo-NAME with rustc FLAG.
build() {
    (cd "$root" && cargo build --release -p inlay --target "$triple" \
        --target-dir "$root/target/pgo-$1" \
        --config "target.$triple.rustflags=[\"$2\"]")
}

# digest FILE: its SHA-256.
digest() { sha256sum "$1" | cut -d' ' -f1; }

# ship: the guided build copied to target/release/inlay, not through the
# hard link a cargo build may have left there (that would overwrite
# cargo's own copy in target/release/deps).
ship() {
    mkdir -p "$bin"
    rm -f "$shipped"
    cp "$use" "$shipped"
}

echo "pgo-build: instrumented build (target/pgo-gen)"
build gen "-Cprofile-generate=$data"
# The last run's digests: the instrumented binary, what it shipped, this
# script. When the first and last still hold, its guided build stands.
read -r gen_was shipped_was script_was _ 2>/dev/null <"$stamp" || true
if [ "${gen_was:-}" = "$(digest "$gen")" ] && [ "${script_was:-}" = "$(digest "$0")" ]; then
    if [ -x "$shipped" ] && [ "$(digest "$shipped")" = "$shipped_was" ]; then
        echo "pgo-build: target/release/inlay is up to date (trained on this instrumented build)"
        exit 0
    fi
    if [ -x "$use" ] && [ "$(digest "$use")" = "$shipped_was" ]; then
        ship
        echo "pgo-build: target/release/inlay restored from target/pgo-use (a plain cargo build had replaced it)"
        exit 0
    fi
fi
rm -rf "$data"
mkdir -p "$data"

# config NAME LISTEN BACKEND [LINE...]: a config listening on LISTEN
# (`127.0.0.1:PORT` or `https://127.0.0.1:PORT`) whose default backend
# is BACKEND (its `component = ...` or `address = ...` line), with the
# access log in $work/NAME.log and the LINEs after it, in $work/NAME.toml.
config() {
    local name=$1 listen=$2 backend=$3
    shift 3
    printf '%s\n' "[server]" "listen = [\"$listen\"]" "[backends.default]" "$backend" \
        "[log]" "access_log = \"$work/$name.log\"" "$@" >"$work/$name.toml"
}

# train NAME BASE PATH...: the instrumented inlay on $work/NAME.toml,
# whose listener is the URL BASE; each PATH fetched once (to fill the
# cache), then `wrk -t2 -c8 -d4s` on it. A path after `nocookie` is sent
# without the cookie that makes the built-in rules pass; after `h2`,
# loaded by h2load over h2 instead (80,000 requests, 8 connections of 10
# streams). Then a clean stop, which writes the profile.
train() {
    local name=$1 base=$2 cookie=(-H 'Cookie: session=train') h2=0 path
    shift 2
    LLVM_PROFILE_FILE="$data/inlay-%p.profraw" "$gen" serve --config "$work/$name.toml" \
        >"$work/$name.out" 2>&1 &
    local pid=$!
    wait_port "${base##*:}"
    for path in "$@"; do
        case "$path" in
            nocookie) cookie=(); continue ;;
            h2) h2=1; continue ;;
        esac
        curl -fksS -o /dev/null "${cookie[@]}" "$base$path"
        if [ "$h2" = 1 ]; then
            h2load -n 80000 -c 8 -m 10 "${cookie[@]}" "$base$path" |
                awk -v p="$name $path (h2)" '/^finished in/ { print "  " p ": " $4 " req/s" }'
        else
            wrk -t2 -c8 -d4s "${cookie[@]}" "$base$path" |
                awk -v p="$name $path" '/Requests\/sec/ { print "  " p ": " $2 " req/s" }'
        fi
    done
    kill -TERM "$pid"
    wait "$pid" || { echo "pgo-build: the instrumented inlay ($name) failed:" >&2; cat "$work/$name.out" >&2; exit 1; }
}

echo "pgo-build: training"
port=$(free_port)
config component "127.0.0.1:$port" "component = \"$component\""
train component "http://127.0.0.1:$port" /hello '/big?kb=16' nocookie /hello '/big?kb=16'

start_origin
port=$(free_port)
config origin "127.0.0.1:$port" "address = \"http://$origin\""
train origin "http://127.0.0.1:$port" /static/177 nocookie /static/177 /static/16384 \
    '/esi/page?n=10&delay_ms=0'

# The policy replays what it decided for a request it has seen (the
# default), then runs for every request (memo_size = 0).
port=$(free_port)
config policy "127.0.0.1:$port" "address = \"http://$origin\"" "[policy]" "path = \"$policy\""
train policy "http://127.0.0.1:$port" nocookie /static/177
port=$(free_port)
config policy-live "127.0.0.1:$port" "address = \"http://$origin\"" \
    "[policy]" "path = \"$policy\"" 'memo_size = "0"'
train policy-live "http://127.0.0.1:$port" nocookie /static/177 /static/16384

self_signed_cert
port=$(free_port)
config tls "https://127.0.0.1:$port" "address = \"http://$origin\"" \
    "[[server.tls]]" "cert = \"$work/cert.pem\"" "key = \"$work/key.pem\""
train tls "https://127.0.0.1:$port" nocookie /static/177 /static/16384 h2 /static/177

"$profdata" merge -o "$data/merged.profdata" "$data"/*.profraw
echo "pgo-build: profile-guided build (target/pgo-use)"
build use "-Cprofile-use=$data/merged.profdata"
ship
echo "$(digest "$gen") $(digest "$shipped") $(digest "$0")" >"$stamp"
echo "pgo-build: target/release/inlay"
