#!/usr/bin/env bash
# Side-by-side comparison of Postbox and Mosquitto (and rumqttd when it is on PATH).
#
# Every case runs on every broker in the same invocation, alternating which broker goes first,
# `--repeats` times; each run gets a freshly started broker on a free loopback port (so peak
# memory, retained messages and sessions never leak from one run into the next). The broker is
# pinned to core 0 and the generator to core 1. Results go to <out>/results.jsonl; the
# Postbox/other ratios of the medians are printed at the end and saved to <out>/summary.txt.
#
# Installs nothing: needs `cargo build --release` done, and `mosquitto` on PATH.
# See benches/README.md for how to read the output.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: benches/compare.sh [--quick] [--repeats N] [--only CASE[,CASE...]] [--out DIR] [--no-pin]

  --quick      small counts, one repeat: a smoke test of the whole pipeline (~1 minute)
  --repeats N  runs per case and broker (default 3; medians are reported)
  --only LIST  run only these cases (names as in the table, e.g. fan-in-q1,latency-q1)
  --out DIR    where results, configs and logs go (default target/bench-compare/<time>)
  --no-pin     do not pin broker and generator to separate cores with taskset
EOF
}

REPEATS=3
QUICK=0
ONLY=""
OUT=""
PIN=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; REPEATS=1 ;;
    --repeats) REPEATS="${2:?--repeats needs a number}"; shift ;;
    --only) ONLY="${2:?--only needs a list}"; shift ;;
    --out) OUT="${2:?--out needs a directory}"; shift ;;
    --no-pin) PIN=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# Where `cargo build --release` put both binaries (honours an absolute CARGO_TARGET_DIR).
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
# POSTBOX_BIN: another postbox binary (e.g. a baseline build) in place of this tree's.
POSTBOX="${POSTBOX_BIN:-$TARGET/release/postbox}"
BENCH="$TARGET/release/postbox-bench"
for bin in "$POSTBOX" "$BENCH"; do
  [ -x "$bin" ] || { echo "missing $bin: run 'cargo build --release' first" >&2; exit 2; }
done
command -v mosquitto >/dev/null || { echo "mosquitto is not on PATH (apt-get install mosquitto)" >&2; exit 2; }

BROKERS=(postbox mosquitto)
if command -v rumqttd >/dev/null; then BROKERS+=(rumqttd); fi

OUT="${OUT:-$ROOT/target/bench-compare/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/logs"
RESULTS="$OUT/results.jsonl"

# Many-connection runs need descriptors on both sides: raise the soft limit to the hard one.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

BROKER_PIN=()
GEN_PIN=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  BROKER_PIN=(taskset -c 0)
  GEN_PIN=(taskset -c 1)
fi

# Equivalent settings for every broker: no persistence, anonymous access, 100 in-flight
# messages per client, 1,000,000 queued messages per client (Mosquitto drops QoS 0 *and* QoS 1
# beyond max_queued_messages, so both get the same high bound and loss stays comparable),
# TCP_NODELAY, quiet logs.
INFLIGHT=100
QUEUED=1000000

# case | scenario | generator arguments
if [ "$QUICK" = 1 ]; then
  CASES=(
    "fan-in-q0|fan-in|--qos 0 --publishers 4 --messages 5000"
    "fan-in-q1|fan-in|--qos 1 --publishers 4 --messages 5000"
    "fan-out-q0|fan-out|--qos 0 --subscribers 20 --messages 1000"
    "fan-out-q1|fan-out|--qos 1 --subscribers 20 --messages 1000"
    "p2p-q1|p2p|--qos 1 --pairs 10 --messages 1000"
    "latency-q1|latency|--qos 1 --pairs 4 --rate 2000 --messages 500"
    "connections|connections|--connections 1000"
    "retained|retained|--retained 5000"
    "durable-q1|durable|--qos 1 --publishers 2 --subscribers 2 --messages 2000"
  )
else
  # Sized so a Mosquitto run takes roughly 4-10 s and a Postbox run ~0.3-2 s on a 2-core
  # machine: the whole comparison stays under ~6 minutes with 3 repeats.
  CASES=(
    "fan-in-q0|fan-in|--qos 0 --publishers 100 --messages 12000"
    "fan-in-q1|fan-in|--qos 1 --publishers 100 --messages 4000"
    "fan-out-q0|fan-out|--qos 0 --subscribers 100 --messages 10000"
    "fan-out-q1|fan-out|--qos 1 --subscribers 100 --messages 15000"
    "p2p-q1|p2p|--qos 1 --pairs 500 --messages 1000"
    "latency-q1|latency|--qos 1 --pairs 10 --rate 10000 --messages 5000"
    "latency-q1-20k|latency|--qos 1 --pairs 10 --rate 20000 --messages 10000"
    "connections|connections|--connections 10000"
    "retained|retained|--retained 100000"
    "durable-q1|durable|--qos 1 --publishers 4 --subscribers 4 --messages 20000"
  )
fi

write_config() { # broker port -> path of its config file
  local broker=$1 port=$2 file storage
  case "$broker" in
    postbox | postbox-durable)
      file="$OUT/$broker.toml"
      if [ "$broker" = postbox-durable ]; then
        # Durable: every QoS 1 PUBLISH is acknowledged after its group commit is fsynced.
        storage="persistence = true
dir = \"$OUT/data/postbox-$port\"
fsync = \"every-batch\""
      else
        storage="persistence = false"
      fi
      cat >"$file" <<EOF
[listener]
bind = "127.0.0.1:$port"
max_connections = 0
[metrics]
# On, as in production: Postbox pays for its metrics like Mosquitto pays for \$SYS.
enabled = true
bind = "127.0.0.1:$("$BENCH" free-port)"
[mqtt]
max_inflight_messages = $INFLIGHT
max_queued_messages = $QUEUED
max_queued_bytes = 0
queue_qos0_messages = false
[storage]
$storage
[log]
level = "warn"
EOF
      ;;
    mosquitto | mosquitto-persist)
      file="$OUT/$broker.conf"
      if [ "$broker" = mosquitto-persist ]; then
        # Mosquitto's persistence: a snapshot every autosave_interval (default 1800 s), so an
        # acknowledged message is only safe once the next save has run.
        mkdir -p "$OUT/data/mosquitto-$port"
        storage="persistence true
persistence_location $OUT/data/mosquitto-$port/"
      else
        storage="persistence false"
      fi
      cat >"$file" <<EOF
listener $port 127.0.0.1
allow_anonymous true
$storage
max_inflight_messages $INFLIGHT
max_queued_messages $QUEUED
max_queued_bytes 0
queue_qos0_messages false
max_connections -1
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
connection_messages false
EOF
      ;;
    rumqttd)
      file="$OUT/rumqttd.toml"
      cat >"$file" <<EOF
id = 0
[router]
id = 0
max_connections = 100010
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10
[v4.1]
name = "v4-1"
listen = "127.0.0.1:$port"
next_connection_delay_ms = 0
[v4.1.connections]
connection_timeout_ms = 60000
max_payload_size = 20480
max_inflight_count = $INFLIGHT
dynamic_filters = true
EOF
      ;;
  esac
  echo "$file"
}

BROKER_PID=""
start_broker() { # broker port log
  local broker=$1 port=$2 log=$3 conf
  conf="$(write_config "$broker" "$port")"
  case "$broker" in
    postbox | postbox-durable) "${BROKER_PIN[@]}" "$POSTBOX" -c "$conf" >"$log" 2>&1 & ;;
    mosquitto | mosquitto-persist) "${BROKER_PIN[@]}" mosquitto -c "$conf" >"$log" 2>&1 & ;;
    rumqttd) "${BROKER_PIN[@]}" rumqttd -c "$conf" >"$log" 2>&1 & ;;
  esac
  BROKER_PID=$!
  if ! "$BENCH" wait-port "127.0.0.1:$port" --timeout 10; then
    echo "  $broker did not start; see $log" >&2
    stop_broker
    return 1
  fi
}

stop_broker() {
  [ -n "$BROKER_PID" ] || return 0
  kill -TERM "$BROKER_PID" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$BROKER_PID" 2>/dev/null || true
  wait "$BROKER_PID" 2>/dev/null || true
  BROKER_PID=""
}
trap stop_broker EXIT INT TERM

selected() { # case
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}

echo "comparing: ${BROKERS[*]}; repeats: $REPEATS; results: $RESULTS"
[ ${#BROKER_PIN[@]} -gt 0 ] && echo "pinning: broker on core 0, generator on core 1"
FAILED=0
START=$(date +%s)
for spec in "${CASES[@]}"; do
  IFS='|' read -r case scenario args <<<"$spec"
  selected "$case" || continue
  brokers=("${BROKERS[@]}")
  if [ "$scenario" = durable ]; then
    # Durability on and off, both brokers: the cost of the promise, and Mosquitto's.
    brokers+=(postbox-durable mosquitto-persist)
  fi
  for rep in $(seq "$REPEATS"); do
    order=("${brokers[@]}")
    if [ $((rep % 2)) = 0 ]; then # alternate who goes first
      order=()
      for ((i = ${#brokers[@]} - 1; i >= 0; i--)); do order+=("${brokers[$i]}"); done
    fi
    for broker in "${order[@]}"; do
      port="$("$BENCH" free-port)"
      log="$OUT/logs/$case-$broker-$rep"
      start_broker "$broker" "$port" "$log.broker.log" || { FAILED=$((FAILED + 1)); continue; }
      # shellcheck disable=SC2086 # $args is a list of flags
      if "${GEN_PIN[@]}" "$BENCH" run "$scenario" --host "127.0.0.1:$port" --broker "$broker" \
        --broker-pid "$BROKER_PID" --case "$case" --json "$RESULTS" --timeout 60 $args \
        >"$log.txt" 2>&1; then
        status=ok
      else
        status="FAILED (exit $?)"
        FAILED=$((FAILED + 1))
      fi
      rate=$(grep -E '^ +(delivered|connect rate) \|' "$log.txt" | tail -1 | sed 's/.*| //')
      printf '%-12s %-10s #%s  %-8s %s\n' "$case" "$broker" "$rep" "$status" "$rate"
      stop_broker
    done
  done
done
echo
echo "took $(($(date +%s) - START)) s; $FAILED failed run(s); logs in $OUT/logs"
echo
"$BENCH" summarize "$RESULTS" | tee "$OUT/summary.txt"
[ "$FAILED" = 0 ]
