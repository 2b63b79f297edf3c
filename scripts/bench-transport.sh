#!/usr/bin/env bash
# Transport benchmark (issue 14, docs/benchmarks.md): `vigil bench transport` (the product's Link against its
# Receiver in a second process, tcp / tls / ucx) side by side with ucx_perftest of the same UCX (Debian
# ucx-utils) on loopback, same message sizes, host memory; one combined table.
#
#   scripts/bench-transport.sh [OUT_DIR]     (default: a temporary folder, removed; raw outputs kept in OUT_DIR)
#
# Environment: VIGIL_BIN (default build/src/vigil), SIZES (64,256,1024,4096,16384,65536), ITERS (2000 round
# trips per size, both tools), BW_ITERS (20000 ucx_perftest tag_bw messages), WINDOW (64: vigil's Reports in
# flight = ucx_perftest -O), LINKS (tcp,tls,ucx), RUNS (3: runs of each tool, alternating; each cell is the
# median), PINNED (1: one more vigil run with both processes on CPU 0, `taskset -c 0`, to show what wake-ups
# across CPUs cost; 0: skip). About 3–4 minutes with the defaults on the 2-core machine.
#
# ucx_perftest configurations, each `ucx_perftest -p PORT` (server) + `ucx_perftest 127.0.0.1 -p PORT -t TEST
# -s SIZE -n N` (client), TEST tag_lat (ping-pong; its latency columns are one-way = RTT/2: libperf divides
# ping-pong times by 2) and tag_bw (-O WINDOW):
#   tcp        UCX_TLS=tcp, busy polling (perftest's default)
#   sm         UCX_TLS unset (UCX picks shared memory), busy polling
#   sm-vigil   UCX_TLS unset, UCX_MM_ERROR_HANDLING=y, -e (peer error handling) -E sleep (wait on the worker's
#              event fd): what vigil's UCX link asks of UCX (ucx.h), without vigil's framing and threads
# Latency reported for perftest: "typical" = the 50th percentile of its last 2048 iterations. The client runs
# with UCX_LOG_LEVEL=info, so its output names the lanes UCX chose (ep_cfg: "tag(sysv/memory)").
set -euo pipefail
cd "$(dirname "$0")/.."
vigil=${VIGIL_BIN:-build/src/vigil}
sizes=${SIZES:-64,256,1024,4096,16384,65536}
iters=${ITERS:-2000}
bw_iters=${BW_ITERS:-20000}
window=${WINDOW:-64}
links=${LINKS:-tcp,tls,ucx}
runs=${RUNS:-3}
if [[ $# -ge 1 ]]; then
  out=$1
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing (apt install ucx-utils)" >&2; exit 2; }
[[ -x $vigil ]] || { echo "$vigil missing (cmake --build build --target vigil)" >&2; exit 2; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "ucx: $(ucx_info -v | head -1)"
  echo "vigil: $($vigil --version) ($(git rev-parse --short HEAD))"
} | tee "$out/machine.txt"

# One ucx_perftest pair: server in the background (line-buffered, so its "Waiting for connection" shows at
# once), client when the server listens; the client's output kept.
perftest() {  # RUN CONFIG TEST SIZE N [extra args for both sides]
  local run=$1 cfg=$2 test=$3 size=$4 n=$5
  shift 5
  local port=$((20000 + RANDOM % 20000)) name="$out/perftest.$cfg.$test.$size.$run"
  local -a env=()
  case $cfg in
    tcp) env=(UCX_TLS=tcp) ;;
    sm) env=() ;;
    sm-vigil) env=(UCX_MM_ERROR_HANDLING=y) ;;
  esac
  env "${env[@]}" stdbuf -oL ucx_perftest -p "$port" "$@" >"$name.server.txt" 2>&1 &
  local pid=$!
  for _ in $(seq 200); do grep -q "Waiting for connection" "$name.server.txt" 2>/dev/null && break; sleep 0.05; done
  env "${env[@]}" UCX_LOG_LEVEL=info timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$n" \
    -w 1000 -f "$@" >"$name.txt" 2>&1 || echo "ucx_perftest $cfg $test $size failed" >&2
  wait "$pid" || true
}

# Runs alternate vigil and ucx_perftest, so both see the same machine load; medians over the runs.
for ((r = 1; r <= runs; ++r)); do
  "$vigil" bench transport --links "$links" --sizes "$sizes" --iters "$iters" --window "$window" \
    --json "$out/vigil.$r.json" | tee "$out/vigil.$r.txt"
  for cfg in tcp sm sm-vigil; do
    extra=()
    [[ $cfg == sm-vigil ]] && extra=(-e -E sleep)
    for size in ${sizes//,/ }; do
      perftest "$r" "$cfg" tag_lat "$size" "$iters" "${extra[@]}"
      perftest "$r" "$cfg" tag_bw "$size" "$bw_iters" -O "$window" "${extra[@]}"
    done
  done
done
# Diagnosis, not a product number: both vigil processes on one CPU (no wake-up crosses vCPUs).
if [[ ${PINNED:-1} == 1 ]]; then
  taskset -c 0 "$vigil" bench transport --links "$links" --sizes "$sizes" --iters "$iters" --window "$window" \
    --json "$out/vigil-cpu0.json" | tee "$out/vigil-cpu0.txt"
fi

python3 - "$out" "$sizes" "$runs" <<'EOF'
import glob, json, statistics, sys
out, sizes, runs = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
med = statistics.median
vigil = {}  # (link, size) -> list of size entries (one per run)
opens, transports = {}, {}
for path in sorted(glob.glob(f"{out}/vigil.[0-9]*.json")):
    for l in json.load(open(path))["links"]:
        transports[l["link"]] = l.get("transports", "")
        opens.setdefault(l["link"], []).append(l["open_us"])
        for s in l["sizes"]:
            vigil.setdefault((l["link"], s["size"]), []).append(s)

def perftest(cfg, test, size):
    """Medians over the runs of (typical latency us, overall msg/s, overall MB/s): the final line of `-f`."""
    got = []
    for path in glob.glob(f"{out}/perftest.{cfg}.{test}.{size}.[0-9]*.txt"):
        if path.endswith(".server.txt"):
            continue
        for line in reversed(open(path).read().split("\n")):
            f = line.split()
            if len(f) == 8 and all(x.replace(".", "", 1).isdigit() for x in f):
                got.append((float(f[1]), float(f[7]), float(f[5])))
                break
    return tuple(med(g[i] for g in got) for i in range(3)) if got else None

def v(link, size, get):
    rows = vigil.get((link, size))
    return f"{med(get(r) for r in rows):.1f}" if rows else "-"

links = [l for l in ("tcp", "tls", "ucx") if any(k[0] == l for k in vigil)]
cfgs = ("tcp", "sm", "sm-vigil")
print()
print("one-way latency p50 (us): vigil = RTT/2 of Report -> Ack through Link and Receiver; ucx_perftest tag_lat typical")
print(f"{'size':>6} {'frame':>6} " + " ".join(f"{'vigil ' + l:>10}" for l in links) + " " +
      " ".join(f"{'pt ' + c:>12}" for c in cfgs))
for size in sizes:
    frame = next((r[0]["frame_bytes"] for k, r in vigil.items() if k[1] == size), size)
    cells = [v(l, size, lambda r: r["latency_us"]["p50"]) for l in links]
    pts = [perftest(c, "tag_lat", size) for c in cfgs]
    print(f"{size:>6} {frame:>6} " + " ".join(f"{c:>10}" for c in cells) + " " +
          " ".join(f"{(f'{p[0]:.2f}' if p else '-'):>12}" for p in pts))
print()
print("p99 one-way (us), vigil: " + "; ".join(
    f"{l} " + ", ".join(f"{s}: {v(l, s, lambda r: r['latency_us']['p99'])}" for s in sizes) for l in links))
print()
print("messages/s (window 64): vigil one Report per Link::Send, acked; ucx_perftest tag_bw -O 64 overall msg/s")
print(f"{'size':>6} " + " ".join(f"{'vigil ' + l:>11}" for l in links) + " " + " ".join(f"{'pt ' + c:>12}" for c in cfgs))
for size in sizes:
    cells = [v(l, size, lambda r: r["throughput"]["messages_per_s"]) for l in links]
    pts = [perftest(c, "tag_bw", size) for c in cfgs]
    print(f"{size:>6} " + " ".join(f"{c:>11}" for c in cells) + " " +
          " ".join(f"{(f'{p[1]:.0f}' if p else '-'):>12}" for p in pts))
print()
print("MiB/s: " + "; ".join(f"{l} " + ", ".join(f"{s}: {v(l, s, lambda r: r['throughput']['mib_per_s'])}" for s in sizes)
                         for l in links))
print("ucx_perftest MB/s (2^20): " + "; ".join(
    f"{c} " + ", ".join(f"{s}: {(f'{p[2]:.1f}' if (p := perftest(c, 'tag_bw', s)) else '-')}" for s in sizes) for c in cfgs))
print()
print("CPU us per message, vigil (client + server processes, throughput phase)")
print(f"{'size':>6} " + " ".join(f"{l:>8}" for l in links) + (f" {'tls-tcp':>8}" if {"tls", "tcp"} <= set(links) else ""))
for size in sizes:
    tot = {l: med(r["cpu_us_per_message"]["total"] for r in vigil[(l, size)]) for l in links if (l, size) in vigil}
    row = f"{size:>6} " + " ".join(f"{tot.get(l, float('nan')):>8.2f}" for l in links)
    if "tls" in tot and "tcp" in tot:
        row += f" {tot['tls'] - tot['tcp']:>8.2f}"
    print(row)
print()
print("Link::Open median us (connect + Hello/Challenge/Auth/Welcome): with key, without, auth cost")
for l in links:
    o = opens[l]
    print(f"  {l}: {med(x['with_key'] for x in o):.0f} / {med(x['without_key'] for x in o):.0f} / "
          f"{med(x['auth_cost'] for x in o):.1f} ({o[0]['opens']} opens each)")
if "tls" in opens and "tcp" in opens:
    print(f"  TLS handshake share (tls - tcp, with key): "
          f"{med(x['with_key'] for x in opens['tls']) - med(x['with_key'] for x in opens['tcp']):.0f} us")
for c in cfgs:
    try:
        lanes = [l.split("ep_cfg")[1].split(":", 1)[1].strip() for l in open(f"{out}/perftest.{c}.tag_lat.{sizes[0]}.1.txt")
                 if "ep_cfg" in l]
    except OSError:
        lanes = []
    print(f"  ucx_perftest {c}: {'; '.join(lanes) or '?'}")
if transports.get("ucx"):
    print(f"  vigil's ucx link selected: {transports['ucx']}")
print(f"({runs} runs of each, alternating; medians)")
pinned = f"{out}/vigil-cpu0.json"
if glob.glob(pinned):
    print()
    print("diagnosis: vigil with both processes on CPU 0 (taskset -c 0): one-way p50 us / cpu us per message")
    for l in json.load(open(pinned))["links"]:
        print(f"  {l['link']}: " + ", ".join(
            f"{s['size']}: {s['latency_us']['p50']:.1f} / {s['cpu_us_per_message']['total']:.1f}" for s in l["sizes"]))
EOF
