# The set-up the load scripts share; source it after `set -euo pipefail`:
#   . "$(dirname "$0")/lib.sh"
# It sets `root` (the checkout), `bin` (its target/release), `work` (a
# directory removed at exit) and `pids` (processes killed at exit: add
# yours with `spawn`). A script that has more to undo at exit defines
# `on_exit`, which runs first.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$root/target/release
work=$(mktemp -d)
pids=()

_lib_cleanup() {
    if [ "$(type -t on_exit)" = function ]; then on_exit || true; fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap _lib_cleanup EXIT

# need_bins NAME...: each of target/release's NAMEs is built, or exit.
need_bins() {
    local b
    for b in "$@"; do
        [ -x "$bin/$b" ] || { echo "missing $bin/$b: cargo build --release -p inlay -p inlay-origin -p inlay-loadtools" >&2; exit 1; }
    done
}

# need_cmds NAME...: each command is on PATH, or exit.
need_cmds() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null || { echo "$c is missing (apt-get install it)" >&2; exit 1; }
    done
}

# spawn CMD [ARG...]: runs CMD in the background (redirect the call to
# redirect it) and kills it at exit; its pid is left in `spawned`.
spawn() {
    "$@" &
    spawned=$!
    pids+=("$spawned")
}

# free_port: a loopback port free for both TCP and UDP (a server may
# listen on both, as Inlay's https:// and quic:// listeners do).
free_port() {
    python3 -c '
import socket
while True:
    t = socket.socket(); t.bind(("127.0.0.1", 0)); p = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass
    finally:
        u.close(); t.close()'
}

# wait_port PORT: until 127.0.0.1:PORT accepts a TCP connection (10 s at
# the most), or exit.
wait_port() {
    local _
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    exit 1
}

# self_signed_cert: a self-signed ECDSA P-256 certificate for localhost
# and 127.0.0.1, in $work/cert.pem and its key in $work/key.pem.
self_signed_cert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
        -addext basicConstraints=critical,CA:FALSE \
        -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
}

# start_origin [BINARY]: inlay-origin on a loopback port of its own; its
# address (host:port) is left in `origin`, its pid in `origin_pid`.
start_origin() {
    spawn "${1:-$bin/inlay-origin}" --listen 127.0.0.1:0 >"$work/origin.out"
    origin_pid=$spawned
    local _
    for _ in $(seq 100); do grep -q listening "$work/origin.out" && break; sleep 0.05; done
    origin=$(sed -n 's/^listening on http:\/\///p' "$work/origin.out")
    [ -n "$origin" ] || { echo "inlay-origin did not say where it listens" >&2; exit 1; }
}

# loadavg: the 1, 5 and 15 minute load averages.
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
