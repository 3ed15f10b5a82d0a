#!/usr/bin/env bash
# HTTP/3 figures, Inlay and Debian's Caddy 2.6 (quic-go) side by side on
# loopback with the same certificate (a self-signed ECDSA P-256 one made
# here): requests per second of HTTP/3 hits of 177 B and 16 KiB, full
# handshakes per second (a new QUIC connection per GET), and each server's
# CPU time per request from /proc/PID/stat. A/B pairs, the order alternated
# (A B, B A, ...); the summary is the median of the ratios within pairs.
#
# The peer: Debian's Caddy 2.6 has no cache module, so Caddy serves the same
# bytes (fetched from inlay-origin's /static/177 and /static/16384 at the
# start) with `file_server` from files (in the page cache), while Inlay
# serves them as cache hits in front of inlay-origin. Neither writes an
# access log.
#
# Usage: bash loadtests/scripts/http3-bench.sh [OUT] (after
#   cargo build --release -p inlay -p inlay-origin -p inlay-loadtools)
# Environment: PAIRS (3), DURATION (10 s measured per run), WARMUP (2 s),
#   CONNECTIONS (4), STREAMS (16 per connection), HANDSHAKERS (16 handshakes
#   at a time), LOSS (1: percent of datagrams dropped each way in the loss
#   part; 0 skips it).
#
# The loss part: this kernel has no sch_netem, so `tc netem` cannot drop
# packets; instead `inlay-h3bench relay` drops LOSS percent of the UDP
# datagrams each way between the client and Inlay's QUIC port, and an ESI
# page (10 uncacheable includes of 20 ms, `/esi/page?n=10&delay_ms=20&cacheable=0`)
# is fetched over HTTP/3 through it, one request at a time on one connection,
# against the same relay dropping none (A/B pairs). That is HTTP/3 with
# loss against HTTP/3 without; HTTP/2 over TCP has no figure here, since a
# userspace relay cannot give TCP real loss (the kernel retransmits and
# reorders below it).
# Writes OUT/results.jsonl (one line per run) and OUT/summary.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

out=${1:-$root/loadtests/reports/http3}
pairs=${PAIRS:-3}
duration=${DURATION:-10}
warmup=${WARMUP:-2}
connections=${CONNECTIONS:-4}
streams=${STREAMS:-16}
handshakers=${HANDSHAKERS:-16}
loss=${LOSS:-1}
need_bins inlay inlay-origin inlay-h3bench
need_cmds caddy openssl
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"

self_signed_cert
start_origin

# The same bytes for Caddy's file_server.
mkdir -p "$work/www/static"
for n in 177 16384; do
    curl -fsS "http://$origin/static/$n" -o "$work/www/static/$n"
    [ "$(stat -c %s "$work/www/static/$n")" = "$n" ] || { echo "origin's /static/$n is not $n bytes" >&2; exit 1; }
done

inlay_port=$(free_port)
cat >"$work/inlay.toml" <<EOF
[server]
listen = ["https://127.0.0.1:$inlay_port", "quic://127.0.0.1:$inlay_port"]
[[server.tls]]
cert = "$work/cert.pem"
key = "$work/key.pem"
[backends.default]
address = "http://$origin"
[log]
level = "info"
access_log = "off"
[cache]
memory_size = "256MiB"
EOF
INLAY_LOG=warn spawn "$bin/inlay" serve --config "$work/inlay.toml" 2>"$work/inlay.err"
inlay_pid=$spawned

caddy_port=$(free_port)
mkdir -p "$work/caddy-home"
cat >"$work/Caddyfile" <<EOF
{
    admin off
    auto_https disable_redirects
    storage file_system $work/caddy-home/data
    servers {
        protocols h1 h2 h3
    }
}
https://localhost:$caddy_port {
    bind 127.0.0.1
    tls $work/cert.pem $work/key.pem
    root * $work/www
    file_server
}
EOF
HOME=$work/caddy-home XDG_DATA_HOME=$work/caddy-home XDG_CONFIG_HOME=$work/caddy-home \
    spawn caddy run --adapter caddyfile --config "$work/Caddyfile" >"$work/caddy.log" 2>&1
caddy_pid=$spawned

wait_port "$inlay_port"
wait_port "$caddy_port"

# Both answer over HTTP/3 with the same bytes (and Inlay's second GET is a
# cache hit), or the run stops here.
for who in inlay caddy; do
    port=$inlay_port; [ "$who" = caddy ] && port=$caddy_port
    for n in 177 16384; do
        "$bin/inlay-h3bench" load --url "https://localhost:$port/static/$n" --connect "127.0.0.1:$port" \
            --ca "$work/cert.pem" --connections 1 --streams 1 --duration 1 --warmup 0 --label "check-$who" >/dev/null
    done
done
curl -fsS --cacert "$work/cert.pem" -o /dev/null -D "$work/hit.h" \
    --resolve "localhost:$inlay_port:127.0.0.1" "https://localhost:$inlay_port/static/177"
grep -qi '^age:' "$work/hit.h" || { echo "Inlay's /static/177 is not a cache hit:" >&2; cat "$work/hit.h" >&2; exit 1; }

echo "load average at start: $(loadavg)" | tee "$out/loadavg.txt"
run() { # who pair case
    local who=$1 pair=$2 case=$3 port=$inlay_port pid=$inlay_pid
    if [ "$who" = caddy ]; then port=$caddy_port; pid=$caddy_pid; fi
    local common=(--connect "127.0.0.1:$port" --ca "$work/cert.pem" --duration "$duration"
        --warmup "$warmup" --pid "$pid" --label "$who pair=$pair case=$case")
    case $case in
    177|16384)
        "$bin/inlay-h3bench" load --url "https://localhost:$port/static/$case" \
            --connections "$connections" --streams "$streams" "${common[@]}" ;;
    handshakes)
        "$bin/inlay-h3bench" handshakes --url "https://localhost:$port/static/177" \
            --concurrency "$handshakers" "${common[@]}" ;;
    esac
}
for p in $(seq "$pairs"); do
    if (( p % 2 )); then order="inlay caddy"; else order="caddy inlay"; fi
    for c in 177 16384 handshakes; do
        for who in $order; do
            run "$who" "$p" "$c" | tee -a "$results" || echo "run $who $p $c had errors" >&2
        done
    done
done

if [ "$loss" != 0 ]; then
    esi="/esi/page?n=10&delay_ms=20&cacheable=0"
    for l in 0 "$loss"; do
        spawn "$bin/inlay-h3bench" relay --to "127.0.0.1:$inlay_port" --loss "$l" >"$work/relay-$l.out"
    done
    for l in 0 "$loss"; do
        for _ in $(seq 100); do grep -q relaying "$work/relay-$l.out" && break; sleep 0.05; done
    done
    for p in $(seq "$pairs"); do
        if (( p % 2 )); then order="$loss 0"; else order="0 $loss"; fi
        for l in $order; do
            relay=$(sed -n 's/^relaying \([^ ]*\) .*/\1/p' "$work/relay-$l.out")
            "$bin/inlay-h3bench" load --url "https://localhost:$inlay_port$esi" --connect "$relay" \
                --ca "$work/cert.pem" --connections 1 --streams 1 --duration "$duration" --warmup "$warmup" \
                --label "inlay pair=$p case=esi-loss-$l" | tee -a "$results" || echo "run loss $l pair $p had errors" >&2
        done
    done
fi
echo "load average at end: $(loadavg)" | tee -a "$out/loadavg.txt"
grep -c . "$work/caddy.log" >/dev/null && grep -i '"level":"error"' "$work/caddy.log" | head -3 >&2 || true

python3 - "$results" "$out/loadavg.txt" >"$out/summary.md" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("# HTTP/3: Inlay against Caddy 2.6\n")
print("Written by `bash loadtests/scripts/http3-bench.sh` (see its header for the setup and the")
print("environment); what the figures say: docs/performance.md, section HTTP/3. Each ratio is")
print("the median of the ratios within the A/B pairs; the raw lines are in results.jsonl.\n")
by = {}
for r in runs:
    who, pair, case = (f.split("=")[-1] for f in r["label"].split())
    by.setdefault(case, {}).setdefault(int(pair), {})[who] = r
print("| measure | Inlay / Caddy (median of pairs) | pairs | Inlay | Caddy | CPU µs/req Inlay / Caddy | p99 ms Inlay / Caddy |")
print("|---|---|---|---|---|---|---|")
names = {"177": "HTTP/3 hits, 177 B: req/s", "16384": "HTTP/3 hits, 16 KiB: req/s",
         "handshakes": "full handshakes (new connection + GET 177 B) /s"}
for case in ("177", "16384", "handshakes"):
    ps = [v for _, v in sorted(by.get(case, {}).items()) if "inlay" in v and "caddy" in v]
    if not ps:
        continue
    rs = [v["inlay"]["per_second"] / max(v["caddy"]["per_second"], 1) for v in ps]
    med = lambda who, f: statistics.median(f(v[who]) for v in ps)
    cpu = lambda r: r["server_cpu_us_per_request"] or 0
    p99 = lambda r: r["latency"]["p99_us"] / 1000
    print(f"| {names[case]} | {statistics.median(rs):.2f}x | {', '.join(f'{x:.2f}' for x in rs)} "
          f"| {med('inlay', lambda r: r['per_second']):,.0f} | {med('caddy', lambda r: r['per_second']):,.0f} "
          f"| {med('inlay', cpu):.1f} / {med('caddy', cpu):.1f} "
          f"| {med('inlay', p99):.2f} / {med('caddy', p99):.2f} |")
loss = sorted(c for c in by if c.startswith("esi-loss-"))
if len(loss) == 2:
    none, lossy = sorted(loss, key=lambda c: float(c.rsplit("-", 1)[1]))
    ps = [(v[none]["inlay"], v[lossy]["inlay"]) for _, v in sorted(
        {p: {c: by[c][p] for c in (none, lossy) if p in by[c]} for p in by[none]}.items()) if len(v) == 2]
    if ps:
        print("\n| ESI page over HTTP/3, one request at a time | no loss | "
              f"{lossy.rsplit('-', 1)[1]}% loss each way | lossy / none (median of pairs) |")
        print("|---|---|---|---|")
        for q in ("p50_us", "p99_us"):
            rs = [b["latency"][q] / a["latency"][q] for a, b in ps]
            print(f"| time to last byte, {q[:3]} | {statistics.median(a['latency'][q] for a, _ in ps) / 1000:.1f} ms "
                  f"| {statistics.median(b['latency'][q] for _, b in ps) / 1000:.1f} ms "
                  f"| {statistics.median(rs):.2f}x ({', '.join(f'{x:.2f}' for x in rs)}) |")
errors = sum(r["errors"] for r in runs)
print(f"\nerrors: {errors}; " + "; ".join(l.strip() for l in open(sys.argv[2])))
EOF
cat "$out/summary.md"
echo "results: $results"
