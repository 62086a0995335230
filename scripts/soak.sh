#!/usr/bin/env bash
# A soak run: icecore profiles the whole host at 97 Hz for MINUTES (60 by
# default) while processes churn and its OTLP endpoint flaps, and its RSS,
# CPU and BPF map memory are sampled each minute, written as CSV and
# plotted as SVG. Flat is the bar: the verdict compares the last third of
# the run with the second third.
#
#   sudo scripts/soak.sh [MINUTES] [OUTPUT_DIR]
#
# Needs root, a built release binary (cargo build --release) and python3.
# The endpoint is a second icecore receiving OTLP (--otlp-listen) into
# pprof files, down for 2 minutes of every 5.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-60}
out=${2:-target/soak}
bin=${ICECORE_BIN:-target/release/icecore}
[[ $(id -u) -eq 0 ]] || { echo "soak: needs root (it loads BPF programs)" >&2; exit 1; }
[[ -x $bin ]] || { echo "soak: no $bin; run cargo build --release first" >&2; exit 1; }
command -v python3 >/dev/null || { echo "soak: needs python3" >&2; exit 1; }
[[ $minutes =~ ^[0-9]+$ && $minutes -ge 3 ]] || { echo "soak: MINUTES must be a number, at least 3" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/receiver-pprof" "$out/agent-pprof"
mkdir -p "$out/receiver-pprof" "$out/agent-pprof"

pids=()
cleanup() {
  # The agent first, while its endpoint still serves: its last batch is
  # delivered, not counted as dropped at shutdown.
  if [[ -n ${agent:-} ]]; then
    kill "$agent" 2>/dev/null || true
    wait "$agent" 2>/dev/null || true
  fi
  # The workload loops' own children (a gzip, a python) go with them.
  for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  [[ -n ${receiver:-} ]] && kill "$receiver" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
# The endpoint: an icecore that only forwards what it receives (it samples
# nothing but a sleeping process of its own).
sleep infinity &
idle=$!
pids+=("$idle")
start_receiver() {
  "$bin" --otlp-listen "127.0.0.1:$port" --pid "$idle" --pprof-dir "$out/receiver-pprof" \
    --pprof-max-bytes 256MiB --http-address 127.0.0.1:0 >>"$out/receiver.log" 2>&1 &
  receiver=$!
}
start_receiver

# The workload: two busy processes (native and Python) and a churn of short
# processes (an exec, a fork without exec and a thread each round).
python3 -c 'while True: sum(i * i for i in range(10000))' &
pids+=($!)
(while true; do gzip -c /dev/urandom >/dev/null 2>&1 & g=$!; sleep 5; kill $g 2>/dev/null; done) &
pids+=($!)
(while true; do
   /bin/true
   sh -c ':' &
   ( : ) &
   python3 -c 'import threading; t = threading.Thread(target=sum, args=(range(1000),)); t.start(); t.join()'
   wait
 done) >/dev/null 2>&1 &
pids+=($!)

metrics_port=$((40000 + RANDOM % 20000))
"$bin" --sampling-frequency 97 --reporter-interval 10s --otlp-endpoint "http://127.0.0.1:$port" \
  --pprof-dir "$out/agent-pprof" --pprof-max-bytes 1GiB \
  --http-address "127.0.0.1:$metrics_port" >"$out/agent.log" 2>&1 &
agent=$!
pids+=("$agent")

# awk reads all of curl's output: leaving early would fail curl (exit 23,
# a write error), and with pipefail the whole script.
metric() {
  curl -s "http://127.0.0.1:$metrics_port/metrics" | awk -v name="$1" '$1 == name && !done { print $2; done = 1 }'
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$agent/stat"; }
hz=$(getconf CLK_TCK)

csv="$out/soak.csv"
echo "minute,rss_mb,cpu_pct,bpf_map_mib,unwind_table_mib,processes_tracked,otlp_queue_requests,otlp_dropped_samples,endpoint" >"$csv"
echo "soak: $minutes minutes; agent pid $agent, endpoint 127.0.0.1:$port; writing $csv"
sleep 5
last_ticks=$(cpu_ticks)
for ((minute = 1; minute <= minutes; minute++)); do
  # The endpoint is down for minutes 3-4 of every 5.
  if ((minute % 5 == 3 || minute % 5 == 4)); then
    endpoint=down
    if [[ -n $receiver ]]; then
      kill "$receiver" 2>/dev/null || true
      wait "$receiver" 2>/dev/null || true
      receiver=
    fi
  else
    endpoint=up
    [[ -n $receiver ]] || start_receiver
  fi
  sleep 60
  kill -0 "$agent" 2>/dev/null || { echo "soak: the agent died; see $out/agent.log" >&2; exit 1; }
  ticks=$(cpu_ticks)
  cpu=$(python3 -c "print(round(($ticks - $last_ticks) / $hz / 60 * 100, 2))")
  last_ticks=$ticks
  rss=$(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$agent/status")
  mib() { python3 -c "print(round(float('${1:-0}') / 1048576, 2))"; }
  maps=$(mib "$(metric icecore_bpf_map_bytes)")
  tables=$(mib "$(metric icecore_unwind_table_bytes)")
  tracked=$(metric icecore_processes_tracked)
  queued=$(metric icecore_otlp_queue_requests)
  dropped=$(curl -s "http://127.0.0.1:$metrics_port/metrics" \
    | awk '/^icecore_otlp_dropped_samples_total/ { s += $2 } END { print s + 0 }')
  echo "$minute,$rss,$cpu,$maps,$tables,${tracked:-0},${queued:-0},$dropped,$endpoint" | tee -a "$csv"
done

python3 - "$csv" "$out/soak.svg" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
series = [("rss_mb", "RSS (MB)"), ("cpu_pct", "CPU (% of a core)"),
          ("bpf_map_mib", "BPF maps (MiB)"), ("unwind_table_mib", "unwind tables (MiB)")]
w, h, pad = 720, 170, 40
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(series)}" font-family="sans-serif" font-size="12">']
for i, (key, title) in enumerate(series):
    ys = [float(r[key]) for r in rows]
    top = max(ys + [1e-9]) * 1.2
    y0 = i * h
    pts = " ".join(f"{pad + (w - 2 * pad) * j / max(len(ys) - 1, 1):.1f},{y0 + h - pad - (h - 2 * pad) * y / top:.1f}" for j, y in enumerate(ys))
    svg.append(f'<text x="{pad}" y="{y0 + 20}">{title}: first {ys[0]:g}, last {ys[-1]:g}, max {max(ys):g}</text>')
    svg.append(f'<line x1="{pad}" y1="{y0 + h - pad}" x2="{w - pad}" y2="{y0 + h - pad}" stroke="#999"/>')
    svg.append(f'<polyline fill="none" stroke="#c0392b" stroke-width="2" points="{pts}"/>')
svg.append("</svg>")
open(sys.argv[2], "w").write("\n".join(svg))
n = len(rows)
def mean(key, part):
    vals = [float(r[key]) for r in part]
    return sum(vals) / max(len(vals), 1)
second, last = rows[n // 3: 2 * n // 3], rows[2 * n // 3:]
verdict = []
for key in ("rss_mb", "bpf_map_mib", "cpu_pct"):
    a, b = mean(key, second), mean(key, last)
    growth = (b - a) / a * 100 if a else 0.0
    verdict.append(f"{key}: {a:.1f} -> {b:.1f} ({growth:+.1f} %)")
    flat = abs(growth) <= 10
    verdict[-1] += "" if flat else "  NOT FLAT"
print("soak: second third vs last third: " + "; ".join(verdict))
print(f"soak: plot {sys.argv[2]}")
EOF

# The agent profiled itself too: where its own CPU went, third by third.
python3 scripts/soak-self-profile.py "$out/agent-pprof" "$agent" >"$out/self-profile.txt" \
  && echo "soak: the agent's own profile by third: $out/self-profile.txt"
