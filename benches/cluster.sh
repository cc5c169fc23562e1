#!/usr/bin/env bash
# What the cluster (issue 17) costs and gives, on one machine: QoS 1 fan-in, p2p and a shared
# group (4 publishers → 4 members of one `$share` group) through
#   single   one Postbox, no [cluster] (the baseline)
#   local    node a of a two-node cluster, publishers and subscribers both on a
#   cross    publishers on node a, subscribers on node b (every message crosses NATS)
# Postbox on its defaults plus [cluster] (node, servers); a fresh nats-server -js (store on
# disk, R=1) and fresh data directories per run. Medians of msg/s, p50 / p99 latency and the
# publishing node's CPU per message, and their ratio to single.
# Run from the repository root: `REPEATS=3 benches/cluster.sh` (MODES / CASES to pick).
set -euo pipefail
T="${CARGO_TARGET_DIR:-target}/release"
OUT="${OUT:-target/bench-cluster/$(date +%Y%m%d-%H%M%S)}"; mkdir -p "$OUT"
command -v nats-server >/dev/null || { echo "needs nats-server (apt-get install nats-server)" >&2; exit 2; }
node() { # name port mport nats data
  printf '[storage]\ndir = "%s"\n' "$5" >"$OUT/$1.toml"
  if [ -n "$4" ]; then printf '[cluster]\nnode = "%s"\nservers = ["%s"]\n' "$1" "$4" >>"$OUT/$1.toml"; fi
  "$T/postbox" -c "$OUT/$1.toml" -p "$2" --metrics-port "$3" >"$OUT/$1.log" 2>&1 &
  echo $!
}
ticks() { # pid: its CPU time so far (user + system, clock ticks); 0 without one
  if [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi
}
runs() { # how many runs results.jsonl holds
  if [ -f "$OUT/results.jsonl" ]; then wc -l <"$OUT/results.jsonl"; else echo 0; fi
}
up() { # metrics port: until postbox_cluster_up 1, bounded
  for _ in $(seq 100); do
    curl -s "http://127.0.0.1:$1/metrics" | grep -q '^postbox_cluster_up 1' && return 0; sleep 0.1
  done; echo "node on metrics $1 never joined" >&2; exit 1
}
for i in $(seq "${REPEATS:-3}"); do
  for case in ${CASES:-fan-in p2p shared}; do
    for mode in ${MODES:-single local cross}; do
      pids=(); pa=$("$T/postbox-bench" free-port); ma=$("$T/postbox-bench" free-port)
      pb=$("$T/postbox-bench" free-port); mb=$("$T/postbox-bench" free-port)
      work=$(mktemp -d "$OUT/run-XXXXXX"); nats=""; natspid=""; b=""
      if [ "$mode" != single ]; then
        np=$("$T/postbox-bench" free-port)
        nats-server -js -sd "$work/js" -a 127.0.0.1 -p "$np" >"$OUT/nats.log" 2>&1 & natspid=$!; pids+=($natspid)
        "$T/postbox-bench" wait-port "127.0.0.1:$np" --timeout 10; nats="nats://127.0.0.1:$np"
      fi
      a=$(node a "$pa" "$ma" "$nats" "$work/a"); pids+=($a)
      "$T/postbox-bench" wait-port "127.0.0.1:$pa" --timeout 10
      sub=(); if [ "$mode" = cross ]; then
        b=$(node b "$pb" "$mb" "$nats" "$work/b"); pids+=($b)
        "$T/postbox-bench" wait-port "127.0.0.1:$pb" --timeout 10; up "$mb"; sub=(--subscribe-host "127.0.0.1:$pb")
      fi
      [ -n "$nats" ] && up "$ma"
      case $case in fan-in) shape=(--publishers 10 --messages 10000) ;; p2p) shape=(--pairs 10 --messages 10000) ;;
        shared) shape=(--publishers 4 --subscribers 4 --messages 5000) ;; esac
      n0=$(ticks "$natspid"); b0=$(ticks "$b"); lines0=$(runs)
      "$T/postbox-bench" run "$case" --host "127.0.0.1:$pa" "${sub[@]}" --qos 1 "${shape[@]}" \
        --broker "$mode" --case "$case-q1" --settings defaults --broker-pid "$a" \
        --json "$OUT/results.jsonl" --timeout 120 | grep -E "delivered|lost|latency|CPU" || true
      # The CPU the run cost nats-server and node b (not in the publishing node's figure),
      # per delivered message, added to the run's line.
      [ "$(runs)" -gt "$lines0" ] && python3 - "$OUT/results.jsonl" "$(( $(ticks "$natspid") - n0 ))" "$(( $(ticks "$b") - b0 ))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
path, nats, other, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lines = open(path).read().splitlines()
run = json.loads(lines[-1])
n = max(run.get("delivered") or 0, 1)
run["nats_cpu_us_per_msg"] = nats * 1e6 / hz / n
run["other_node_cpu_us_per_msg"] = other * 1e6 / hz / n
lines[-1] = json.dumps(run)
open(path, "w").write("\n".join(lines) + "\n")
print("  nats-server CPU | %.2f us/msg; node b %.2f us/msg" % (run["nats_cpu_us_per_msg"], run["other_node_cpu_us_per_msg"]))
PY
      kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"
    done
  done
done
python3 - "$OUT/results.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
keys = ("delivered_per_s", "p50_us", "p99_us", "broker_cpu_us_per_msg",
        "nats_cpu_us_per_msg", "other_node_cpu_us_per_msg", "lost")
for case in sorted({r["case"] for r in runs}):
    med = {}
    for m in ("single", "local", "cross"):
        rs = [r for r in runs if r["case"] == case and r["broker"] == m]
        if rs:
            med[m] = {k: statistics.median(r.get(k) or 0 for r in rs) for k in keys}
            print(case, m, {k: round(v, 1) for k, v in med[m].items()})
    for m in ("local", "cross"):
        if m in med and "single" in med:
            b = med["single"]
            print("%s %s/single msg/s %.2fx, p99 %.2fx, CPU/msg %.2fx" % (case, m,
                med[m]["delivered_per_s"] / b["delivered_per_s"],
                med[m]["p99_us"] / max(b["p99_us"], 1),
                med[m]["broker_cpu_us_per_msg"] / max(b["broker_cpu_us_per_msg"], 1e-9)))
PY
echo "results: $OUT/results.jsonl"
