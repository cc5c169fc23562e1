#!/usr/bin/env bash
# Side-by-side comparison of Postbox and Mosquitto (and rumqttd when it is on PATH).
#
# Every case runs on every broker in the same invocation, alternating which broker goes first,
# `--repeats` times; each run gets a freshly started broker on a free loopback port (so peak
# memory, retained messages and sessions never leak from one run into the next). The broker is
# pinned to core 0 and the generator to core 1. Results go to <out>/results.jsonl; the
# Postbox/other ratios of the medians are printed at the end and saved to <out>/summary.txt.
#
# Two sets of cases: the tuned set (every broker with the same generous limits, so the
# figures compare the brokers' engines) and the defaults set (`defaults-*`: every broker on
# its own defaults, bursts that overrun default queues, loss shown as a figure; issue 12).
#
# Installs nothing: needs `cargo build --release` done, and `mosquitto` on PATH.
# See benches/README.md for how to read the output.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: benches/compare.sh [--quick] [--repeats N] [--only CASE[,CASE...]] [--out DIR] [--no-pin] [--acl]

  --quick      small counts, one repeat: a smoke test of the whole pipeline (~1 minute)
  --repeats N  runs per case and broker (default 3; medians are reported)
  --only LIST  run only these cases (names as in the table, e.g. fan-in-q1,latency-q1);
               `defaults` selects every defaults-* case (each broker on its own defaults),
               `tuned` every other case; e.g. --only defaults or --only tuned,defaults-p2p-q1
  --out DIR    where results, configs and logs go (default target/bench-compare/<time>)
  --no-pin     do not pin broker and generator to separate cores with taskset
  --acl        the cost of authorisation: run Postbox without an ACL and `postbox-acl` (the
               same config plus a generated 10,000-rule ACL that grants the bench topics)
               only, alternating, instead of the other brokers
EOF
}

REPEATS=3
QUICK=0
ONLY=""
OUT=""
PIN=1
ACL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; REPEATS=1 ;;
    --repeats) REPEATS="${2:?--repeats needs a number}"; shift ;;
    --only) ONLY="${2:?--only needs a list}"; shift ;;
    --out) OUT="${2:?--out needs a directory}"; shift ;;
    --no-pin) PIN=0 ;;
    --acl) ACL=1 ;;
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
# The defaults set runs Postbox and Mosquitto only. rumqttd has no defaults that can be run
# simply: it has no port flag and its config keys have no built-in defaults, so every run
# needs a whole config file; the example it ships (rumqttd.toml) binds fixed ports (1883,
# 1884, 8083, console 3030, prometheus 9042), which clash with a free port per run. A copy of
# that file with only the ports changed would be its nearest "defaults"; not done here.
DEFAULTS_BROKERS=(postbox mosquitto)
if [ "$ACL" = 1 ]; then
  BROKERS=(postbox postbox-acl)
fi

OUT="${OUT:-$ROOT/target/bench-compare/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/logs"
RESULTS="$OUT/results.jsonl"

# The ACL of `postbox-acl`: benches/write-acl.sh (10,000 rules; ACL_PARTIAL=1 for a partial grant).
write_acl() { "$ROOT/benches/write-acl.sh" "$1"; }
if [ "$ACL" = 1 ]; then
  write_acl "$OUT/acl"
fi

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
    # Defaults set, smoke sizes: the tuned quick shapes (4 publishers, 20 subscribers) so the
    # defaults/tuned ratio is printed, with enough messages per subscriber to overrun
    # Mosquitto's default queue of 1000.
    "defaults-fan-in-q0|fan-in|--qos 0 --publishers 4 --messages 5000"
    "defaults-fan-in-q1|fan-in|--qos 1 --publishers 4 --messages 5000"
    "defaults-fan-out-q0|fan-out|--qos 0 --subscribers 20 --messages 5000"
    "defaults-fan-out-q1|fan-out|--qos 1 --subscribers 20 --messages 5000"
    "defaults-p2p-q0|p2p|--qos 0 --pairs 1 --messages 20000"
    "defaults-p2p-q1|p2p|--qos 1 --pairs 1 --messages 20000"
    "tls-handshakes|handshakes|--connections 500 --connect-concurrency 32"
    "tls-fan-in-q1|fan-in|--qos 1 --publishers 4 --messages 5000"
    "tls-fan-out-q0|fan-out|--qos 0 --subscribers 20 --messages 1000"
    "tls-idle|connections|--connections 500"
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
    # Defaults set (issue 12): each broker on its own defaults (see start_defaults_broker),
    # unthrottled publishers. Fan-in and fan-out have the tuned cases' shapes *and* message
    # counts, so "defaults / tuned" in the summary isolates the settings; every subscriber
    # gets 10,000 to 1,200,000 messages against a default queue of 1,000 (Mosquitto's and
    # Postbox's; max_inflight 20 for Mosquitto, 100 for Postbox). p2p is one unthrottled pair: the tuned set has 500
    # pairs of 1,000 messages, which never overrun a queue of 1,000, so it has no tuned
    # counterpart.
    "defaults-fan-in-q0|fan-in|--qos 0 --publishers 100 --messages 12000"
    "defaults-fan-in-q1|fan-in|--qos 1 --publishers 100 --messages 4000"
    "defaults-fan-out-q0|fan-out|--qos 0 --subscribers 100 --messages 10000"
    "defaults-fan-out-q1|fan-out|--qos 1 --subscribers 100 --messages 15000"
    "defaults-p2p-q0|p2p|--qos 0 --pairs 1 --messages 300000"
    "defaults-p2p-q1|p2p|--qos 1 --pairs 1 --messages 300000"
    # TLS set (issue 13): `tls-*` cases run on a TLS listener with the same certfile / keyfile
    # (and, for Mosquitto, cafile; client certificates are not requested by either) from
    # certs/, and the generator speaks TLS trusting certs/ca.pem, full handshakes only (no
    # resumption). tls-fan-in-q1 has fan-in-q1's shape and counts, so TLS's cost reads
    # against the plain case; tls-fan-out-q0 is fan-out-q0's, where output dominates (rustls's
    # send buffer, issue 35 I2); tls-idle is `connections` at 5,000 TLS clients.
    "tls-handshakes|handshakes|--connections 5000 --connect-concurrency 64"
    "tls-fan-in-q1|fan-in|--qos 1 --publishers 100 --messages 4000"
    "tls-fan-out-q0|fan-out|--qos 0 --subscribers 100 --messages 10000"
    "tls-idle|connections|--connections 5000"
  )
fi

# The TLS listener's files (tls-* cases): the development certificates (ECDSA P-256 server
# certificate for localhost / 127.0.0.1, signed by certs/ca.pem).
CERTS="$ROOT/certs"
CASE_TLS=0 # set per case: 1 for tls-* cases
write_config() { # broker port -> path of its config file
  local broker=$1 port=$2 file storage
  case "$broker" in
    postbox-acl)
      file="$OUT/$broker.toml"
      cp "$(write_config postbox "$port")" "$file"
      printf '[auth]\nacl_file = "%s"\n' "$OUT/acl" >>"$file"
      ;;
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
      if [ "$CASE_TLS" = 1 ]; then
        cat >>"$file" <<EOF
[listener.tls]
cert = "$CERTS/server.pem"
key = "$CERTS/server.key"
EOF
        # `kind` belongs to the [listener] table, before its first subtable.
        sed -i 's/^max_connections = 0$/max_connections = 0\nkind = "tls"/' "$file"
      fi
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
      if [ "$CASE_TLS" = 1 ]; then
        # Applies to the listener above (the only one).
        cat >>"$file" <<EOF
certfile $CERTS/server.pem
keyfile $CERTS/server.key
cafile $CERTS/ca.pem
EOF
      fi
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

# Each broker on its own defaults, with only what a free port per run needs.
#  - Postbox: no config file, so the embedded default config (config/postbox.toml) applies:
#    persistence on with fsync after every group commit, 100 in-flight and 1,000 queued
#    messages per client (publishers paused beyond that), drop-new on overflow, log level info. `-p` sets the port;
#    `--metrics-port 0` turns the metrics endpoint off, because its default port (9883) is
#    fixed and would clash between runs and with other brokers on the machine; `--data-dir`
#    is a fresh directory per run, so no run recovers another's store.
#  - Mosquitto: a config holding only the listener line and `allow_anonymous true` (Mosquitto 2
#    refuses anonymous clients once a listener is configured, and the generator sends no
#    credentials); everything else is Mosquitto's default: max_inflight_messages 20,
#    max_queued_messages 1000, no persistence, connection messages logged.
POSTBOX_DATA=""
# Launches the broker in the background (BROKER_PID); start_broker waits for its port.
start_defaults_broker() { # broker port log
  local broker=$1 port=$2 log=$3 conf
  case "$broker" in
    postbox)
      mkdir -p "$OUT/data"
      POSTBOX_DATA="$(mktemp -d "$OUT/data/postbox-defaults-$port.XXXXXX")"
      "${BROKER_PIN[@]}" "$POSTBOX" -p "$port" --metrics-port 0 --data-dir "$POSTBOX_DATA" \
        >"$log" 2>&1 &
      ;;
    mosquitto)
      conf="$OUT/mosquitto-defaults.conf"
      cat >"$conf" <<EOF
listener $port 127.0.0.1
allow_anonymous true
EOF
      "${BROKER_PIN[@]}" mosquitto -c "$conf" >"$log" 2>&1 &
      ;;
    *)
      echo "  no defaults run for $broker" >&2
      return 1
      ;;
  esac
  BROKER_PID=$!
}

BROKER_PID=""
start_broker() { # broker port log [settings]
  local broker=$1 port=$2 log=$3 settings=${4:-tuned} conf
  if [ "$settings" = defaults ]; then
    start_defaults_broker "$broker" "$port" "$log" || return 1
  else
    conf="$(write_config "$broker" "$port")"
    case "$broker" in
      postbox | postbox-durable | postbox-acl) "${BROKER_PIN[@]}" "$POSTBOX" -c "$conf" >"$log" 2>&1 & ;;
      mosquitto | mosquitto-persist) "${BROKER_PIN[@]}" mosquitto -c "$conf" >"$log" 2>&1 & ;;
      rumqttd) "${BROKER_PIN[@]}" rumqttd -c "$conf" >"$log" 2>&1 & ;;
    esac
    BROKER_PID=$!
  fi
  # One wait for either kind of start: the broker must take connections within 10 s.
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
  # A defaults run's store is of no further use, and the machine's disk is shared.
  if [ -n "$POSTBOX_DATA" ]; then
    rm -rf "$POSTBOX_DATA"
    POSTBOX_DATA=""
  fi
}
trap stop_broker EXIT INT TERM

selected() { # case
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  case "$1" in
    defaults-*) case ",$ONLY," in *",defaults,"*) return 0 ;; esac ;;
    *) case ",$ONLY," in *",tuned,"*) return 0 ;; esac ;;
  esac
  return 1
}

echo "comparing: ${BROKERS[*]}; repeats: $REPEATS; results: $RESULTS"
[ ${#BROKER_PIN[@]} -gt 0 ] && echo "pinning: broker on core 0, generator on core 1"
FAILED=0
START=$(date +%s)
for spec in "${CASES[@]}"; do
  IFS='|' read -r case scenario args <<<"$spec"
  selected "$case" || continue
  settings=tuned
  brokers=("${BROKERS[@]}")
  if [[ "$case" == defaults-* ]]; then
    settings=defaults
    brokers=("${DEFAULTS_BROKERS[@]}")
  fi
  CASE_TLS=0
  TLS_ARGS=()
  if [[ "$case" == tls-* ]]; then
    CASE_TLS=1
    TLS_ARGS=(--tls-ca "$CERTS/ca.pem")
    # rumqttd's TLS needs its own certificate setup; the TLS set compares Postbox and Mosquitto.
    brokers=(postbox mosquitto)
  fi
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
      start_broker "$broker" "$port" "$log.broker.log" "$settings" || {
        FAILED=$((FAILED + 1))
        continue
      }
      # On defaults, loss is the figure measured: `--settings defaults` keeps it from failing
      # the run (a run that delivers nothing still fails).
      # shellcheck disable=SC2086 # $args is a list of flags
      if "${GEN_PIN[@]}" "$BENCH" run "$scenario" --host "127.0.0.1:$port" --broker "$broker" \
        --broker-pid "$BROKER_PID" --case "$case" --settings "$settings" --json "$RESULTS" \
        --timeout 60 "${TLS_ARGS[@]}" $args >"$log.txt" 2>&1; then
        status=ok
      else
        status="FAILED (exit $?)"
        FAILED=$((FAILED + 1))
      fi
      # `|| true`: a run that failed before printing its table (no such line) must not end
      # the whole comparison under `set -e -o pipefail`.
      rate=$(grep -E '^ +(delivered|connect rate) \|' "$log.txt" | tail -1 | sed 's/.*| //' || true)
      if [ "$settings" = defaults ]; then
        rate="$rate; $(grep -E '^ +loss \|' "$log.txt" | sed 's/.*| //' || true)"
      fi
      printf '%-19s %-10s #%s  %-8s %s\n' "$case" "$broker" "$rep" "$status" "$rate"
      stop_broker
    done
  done
done
echo
echo "took $(($(date +%s) - START)) s; $FAILED failed run(s); logs in $OUT/logs"
echo
"$BENCH" summarize "$RESULTS" | tee "$OUT/summary.txt"
[ "$FAILED" = 0 ]
