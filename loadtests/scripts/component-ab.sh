#!/usr/bin/env bash
# A reused wasi:http 0.3 component behind two builds of Inlay and behind
# `wasmtime serve`, interleaved: did NEW gain on OLD, and where is each
# against wasmtime? The measurement docs/performance.md ("Components",
# "This round") quotes for changes to the 0.3 path.
#
# Three servers run the same component file (target/components/
# hello-p3-rs.wasm, `make components`): `OLD serve` and `NEW serve` on the
# same configuration (the component as the default backend, the access
# log off) and `wasmtime serve -Scli`. Each triple runs `wrk -t2 -c8
# -d DURATION -H 'Cookie: session=bench'` (the cookie makes Inlay's
# built-in rules pass: every request reaches the component) against the
# three in turn, the order reversed every other triple; the summary gives,
# per path, the medians (and ranges) of the ratios within triples:
# old / wasmtime, new / wasmtime and new / old. The machines are shared
# and flip between a fast and a slow phase: ratios within a triple cancel
# most of it, single runs do not.
#
# Usage: bash loadtests/scripts/component-ab.sh OLD_INLAY NEW_INLAY
# Environment: TRIPLES (10), DURATION (3 s), PATHS ("/hello /big?kb=16"),
#   COMPONENT (the .wasm file), WASMTIME (`wasmtime` on the PATH or in
#   ~/.cargo/bin: `cargo install wasmtime-cli --version 48.0.8 --locked`).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

old_bin=$(realpath "${1:?usage: component-ab.sh OLD_INLAY NEW_INLAY}")
new_bin=$(realpath "${2:?usage: component-ab.sh OLD_INLAY NEW_INLAY}")
triples=${TRIPLES:-10}
duration=${DURATION:-3}
paths=${PATHS:-/hello /big?kb=16}
component=${COMPONENT:-$root/target/components/hello-p3-rs.wasm}
wasmtime=${WASMTIME:-$(command -v wasmtime || echo "$HOME/.cargo/bin/wasmtime")}
need_cmds wrk curl python3
for b in "$old_bin" "$new_bin" "$wasmtime"; do
    [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 1; }
done
[ -f "$component" ] || { echo "no component at $component (make components)" >&2; exit 1; }

# inlay WHO BINARY: an Inlay server on the component; its port in port_WHO.
inlay() {
    local who=$1 binary=$2 port
    port=$(free_port)
    cat >"$work/$who.toml" <<EOF
[server]
listen = ["127.0.0.1:$port"]
[backends.default]
component = "$component"
[log]
level = "warn"
access_log = "off"
EOF
    spawn "$binary" serve --config "$work/$who.toml" >"$work/$who.out" 2>&1
    printf -v "port_$who" %s "$port"
    wait_port "$port"
}
inlay old "$old_bin"
inlay new "$new_bin"
port_wasmtime=$(free_port)
spawn "$wasmtime" serve -Scli --addr "127.0.0.1:$port_wasmtime" "$component" >"$work/wasmtime.out" 2>&1
wait_port "$port_wasmtime"

# rps WHO PATH: one run's requests a second.
rps() {
    local port=port_$1
    wrk -t2 -c8 -d"${duration}s" -H 'Cookie: session=bench' "http://127.0.0.1:${!port}$2" |
        awk '/Requests\/sec/ { print $2 }'
}

echo "load average at start: $(loadavg)"
for path in $paths; do
    for who in old new wasmtime; do
        port=port_$who
        curl -fsS -o /dev/null -H 'Cookie: session=bench' "http://127.0.0.1:${!port}$path"
        rps "$who" "$path" >/dev/null
    done
    : >"$work/triples"
    for i in $(seq "$triples"); do
        if [ $((i % 2)) = 0 ]; then
            o=$(rps old "$path"); n=$(rps new "$path"); w=$(rps wasmtime "$path")
        else
            w=$(rps wasmtime "$path"); n=$(rps new "$path"); o=$(rps old "$path")
        fi
        echo "$o $n $w" >>"$work/triples"
    done
    python3 - "$path" "$work/triples" <<'EOF'
import statistics, sys
rows = [[float(x) for x in line.split()] for line in open(sys.argv[2])]
def show(name, xs):
    print(f"{sys.argv[1]} {name}: median {statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f})")
show("old / wasmtime", [o / w for o, n, w in rows])
show("new / wasmtime", [n / w for o, n, w in rows])
show("new / old", [n / o for o, n, w in rows])
EOF
done
echo "load average at end: $(loadavg)"
