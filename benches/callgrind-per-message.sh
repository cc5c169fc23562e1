#!/usr/bin/env bash
# Instructions the broker executes for a fixed workload, counted by callgrind: repeatable
# (about 1% between runs) where seconds on a shared 2-core machine drift by 25%. Compare two
# binaries with the same arguments; divide the totals by the messages (200,000).
# With ACL_FILE=path (e.g. written by benches/write-acl.sh), the broker runs with that acl_file.
# With METRICS=on the metrics endpoint is on, as in the default config (the counters are
# counted either way since the per-broker registry; before it, `enabled = false` made them
# no-ops, so compare such builds with METRICS=on).
# With EXTRA_CONF=text it is appended to the broker's config (e.g. a [[schema]] or [dedup]), and
# BENCH_ARGS=words are added to the generator's arguments (e.g. --protocol 5 --payload-file ...).
# usage: BENCH=target/release/postbox-bench [OUT=dir] [ACL_FILE=path] benches/callgrind-per-message.sh BINARY LABEL SCENARIO QOS
#   SCENARIO: p2p | fan-in | fan-out;  QOS: 0 | 1 | 2
# Prints the generator's delivery line and callgrind's instruction total.
set -euo pipefail
bin=$1 label=$2 scen=$3 qos=$4
port=$("${BENCH:?set BENCH to a postbox-bench binary}" free-port)
metrics_port=$("${BENCH:?set BENCH to a postbox-bench binary}" free-port)
METRICS_ENABLED=$([ "${METRICS:-off}" = on ] && echo true || echo false)
conf="${OUT:-/tmp}"/$label-$scen-q$qos.toml
cat > "$conf" <<EOC
[listener]
bind = "127.0.0.1:$port"
[metrics]
enabled = ${METRICS_ENABLED}
bind = "127.0.0.1:$metrics_port"
[mqtt]
max_queued_messages = 1000000
max_inflight_messages = 100
EOC
if [ -n "${EXTRA_CONF:-}" ]; then printf '%s\n' "$EXTRA_CONF" >>"$conf"; fi
if [ -n "${ACL_FILE:-}" ]; then printf '[auth]\nacl_file = "%s"\n' "$ACL_FILE" >>"$conf"; fi
out="${OUT:-/tmp}"/$label-$scen-q$qos.out
valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" -c "$conf" > "${OUT:-/tmp}"/$label-$scen-q$qos.log 2>&1 &
pid=$!
"${BENCH:?set BENCH to a postbox-bench binary}" wait-port 127.0.0.1:$port --timeout 60
case $scen in
  p2p) args="--pairs 10 --messages 20000" ;;
  fan-in) args="--publishers 10 --messages 20000" ;;
  fan-out) args="--subscribers 10 --messages 20000" ;;
esac
"${BENCH:?set BENCH to a postbox-bench binary}" run $scen --host 127.0.0.1:$port --qos $qos $args ${BENCH_ARGS:-} --timeout 300 --idle 20 > "${OUT:-/tmp}"/$label-$scen-q$qos.bench 2>&1 || true
kill -TERM $pid; wait $pid || true
grep delivered "${OUT:-/tmp}"/$label-$scen-q$qos.bench
grep -h "^summary\|^totals" "$out" | head -2
