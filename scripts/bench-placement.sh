#!/usr/bin/env bash
# Placement benchmark (issue 5), printed as Markdown for docs/benchmarks.md:
#  1. `vigil bench placement`: a batch of 1080p frames copied from pageable, NUMA-bound (local and remote)
#     host memory with memcpy, and host->device from pageable, pinned, GPU-local pinned and remote pinned
#     memory on a CUDA build with a GPU (skipped, saying why, elsewhere).
#  2. The edge pipeline's CPU time per frame with binding and without (DISABLE_NUMA_BIND=1): an
#     aggregator and `vigil edge` on STREAMS copies of the first FRAMES frames of vtest.avi (realtime off),
#     CPU time = user + system of the edge process (getrusage of the child) / frames.
# Needs build/src/vigil, ffmpeg, opencv-doc's vtest.avi and the model (VIGIL_MODEL, default the shared
# int8 YOLOv8n). Env: FRAMES (200), STREAMS (4), THREADS (model threads, default all), BATCH frames (8).
set -euo pipefail
cd "$(dirname "$0")/.."
vigil=build/src/vigil
model=${VIGIL_MODEL:-../shared/models/yolov8n_coco_640_int8dyn.onnx}
frames=${FRAMES:-200} streams=${STREAMS:-4} threads=${THREADS:-0} batch=${BATCH:-8}
vtest=/usr/share/doc/opencv-doc/examples/data/vtest.avi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "### vigil bench placement (--frames $batch, 1920x1080)"
echo
$vigil bench placement --frames "$batch" --iters 30 --json > "$work/placement.json"
python3 - "$work/placement.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{j['frames']} frames = {j['bytes'] / 2**20:.1f} MiB per copy; thread on node {j['home_node']} "
      f"(PUs {j['home_cpus']}); binding: {j['binding']}")
print()
def table(title, rows):
    print(f"| {title} | node | GB/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        node = "-" if r["node"] is None else r["node"]
        if "not_measured" in r:
            print(f"| {r['source']} | {node} | not measured: {r['not_measured']} | | |")
        else:
            print(f"| {r['source']} | {node} | {r['gbps']:.2f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |")
    print()
table("memcpy source", j["host_memcpy"])
d = j["host_to_device"]
if d["rows"]:
    table(f"host->device source (GPU {d['gpu']}, NUMA node {d['gpu_numa_node']})", d["rows"])
if "note" in d:
    print(f"host->device: {d['note']}")
    print()
PY

[[ -f $vtest && -f $model ]] || { echo "pipeline part skipped: needs $vtest and $model"; exit 0; }
ffmpeg -v error -i "$vtest" -frames:v "$frames" -c copy "$work/clip.avi"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
agg_port=$(port)
key=$(openssl rand -hex 32)  # authenticated, as shipped: one key for both edge ids
(umask 077; echo "$key" > "$work/edge.key"; printf 'bench-bound: %s\nbench-unbound: %s\n' "$key" "$key" > "$work/keys.yaml")
printf 'listen: 127.0.0.1:%s\nhttp: 127.0.0.1:%s\ndb: %s/agg.db\nauth: {keys_file: %s/keys.yaml}\n' \
  "$agg_port" "$(port)" "$work" "$work" > "$work/agg.yaml"
$vigil aggregator --config "$work/agg.yaml" > "$work/agg.out" 2> "$work/agg.log" &
agg=$!
trap 'kill $agg 2>/dev/null; rm -rf "$work"' EXIT
sleep 1

run_edge() {  # $1: label, $2: DISABLE_NUMA_BIND value
  local dir="$work/$1"
  mkdir -p "$dir"
  {
    printf 'edge: bench-%s\naggregator: 127.0.0.1:%s\nmodel: {path: %s, threads: %s}\n' "$1" "$agg_port" "$model" "$threads"
    printf 'batching: {max_batch: %s, max_wait_ms: 10}\nstate_dir: %s/state\n' "$streams" "$dir"
    printf 'transport: {key_file: %s/edge.key}\n' "$work"
    printf 'placement: {bind_single_numa: true}\nstreams:\n'
    for i in $(seq 1 "$streams"); do printf '  - {id: s%s, source: %s}\n' "$i" "$work/clip.avi"; done
  } > "$dir/edge.yaml"
  DISABLE_NUMA_BIND=$2 python3 - "$vigil" "$dir/edge.yaml" "$1" "$((frames * streams))" <<'PY'
import resource, subprocess, sys, time
vigil, cfg, label, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t0 = time.monotonic()
subprocess.run([vigil, "edge", "--config", cfg], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = ru.ru_utime + ru.ru_stime
print(f"| {label} | {n} | {wall:.1f} | {n / wall:.1f} | {cpu:.1f} | {1000 * cpu / n:.1f} |")
PY
}
echo "### Edge pipeline: $streams streams x $frames frames of vtest.avi, $(basename "$model"), realtime off"
echo
echo "| binding | frames | wall s | frames/s | CPU s | CPU ms per frame |"
echo "|---|---|---|---|---|---|"
run_edge bound ""
run_edge unbound 1
