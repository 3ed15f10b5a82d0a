#!/usr/bin/env bash
# `make cluster-demo`: nats-server with JetStream, the demo origin, and three
# inlay nodes in one cluster on loopback. Ctrl-C stops them all.
#
#   cluster-demo.sh [BIN_DIR]       (BIN_DIR holds inlay and inlay-origin;
#                                    target/policies holds default.wasm and
#                                    headers.wasm)
#
# Ports: NATS 127.0.0.1:4322, origin 127.0.0.1:8090, nodes 127.0.0.1:6181-6183
# (admin API 127.0.0.1:6191-6193). Files under /tmp/inlay-cluster-demo/.
set -euo pipefail
bin="${1:-target/demo}"
cd "$(dirname "$0")/../.."
nats_bin="$(command -v nats-server || echo /usr/sbin/nats-server)"
for exe in "$bin/inlay" "$bin/inlay-origin" "$nats_bin" target/policies/default.wasm target/policies/headers.wasm; do
  [ -f "$exe" ] || { echo "cluster-demo: $exe is missing (make cluster-demo builds or installs it)" >&2; exit 1; }
done
nats_port=4322; origin=127.0.0.1:8090
for port in $nats_port 8090 6181 6182 6183 6191 6192 6193; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "cluster-demo: 127.0.0.1:$port is already in use; stop what runs there" >&2
    exit 1
  fi
done

dir=/tmp/inlay-cluster-demo
rm -rf "$dir" && mkdir -p "$dir"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM

"$nats_bin" -js -a 127.0.0.1 -p $nats_port -sd "$dir/nats" > "$dir/nats.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "Server is ready" "$dir/nats.log" 2>/dev/null && break; sleep 0.1; done

"$bin/inlay-origin" --listen "$origin" > "$dir/origin.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q listening "$dir/origin.log" 2>/dev/null && break; sleep 0.1; done

for n in 1 2 3; do
  cat > "$dir/node$n.toml" <<TOML
[server]
listen = ["127.0.0.1:618$n"]

[backends.default]
address = "http://$origin"

[cache]
dir = "$dir/cache$n"

[admin]
listen = "127.0.0.1:619$n"

[policy]
path = "$PWD/target/policies/default.wasm"

[log]
access_log = "$dir/access$n.log"

[cluster]
nats_urls = ["nats://127.0.0.1:$nats_port"]
node_name = "node$n"
shard = true
TOML
  "$bin/inlay" serve --config "$dir/node$n.toml" > "$dir/node$n.log" 2>&1 &
  pids+=($!)
done
for n in 1 2 3; do
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:618$n/resp" 2>/dev/null && break
    sleep 0.1
  done
done

cat <<MSG

  Three inlay nodes in one cluster, on NATS at nats://127.0.0.1:$nats_port:
    node1 http://127.0.0.1:6181/   node2 http://127.0.0.1:6182/   node3 http://127.0.0.1:6183/
  in front of the demo origin at http://$origin/. Configs, logs and caches in $dir/.

  Try (the nodes stand for one site, so give them one Host):
    H='Host: www.example.test'; get() { curl -s -H "\$H" -o /dev/null -D - "http://127.0.0.1:\$1\$2" | grep -i -E "cache-status|x-inlay-policy"; }
    for n in 1 2 3; do get 618\$n /static/4096; done     # sharded: one node fetches from the origin ...
    curl -s "http://$origin/__count?path=/static/4096"; echo  # ... and the origin saw 1 fetch, not 3
    curl -s -H "\$H" -X PURGE http://127.0.0.1:6181/static/4096 -o /dev/null -w "%{http_code}\\n"
    for n in 1 2 3; do get 618\$n /static/4096; done     # purged on node1: gone on every node
    $bin/inlay admin --config $dir/node2.toml ban 'req.url ~ ^/static/'
                                                     # a ban on node2 applies on all three
    $bin/inlay admin --config $dir/node1.toml policy push target/policies/headers.wasm
    for n in 1 2 3; do get 618\$n /dynamic; done         # every node now runs it (x-inlay-policy)
    $bin/inlay admin --config $dir/node3.toml policy rollback
    $bin/inlay admin --config $dir/node3.toml policy status
    tail -f $dir/node*.log                           # joins, purges applied, versions, members

  Stop a node (kill it), purge on another, start it again with
    $bin/inlay serve --config $dir/node3.toml
  and it replays the purges it missed before it serves from its disk.
  Ctrl-C stops everything.

MSG
wait "${pids[@]}"
