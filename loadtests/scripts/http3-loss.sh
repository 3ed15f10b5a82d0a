#!/usr/bin/env bash
# An ESI page's time to last byte under packet loss, HTTP/3 against HTTP/2
# over TLS, in a network namespace of its own. This kernel has no
# sch_netem, so the loss comes from nftables: `numgen random` drops LOSS
# percent of the client leg's packets (to and from Inlay's port, TCP and
# UDP alike, each way) at the IP layer, where TCP sees real loss; the
# Inlay-to-origin leg is left lossless so that both protocols fetch the
# includes the same way. One request at a time on one connection: HTTP/2
# with curl (one connection reused for REQUESTS requests), HTTP/3 with
# inlay-h3bench (DURATION seconds). PAIRS rounds, each without loss and
# with it.
#
# Usage: unshare -n bash loadtests/scripts/http3-loss.sh [OUT] (as root,
#   after cargo build --release -p inlay -p inlay-origin -p inlay-loadtools;
#   needs nftables, curl with HTTP/2, openssl)
# Environment: LOSS (1), PAIRS (3), REQUESTS (300), DURATION (8).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

out=${1:-$root/loadtests/reports/http3}
loss=${LOSS:-1}
pairs=${PAIRS:-3}
requests=${REQUESTS:-300}
duration=${DURATION:-8}
need_bins inlay inlay-origin inlay-h3bench
need_cmds nft curl openssl
if ip -o link show | grep -qv ': lo:'; then
    echo "run this in a network namespace of its own: unshare -n bash $0" >&2
    exit 1
fi
ip link set lo up
mkdir -p "$out"
# Defined only here, past the check: the host's own ruleset is never flushed.
on_exit() { nft flush ruleset 2>/dev/null; }
self_signed_cert
start_origin
port=18443
spawn "$bin/inlay" serve -a "https://127.0.0.1:$port" -a "quic://127.0.0.1:$port" \
    --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" -b "http://$origin" \
    >"$work/inlay.log" 2>&1
url="https://localhost:$port/esi/page?n=10&delay_ms=20&cacheable=0"
for _ in $(seq 100); do
    curl -s -o /dev/null --cacert "$work/cert.pem" --resolve "localhost:$port:127.0.0.1" "$url" && break
    sleep 0.1
done

set_loss() {
    nft flush ruleset
    [ "$1" = 0 ] && return
    nft add table inet loss
    nft add chain inet loss in '{ type filter hook input priority 0; }'
    for dir in dport sport; do
        nft add rule inet loss in th "$dir" "$port" numgen random mod 100 '<' "$1" drop
    done
}
# p50 and p99 in ms of REQUESTS requests on one HTTP/2 connection.
h2() {
    local args=()
    for _ in $(seq "$requests"); do args+=(-o /dev/null "$url"); done
    curl --http2 -s --cacert "$work/cert.pem" --resolve "localhost:$port:127.0.0.1" \
        -w '%{time_total}\n' "${args[@]}" | sort -n |
        awk '{a[NR]=$1} END {printf "%.1f %.1f %d\n", a[int(NR*0.5)]*1000, a[int(NR*0.99)]*1000, NR}'
}
h3() {
    "$bin/inlay-h3bench" load --url "$url" --connect "127.0.0.1:$port" --ca "$work/cert.pem" \
        --connections 1 --streams 1 --duration "$duration" --warmup 1 |
        python3 -c 'import json,sys; l=json.load(sys.stdin)["latency"]; print("%.1f %.1f %d" % (l["p50_us"]/1000, l["p99_us"]/1000, l["count"]))'
}
results=$out/loss.txt
{
    echo "# ESI page (10 uncacheable includes of 20 ms), one request at a time; $loss% of the client leg's packets dropped each way (nftables numgen)"
    echo "# pair loss protocol p50_ms p99_ms requests"
} >"$results"
for p in $(seq "$pairs"); do
    for l in 0 "$loss"; do
        set_loss "$l"
        echo "$p $l http/2 $(h2)" | tee -a "$results"
        echo "$p $l http/3 $(h3)" | tee -a "$results"
    done
done
echo "# load average at end: $(loadavg)" | tee -a "$results"
