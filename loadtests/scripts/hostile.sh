#!/usr/bin/env bash
# `make hostile`: the hostile-traffic test (issue 17, item 10), on loopback.
#
# Starts inlay-origin and Inlay (release builds in target/release, or $BIN),
# then inlay-hostile: a normal client measures its latency on a cached URL,
# quiet and then beside slowloris heads, slow readers, HTTP/2 zero-window
# streams and rapid resets, 10k idle connections and random bytes, while
# Inlay's VmRSS/VmHWM and open descriptors are sampled from /proc.
# Passes when the normal client's p99 under attack stays within 2x of its
# quiet p99 (keep-alive and fresh connections), Inlay's peak RSS stays under
# the bound, and Inlay still answers afterwards.
#
# Output: loadtests/reports/hostile/latest.{txt,json} ($OUT), Inlay's log
# beside them. Extra arguments go to inlay-hostile (see --help), e.g.
#   bash loadtests/scripts/hostile.sh --attack-secs 20 --idle 2000
# Bounded: 3 s warm-up, 20 s quiet, 60 s attack by default; the whole run is
# killed after $HOSTILE_TIMEOUT seconds (300).
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-target/release}
OUT=${OUT:-loadtests/reports/hostile}
TIMEOUT=${HOSTILE_TIMEOUT:-300}
# 10k idle connections plus the other attacks: Inlay and the attacker each
# need more than 10k descriptors. Inlay raises its own soft limit (up to
# the hard one) to what its [server] limits need.
NOFILE=${HOSTILE_NOFILE:-16384}

for b in inlay inlay-origin inlay-hostile; do
    [ -x "$BIN/$b" ] || { echo "hostile: $BIN/$b missing (cargo build --release -p inlay -p inlay-origin -p inlay-loadtools)" >&2; exit 2; }
done
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$NOFILE" ]; then
    echo "hostile: the hard limit on open files is $hard, below the $NOFILE this test needs (raise it, or HOSTILE_NOFILE= with fewer --idle connections)" >&2
    exit 2
fi
if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt "$NOFILE" ]; then
    ulimit -Sn "$NOFILE"
fi

mkdir -p "$OUT"
work=$(mktemp -d)
origin_pid=
inlay_pid=
cleanup() {
    for p in $inlay_pid $origin_pid; do
        kill "$p" 2>/dev/null || true
    done
    for p in $inlay_pid $origin_pid; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

"$BIN/inlay-origin" --listen 127.0.0.1:0 >"$work/origin.out" 2>"$work/origin.err" &
origin_pid=$!
for _ in $(seq 100); do
    origin=$(sed -n 's/^listening on //p' "$work/origin.out" | head -1)
    [ -n "$origin" ] && break
    sleep 0.1
done
[ -n "${origin:-}" ] || { echo "hostile: inlay-origin did not start" >&2; cat "$work/origin.err" >&2; exit 2; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/inlay.toml" <<TOML
# The embedded defaults (limits, timeouts) with the access log off: the
# test measures the server, not the log's disk writes. HOSTILE_SERVER_TOML
# adds [server] lines (to compare a setting on and off with one binary).
[server]
listen = ["127.0.0.1:$port"]
${HOSTILE_SERVER_TOML:-}

[backends.default]
address = "$origin"

[cache]
memory_size = "256MiB"

[log]
level = "warn"
access_log = "off"
TOML
# INLAY_CPUS=0 runs Inlay on CPU 0 only (taskset), e.g. beside
# `--attack-cpu 1 --client-cpu 0`: the attackers then do not take Inlay's CPU.
pin=()
[ -n "${INLAY_CPUS:-}" ] && pin=(taskset -c "$INLAY_CPUS")
"${pin[@]}" "$BIN/inlay" serve --config "$work/inlay.toml" >"$OUT/inlay.log" 2>&1 &
inlay_pid=$!
for _ in $(seq 100); do
    if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
        up=1
        break
    fi
    sleep 0.1
done
[ -n "${up:-}" ] || { echo "hostile: inlay did not start" >&2; cat "$OUT/inlay.log" >&2; exit 2; }

echo "hostile: inlay pid $inlay_pid on 127.0.0.1:$port (open files limit $(ulimit -Sn)), origin $origin"
rc=0
timeout "$TIMEOUT" "$BIN/inlay-hostile" --target "127.0.0.1:$port" --pid "$inlay_pid" \
    --json "$OUT/latest.json" "$@" | tee "$OUT/latest.txt" || rc=$?
# What Inlay logged about the attack, by message.
echo "inlay log lines by message:" | tee -a "$OUT/latest.txt"
sed -n 's/.*\(WARN\|ERROR\) *//p' "$OUT/inlay.log" | sed 's/ peer=[^ ]*//; s/[0-9]\{2,\}/N/g' | sort | uniq -c | sort -rn | head -20 | tee -a "$OUT/latest.txt"
exit "$rc"
