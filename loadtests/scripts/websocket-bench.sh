#!/usr/bin/env bash
# WebSocket figures, Inlay and Debian's nginx side by side in front of the
# same echo (inlay-origin's /ws): echo round trips (p50, p99) in rounds that
# alternate which proxy goes first, then idle tunnels held open with the
# resident memory each costs the proxy. Writes JSON lines to OUT/results.jsonl;
# loadtests/reports/websocket.md reads them.
#
# Usage: bash loadtests/scripts/websocket-bench.sh [OUT] (after
#   cargo build --release -p inlay -p inlay-origin -p inlay-loadtools)
# Environment: ROUNDS (3), CONNECTIONS (50), MESSAGES (400), SIZE (64),
#   TUNNELS (9500: each tunnel costs a proxy two descriptors, and the
#   sandbox's hard RLIMIT_NOFILE is 20000), HOLD (10 s).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

out=${1:-$root/loadtests/reports/websocket}
rounds=${ROUNDS:-3}
connections=${CONNECTIONS:-50}
messages=${MESSAGES:-400}
size=${SIZE:-64}
tunnels=${TUNNELS:-9500}
hold=${HOLD:-10}
need_bins inlay inlay-origin inlay-wsbench
need_cmds nginx
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"
ulimit -n "$(ulimit -Hn)"

start_origin

inlay_port=$(free_port)
cat >"$work/inlay.toml" <<EOF
[server]
listen = ["127.0.0.1:$inlay_port"]
max_connections = 19000
max_connections_per_client = 0
[backends.default]
address = "http://$origin"
[log]
access_log = "$work/inlay-access.log"
[websocket]
max_tunnels = 19000
EOF
INLAY_LOG=warn spawn "$bin/inlay" serve --config "$work/inlay.toml" 2>"$work/inlay.err"
inlay_pid=$spawned

nginx_port=$(free_port)
mkdir -p "$work/nginx"
cat >"$work/nginx.conf" <<EOF
worker_processes auto;
worker_rlimit_nofile 20000;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 19000; }
http {
    access_log $work/nginx/access.log;
    client_body_temp_path $work/nginx;
    proxy_temp_path $work/nginx;
    map \$http_upgrade \$connection_upgrade { default upgrade; '' close; }
    upstream origin { server $origin; keepalive 64; }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection \$connection_upgrade;
            proxy_read_timeout 300s;
        }
    }
}
EOF
spawn nginx -p "$work/nginx" -c "$work/nginx.conf" -g 'daemon off;'
nginx_pid=$spawned

wait_port "$inlay_port"
wait_port "$nginx_port"

rtt() {
    "$bin/inlay-wsbench" rtt --url "ws://127.0.0.1:$2/ws" --connections "$3" \
        --messages "$messages" --size "$size" --label "$1" | tee -a "$results"
}
for r in $(seq "$rounds"); do
    # Which proxy goes first alternates (A B, B A, ...), so a drift of the
    # machine's load does not favour one.
    if (( r % 2 )); then order="inlay nginx"; else order="nginx inlay"; fi
    for who in $order; do
        port=$inlay_port; [ "$who" = nginx ] && port=$nginx_port
        rtt "$who" "$port" "$connections"
        rtt "$who-1conn" "$port" 1
    done
done

nginx_pids=$(pgrep -d' ' -P "$nginx_pid"; echo "$nginx_pid")
# shellcheck disable=SC2086
for who in inlay nginx; do
    if [ "$who" = inlay ]; then port=$inlay_port; p=(--pid "$inlay_pid");
    else port=$nginx_port; p=(); for n in $nginx_pids; do p+=(--pid "$n"); done; fi
    "$bin/inlay-wsbench" idle --url "ws://127.0.0.1:$port/ws" --tunnels "$tunnels" \
        --hold "$hold" "${p[@]}" --label "$who" | tee -a "$results"
    sleep 2
done
echo "results: $results"
