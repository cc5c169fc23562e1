#!/usr/bin/env bash
# Fan-in QoS 1 (100 publishers x 4,000 messages, v5, a unique message-id on every PUBLISH),
# Postbox on its defaults, [dedup] off vs on; alternating; broker on core 0, generator on core 1.
set -euo pipefail
T="${CARGO_TARGET_DIR:-target}/release"
OUT="${OUT:-target/bench-dedup/$(date +%Y%m%d-%H%M%S)}"; mkdir -p "$OUT"
for i in $(seq "${REPEATS:-3}"); do
  for mode in off on; do
    port=$("$T/postbox-bench" free-port); data=$(mktemp -d "$OUT/data-XXXXXX")
    if [ $mode = on ]; then printf '[dedup]\nproperty = "message-id"\n' >"$OUT/$mode.toml"; else : >"$OUT/$mode.toml"; fi
    taskset -c 0 "$T/postbox" -c "$OUT/$mode.toml" -p "$port" --metrics-port 0 --data-dir "$data" >"$OUT/broker-$mode-$i.log" 2>&1 &
    pid=$!
    "$T/postbox-bench" wait-port "127.0.0.1:$port" --timeout 10
    taskset -c 1 "$T/postbox-bench" run fan-in --host "127.0.0.1:$port" --protocol 5 --qos 1 \
      --publishers 100 --messages 4000 --message-id-property message-id \
      --broker "dedup-$mode" --case fan-in-q1-v5-id --settings defaults --broker-pid "$pid" \
      --json "$OUT/results.jsonl" --timeout 60 | grep -E "delivered|lost|CPU" || true
    kill "$pid"; wait "$pid" || true; rm -rf "$data"
  done
done
# Medians per mode and the on/off ratio.
python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = {m: {k: statistics.median(r[k] for r in runs if r["broker"] == f"dedup-{m}")
           for k in ("delivered_per_s", "broker_cpu_us_per_msg", "broker_peak_rss_kib", "lost")}
       for m in ("off", "on")}
for m in ("off", "on"):
    print(m, {k: round(v, 2) for k, v in med[m].items()})
print("on/off msg/s %.2fx, CPU us/msg %.2fx" % (
    med["on"]["delivered_per_s"] / med["off"]["delivered_per_s"],
    med["on"]["broker_cpu_us_per_msg"] / med["off"]["broker_cpu_us_per_msg"]))
PY
