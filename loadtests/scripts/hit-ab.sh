#!/usr/bin/env bash
# Cache hits of two builds of Inlay side by side: is NEW slower than OLD?
# One inlay-origin; two Inlay servers, one per binary, on the same
# configuration (one plain listener, the origin as the default backend, a
# memory cache of 256 MiB, no policy unless POLICY names one); each path is fetched once to fill
# the cache (the second fetch must be a hit), then PAIRS A/B pairs per path
# of `wrk -t THREADS -c CONNECTIONS -d DURATION`, the order alternated
# within pairs (old new, new old, ...), with the access log off and then
# on (a file; a new pair of servers for each). Each run reads the loaded
# server's CPU time (utime + stime, all threads) from /proc/PID/stat before
# and after: CPU µs per request = the difference / wrk's request count.
# The summary gives, per path and log setting, the median of the per-pair
# ratios new / old of req/s and of CPU µs per request.
#
# Usage: bash loadtests/scripts/hit-ab.sh OLD_INLAY NEW_INLAY [OUT]
#   (inlay-origin from this checkout's target/release, or ORIGIN=path)
# Environment: PAIRS (6), DURATION (4 s), THREADS (2), CONNECTIONS (64),
#   PATHS ("/static/177 /static/16384"), LOGS ("off on"), WARMUP (2 s of
#   wrk per server and path before the pairs), MAX_LOAD (if set, wait
#   until the 1-minute load average is below it before starting), PERF
#   (seconds: after the pairs, `perf record -g` on each server under the
#   same load for that long, per path and log setting; flat profiles go
#   to OUT/perf-*.txt, call graphs to OUT/perf-*-graph.txt; 0, the
#   default, skips it), POLICY (a policy component both servers run,
#   `[policy] path`; none by default), POLICY_MEMO (its `memo_size`: "0"
#   runs the policy on every request instead of replaying its decision).
# Writes OUT/results.tsv (one line per run) and OUT/summary.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

old_bin=$(realpath "${1:?usage: hit-ab.sh OLD_INLAY NEW_INLAY [OUT]}")
new_bin=$(realpath "${2:?usage: hit-ab.sh OLD_INLAY NEW_INLAY [OUT]}")
out=${3:-$root/loadtests/reports/hit-ab}
pairs=${PAIRS:-6}
duration=${DURATION:-4}
threads=${THREADS:-2}
connections=${CONNECTIONS:-64}
paths=${PATHS:-/static/177 /static/16384}
logs=${LOGS:-off on}
warmup=${WARMUP:-2}
perf_secs=${PERF:-0}
origin_bin=${ORIGIN:-$bin/inlay-origin}
policy=()
if [ -n "${POLICY:-}" ]; then
    [ -f "$POLICY" ] || { echo "no policy $POLICY" >&2; exit 1; }
    policy=("[policy]" "path = \"$(realpath "$POLICY")\"")
    [ -z "${POLICY_MEMO:-}" ] || policy+=("memo_size = \"$POLICY_MEMO\"")
fi
need_cmds wrk curl python3
[ "$perf_secs" = 0 ] || need_cmds perf
for b in "$old_bin" "$new_bin" "$origin_bin"; do
    [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 1; }
done
mkdir -p "$out"
results=$out/results.tsv
printf 'log\tpath\tpair\twho\trequests\tseconds\treq_per_s\tcpu_ticks\tcpu_us_per_req\terrors\ttransfer_per_s\tlog_lines\n' >"$results"
tick_us=$((1000000 / $(getconf CLK_TCK)))

if [ -n "${MAX_LOAD:-}" ]; then
    while python3 -c "import sys; sys.exit(float(open('/proc/loadavg').read().split()[0]) < $MAX_LOAD)"; do
        echo "load average $(loadavg): waiting until below $MAX_LOAD" >&2
        sleep 30
    done
fi

start_origin "$origin_bin"

# cpu PID: its user + system CPU time so far, in clock ticks.
cpu() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# start WHO BINARY LOG: an Inlay server; its port and pid are left in
# port_WHO and pid_WHO.
start() {
    local who=$1 binary=$2 log=$3 port access=off
    port=$(free_port)
    [ "$log" = on ] && access=$work/access-$who.log
    cat >"$work/$who.toml" <<EOF
[server]
listen = ["127.0.0.1:$port"]
[backends.default]
address = "http://$origin"
[cache]
memory_size = "256MiB"
[log]
level = "warn"
access_log = "$access"
EOF
    [ "${#policy[@]}" = 0 ] || printf '%s\n' "${policy[@]}" >>"$work/$who.toml"
    spawn "$binary" serve --config "$work/$who.toml" >"$work/$who.out" 2>"$work/$who.err"
    printf -v "pid_$who" %s "$spawned"
    printf -v "port_$who" %s "$port"
    wait_port "$port"
}

stop() {
    local who pid
    for who in old new; do
        pid=pid_$who
        kill "${!pid}" 2>/dev/null || true
        wait "${!pid}" 2>/dev/null || true
    done
}

# run LOG PATH PAIR WHO: one measured wrk run, a line of results.tsv.
run() {
    local log=$1 path=$2 pair=$3 who=$4 pid port before after lines
    pid=pid_$who port=port_$who
    pid=${!pid} port=${!port}
    before=$(cpu "$pid")
    wrk -t "$threads" -c "$connections" -d "${duration}s" "http://127.0.0.1:$port$path" >"$work/wrk.out"
    after=$(cpu "$pid")
    lines=-
    if [ "$log" = on ]; then
        # The log's writer thread writes every 100 ms.
        sleep 0.3
        lines=$(wc -l <"$work/access-$who.log")
        : >"$work/access-$who.log"
    fi
    python3 - "$work/wrk.out" "$log" "$path" "$pair" "$who" "$((after - before))" "$tick_us" "$lines" >>"$results" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
log, path, pair, who, ticks, tick_us, lines = sys.argv[2:]
m = re.search(r"(\d+) requests in ([\d.]+)(m?s)", text)
n, secs = int(m.group(1)), float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors += int(m.group(1)) if m else 0
m = re.search(r"Transfer/sec:\s+(\S+)", text)
print("\t".join(map(str, [log, path, pair, who, n, f"{secs:.2f}", f"{n / secs:.0f}", ticks,
                          f"{int(ticks) * int(tick_us) / max(n, 1):.2f}", errors,
                          m.group(1) if m else "-", lines])))
EOF
    tail -n 1 "$results"
}

echo "load average at start: $(loadavg)" | tee "$out/loadavg.txt"
for log in $logs; do
    start old "$old_bin" "$log"
    start new "$new_bin" "$log"
    for who in old new; do
        port=port_$who
        for path in $paths; do
            url=http://127.0.0.1:${!port}$path
            curl -fsS -o /dev/null "$url"
            curl -fsS -o /dev/null -D "$work/hit.h" "$url"
            grep -qi '^age:' "$work/hit.h" || { echo "$who's $path is not a cache hit:" >&2; cat "$work/hit.h" >&2; exit 1; }
            [ "$warmup" = 0 ] || wrk -t "$threads" -c "$connections" -d "${warmup}s" "$url" >/dev/null
        done
    done
    if [ "$log" = on ]; then
        sleep 0.3
        : >"$work/access-old.log"
        : >"$work/access-new.log"
    fi
    for path in $paths; do
        for p in $(seq "$pairs"); do
            if (( p % 2 )); then order="old new"; else order="new old"; fi
            for who in $order; do run "$log" "$path" "$p" "$who"; done
        done
    done
    if [ "$perf_secs" != 0 ]; then
        for path in $paths; do
            for who in old new; do
                pid=pid_$who port=port_$who
                wrk -t "$threads" -c "$connections" -d "$((perf_secs + 2))s" "http://127.0.0.1:${!port}$path" >/dev/null &
                sleep 1
                data=$work/perf-$who.data
                perf record -q -g -p "${!pid}" -o "$data" -- sleep "$perf_secs" 2>/dev/null
                wait $!
                name=$out/perf-log-$log-$(basename "$path")-$who.txt
                # Flat: by shared object, then by symbol; then the call
                # graphs of the symbols above 2%.
                {
                    perf report -i "$data" --stdio --no-children -g none --sort dso 2>/dev/null | grep -v '^$'
                    perf report -i "$data" --stdio --no-children -g none --sort dso,sym --percent-limit 0.3 2>/dev/null | grep -v '^#' | grep -v '^$'
                } >"$name" || true
                perf report -i "$data" --stdio --no-children --percent-limit 2 2>/dev/null >"$work/graph.txt" || true
                grep -v '^$' "$work/graph.txt" | sed -n 1,600p >"${name%.txt}-graph.txt"
                rm -f "$data"
            done
        done
    fi
    stop
done
echo "load average at end: $(loadavg)" | tee -a "$out/loadavg.txt"

python3 - "$results" "$out/loadavg.txt" "$old_bin" "$new_bin" "$pairs" "$threads" "$connections" "$duration" >"$out/summary.md" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
old_bin, new_bin, pairs, threads, conns, dur = sys.argv[3:]
print("# Cache hits: new build against old\n")
print(f"Written by `bash loadtests/scripts/hit-ab.sh OLD NEW` (see its header). Old: `{old_bin}`; "
      f"new: `{new_bin}`. {pairs} A/B pairs per row of `wrk -t{threads} -c{conns} -d{dur}s`, "
      "the order alternated within pairs; a ratio is the median of the per-pair ratios new / old. "
      "The raw runs are in results.tsv.\n")
print("| access log | path | req/s new / old | pairs | req/s old / new (median) | CPU µs/req new / old | pairs | CPU µs/req old / new (median) | errors |")
print("|---|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    k = (r["log"], r["path"])
    if k not in keys:
        keys.append(k)
for log, path in keys:
    by = {}
    for r in rows:
        if (r["log"], r["path"]) == (log, path):
            by.setdefault(r["pair"], {})[r["who"]] = r
    ps = [v for v in by.values() if "old" in v and "new" in v]
    f = lambda v, who, col: float(v[who][col])
    rps = [f(v, "new", "req_per_s") / f(v, "old", "req_per_s") for v in ps]
    cpu = [f(v, "new", "cpu_us_per_req") / f(v, "old", "cpu_us_per_req") for v in ps]
    med = lambda who, col: statistics.median(f(v, who, col) for v in ps)
    errors = sum(int(v[w]["errors"]) for v in ps for w in ("old", "new"))
    if log == "on":
        logged = min(int(v[w]["log_lines"]) / int(v[w]["requests"]) for v in ps for w in ("old", "new"))
        if logged < 0.99:
            errors = f"{errors}; a run logged only {logged:.0%} of its requests"
    print(f"| {log} | {path} | {statistics.median(rps):.3f}x | {', '.join(f'{x:.3f}' for x in rps)} "
          f"| {med('old', 'req_per_s'):,.0f} / {med('new', 'req_per_s'):,.0f} "
          f"| {statistics.median(cpu):.3f}x | {', '.join(f'{x:.3f}' for x in cpu)} "
          f"| {med('old', 'cpu_us_per_req'):.2f} / {med('new', 'cpu_us_per_req'):.2f} | {errors} |")
print("\n" + "; ".join(l.strip() for l in open(sys.argv[2])))
EOF
cat "$out/summary.md"
