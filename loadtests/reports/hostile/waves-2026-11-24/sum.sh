#!/bin/bash
for f in $(ls -tr /tmp/h26/*-1[0-9]-*.log /tmp/h26/*-[0-9]-1[0-9][0-9][0-9].log 2>/dev/null | sort -u -t/ -k4); do
 printf "%-28s fresh %-10s ka %-8s q/a %-22s ovf %-6s %s\n" "$(basename $f .log)" "$(grep -h 'fresh connection p50' $f | sed 's/.*p99 ratio \([0-9.x]*\).*/\1/')" "$(grep -h 'keep-alive p50' $f | sed 's/.*p99 ratio \([0-9.x]*\).*/\1/')" "$(grep -h 'fresh connection p50' $f | sed 's/.*quiet [0-9.]*\/\([0-9.]*\)\/.*attack [0-9.]*\/\([0-9.]*\)\/.*/\1->\2/')" "$(grep ListenOverflows $f | awk '{print $2}')" "$(grep -h '^load' $f | cut -d' ' -f2)"
done
