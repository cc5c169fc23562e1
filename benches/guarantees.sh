#!/usr/bin/env bash
# What the issue-16 guarantees cost on the publish path: fan-in QoS 1 (100 publishers x 4,000
# messages, v5), every run sending the same PUBLISHes (the 65-byte order of
# benches/load/payloads/order.json, Content Type `order/v1`, a unique `message-id` user
# property), Postbox on its defaults plus one section per mode:
#   plain   nothing else
#   schema  a [[schema]] (config/schemas/order.schema.json) on bench/#: every payload is parsed and validated
#   dedup   [dedup] property = "message-id": every PUBLISH is a window miss and an insert (its worst case)
#   plain-mem, dedup-mem   the same two with [storage] persistence = false (the window's own cost)
# Modes alternate within each repeat, a fresh broker and data directory per run, broker on core 0,
# generator on core 1. After each run the broker's flow-control and guarantee metrics are scraped.
# Run from the repository root: `REPEATS=5 benches/guarantees.sh` (MODES="plain dedup" to pick;
# SCENARIO=durable for 4 publishers -> 4 persistent subscribers, where every message is stored
# anyway and a dedup key rides in its message's submit).
set -euo pipefail
T="${CARGO_TARGET_DIR:-target}/release"
OUT="${OUT:-target/bench-guarantees/$(date +%Y%m%d-%H%M%S)}"; mkdir -p "$OUT"
ROOT=$(pwd)
for i in $(seq "${REPEATS:-3}"); do
  for mode in ${MODES:-plain schema dedup}; do
    port=$("$T/postbox-bench" free-port); mport=$("$T/postbox-bench" free-port)
    data=$(mktemp -d "$OUT/data-XXXXXX")
    case $mode in
      plain) : >"$OUT/$mode.toml" ;;
      schema) printf '[[schema]]\nid = "order/v1"\nfilter = "bench/#"\nfile = "%s/config/schemas/order.schema.json"\n' "$ROOT" >"$OUT/$mode.toml" ;;
      dedup) printf '[dedup]\nproperty = "message-id"\n' >"$OUT/$mode.toml" ;;
      plain-mem) printf '[storage]\npersistence = false\n' >"$OUT/$mode.toml" ;;
      dedup-mem) printf '[storage]\npersistence = false\n[dedup]\nproperty = "message-id"\n' >"$OUT/$mode.toml" ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    dir=(--data-dir "$data"); case $mode in *-mem) dir=() ;; esac
    taskset -c 0 "$T/postbox" -c "$OUT/$mode.toml" -p "$port" --metrics-port "$mport" "${dir[@]}" >"$OUT/broker-$mode-$i.log" 2>&1 &
    pid=$!
    "$T/postbox-bench" wait-port "127.0.0.1:$port" --timeout 10
    shape=(--publishers 100 --messages 4000)
    [ "${SCENARIO:-fan-in}" = durable ] && shape=()
    taskset -c 1 "$T/postbox-bench" run "${SCENARIO:-fan-in}" --host "127.0.0.1:$port" --protocol 5 --qos 1 \
      "${shape[@]}" --payload-file benches/load/payloads/order.json \
      --content-type order/v1 --message-id-property message-id \
      --broker "$mode" --case "${SCENARIO:-fan-in}-q1-v5-order" --settings defaults --broker-pid "$pid" \
      --json "$OUT/results.jsonl" --timeout 60 | grep -E "delivered|lost|CPU" || true
    curl -s "http://127.0.0.1:$mport/metrics" | grep -E '^postbox_(publishers_paused|publisher_pause|dedup_|messages_dropped|publishes_refused)' \
      | sed "s/^/  $mode: /" || true
    kill "$pid"; wait "$pid" || true; rm -rf "$data"
  done
done
# Medians per mode and the ratio to plain.
python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
modes = [m for m in ("plain", "schema", "dedup", "plain-mem", "dedup-mem") if any(r["broker"] == m for r in runs)]
keys = ("delivered_per_s", "broker_cpu_us_per_msg", "broker_peak_rss_kib", "lost")
med = {m: {k: statistics.median(r[k] for r in runs if r["broker"] == m) for k in keys} for m in modes}
for m in modes:
    print(m, {k: round(v, 2) for k, v in med[m].items()})
for m in modes:
    base = "plain-mem" if m.endswith("-mem") else "plain"
    if m != base and base in med:
        print("%s/%s msg/s %.2fx, CPU us/msg %.2fx" % (m, base,
            med[m]["delivered_per_s"] / med[base]["delivered_per_s"],
            med[m]["broker_cpu_us_per_msg"] / med[base]["broker_cpu_us_per_msg"]))
PY
