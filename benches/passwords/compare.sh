#!/usr/bin/env bash
# The password reconnect storm on Postbox (login cache on and off) and Mosquitto, the same
# password file, one after the other, alternating who goes first per repeat:
#   benches/passwords/compare.sh FILE CLIENTS CONCURRENCY [REPEATS] [OUTDIR]
# Each broker is started fresh (so round 1 is cold: nothing cached) and storm.py runs two
# rounds: round 1 = first connect of every client, round 2 = the same clients reconnecting.
# Needs a release build (`cargo build --release`; CARGO_TARGET_DIR honoured) and mosquitto.
# Brokers are not pinned: Postbox hashes on every core it has, Mosquitto on one thread.
set -euo pipefail
FILE="$(realpath "${1:?password file (mkfile.py)}")"
N="${2:?clients}"
C="${3:?handshakes at once}"
REPEATS="${4:-1}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${5:-$ROOT/target/passwords-$(date +%Y%m%d-%H%M%S)}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
POSTBOX="${POSTBOX_BIN:-$TARGET/release/postbox}"
BENCH="$TARGET/release/postbox-bench"
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
PID=""
stop() {
  [ -n "$PID" ] || return 0
  kill -TERM "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
}
trap stop EXIT INT TERM
run() { # broker
  local broker=$1 port conf
  port="$("$BENCH" free-port)"
  case "$broker" in
    postbox-cache*|postbox-nocache)
      local cache=4096
      [ "$broker" = postbox-nocache ] && cache=0
      conf="$OUT/$broker.toml"
      cat >"$conf" <<EOC
[listener]
bind = "127.0.0.1:$port"
max_connections = 0
[metrics]
enabled = false
[storage]
persistence = false
[auth]
allow_anonymous = false
password_file = "$FILE"
password_cache_size = $cache
[log]
level = "warn"
EOC
      "$POSTBOX" -c "$conf" >"$OUT/$broker.log" 2>&1 &
      ;;
    mosquitto)
      conf="$OUT/mosquitto.conf"
      printf 'listener %s 127.0.0.1\nallow_anonymous false\npassword_file %s\nmax_connections -1\nlog_dest stderr\nlog_type error\nconnection_messages false\n' \
        "$port" "$FILE" >"$conf"
      mosquitto -c "$conf" >"$OUT/$broker.log" 2>&1 &
      ;;
  esac
  PID=$!
  "$BENCH" wait-port "127.0.0.1:$port" --timeout 10
  echo "== $broker ($(basename "$FILE"), $N clients, $C at once)"
  timeout 900 python3 "$ROOT/benches/passwords/storm.py" "$port" "$N" "$C" 2
  stop
}
BROKERS=(postbox-cache postbox-nocache mosquitto)
for rep in $(seq "$REPEATS"); do
  order=("${BROKERS[@]}")
  if [ $((rep % 2)) = 0 ]; then order=(mosquitto postbox-nocache postbox-cache); fi
  for b in "${order[@]}"; do run "$b"; done
done 2>&1 | tee -a "$OUT/storm.txt"
