#!/bin/bash
# usage: ab.sh N variant...   variant = BINDIR[+b128|+t12k|+noreset|+onlyreset|+noh2]
cd /work/split
n=$1; shift
for i in $(seq $n); do
  for v in "$@"; do
    name=$v-$i-$(date +%H%M)
    bin=${v%%+*}
    toml=
    extra=()
    b=$(echo "$v" | sed -n 's/.*+b\([0-9]*\).*/\1/p')
    [ -n "$b" ] && toml="listen_backlog = $b"
    case $v in *+t10k*) toml="$toml
tarpit_max = 10000";; esac
    d=$(echo "$v" | sed -n 's/.*+d\([0-9]*\).*/\1/p')
    [ -n "$d" ] && toml="$toml
defer_accept = \"${d}s\""
    case $v in *+i14k*) extra=(--idle 14000);; esac
    case $v in *+noreset*) extra=(--reset-conns 0);; esac
    case $v in *+onlyreset*) extra=(--idle 0 --slowloris 0 --slow-readers 0 --h2-zero-window 0 --garbage-per-sec 0);; esac
    case $v in *+noh2*) extra=(--reset-conns 0 --h2-zero-window 0);; esac
    case $v in *+noconn*) extra=(--idle 0 --slowloris 0 --garbage-per-sec 0);; esac
    nstat -n >/dev/null 2>&1
    pin=(--attack-cpu 1 --client-cpu 0); cpus=0
    case $v in *+nopin*) pin=(); cpus=;; esac
    HOSTILE_NOFILE=20000 HOSTILE_SERVER_TOML="$toml" BIN=/tmp/h26/bin-$bin OUT=/tmp/h26/out-$name INLAY_CPUS=$cpus bash loadtests/scripts/hostile.sh "${pin[@]}" "${extra[@]}" > /tmp/h26/$name.log 2>&1
    echo "load: $(cat /proc/loadavg)" >> /tmp/h26/$name.log
    nstat 2>/dev/null | grep -E "ListenOverflows|ListenDrops|SyncookiesSent|SyncookiesRecv|TCPReqQFullDoCookies|TCPReqQFullDrop|TCPTimeouts|TCPBacklogDrop" >> /tmp/h26/$name.log
  done
done
