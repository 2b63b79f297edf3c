#!/usr/bin/env bash
# The main job on this machine: sets up (apt), builds, then runs an aggregator and an edge as two
# processes on loopback over Debian's sample video (opencv-doc vtest.avi) and darknet's images, and
# ends by printing where the results are and a table of detections per class.
# Usage: scripts/demo.sh [MODEL.onnx]   (or VIGIL_MODEL=...; default: ../shared/models' YOLOv8n)
# Export your own: `pip install ultralytics && yolo export model=yolov8n.pt format=onnx`.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-${VIGIL_MODEL:-../shared/models/yolov8n_coco_640_int8dyn.onnx}}
if [[ ! -f $model ]]; then
  echo "demo.sh: no model at '$model'. Pass one: scripts/demo.sh yolov8n.onnx" >&2
  echo "  (export one with: pip install ultralytics && yolo export model=yolov8n.pt format=onnx)" >&2
  exit 2
fi
model=$(realpath "$model")
scripts/deps.sh build
echo "building vigil (the CLI only; a first build takes 5-20 minutes on 2 cores)"
build_log=$(mktemp)
VIGIL_BUILD_TARGETS=vigil scripts/build.sh >"$build_log" 2>&1 &
build_pid=$!
ticks=0
while kill -0 "$build_pid" 2>/dev/null; do  # one progress line a minute
  sleep 5
  ticks=$((ticks + 1))
  if ((ticks % 12 == 0)); then
    grep -oE '^\[[0-9]+/[0-9]+\]' "$build_log" | tail -n 1 | sed 's/^/  build step /' || true
  fi
done
if ! wait "$build_pid"; then
  tail -n 40 "$build_log" >&2
  echo "demo.sh: the build failed (full log: $build_log)" >&2
  exit 1
fi
vigil=$PWD/build/src/vigil
out=$PWD/runs/demo
rm -rf "$out" && mkdir -p "$out"
video=/usr/share/doc/opencv-doc/examples/data/vtest.avi
[[ -f $video ]] || video=$(ls /usr/share/doc/opencv-doc/examples/data/vtest.avi* | head -1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
agg_port=$(free_port) http_port=$(free_port)

# The edge proves a pre-shared key; the aggregator holds it for that edge id (docs/architecture.md).
key=$(openssl rand -hex 32)
(umask 077; echo "$key" > "$out/edge.key"; echo "demo-edge: $key" > "$out/edge-keys.yaml")
cat > "$out/agg.yaml" <<YAML
listen: 127.0.0.1:$agg_port
http: 127.0.0.1:$http_port
db: $out/vigil.db
allow: [127.0.0.1/32]
auth: {keys_file: $out/edge-keys.yaml}
YAML
cat > "$out/edge.yaml" <<YAML
edge: demo-edge
aggregator: 127.0.0.1:$agg_port
model: {path: $model, threads: $(nproc)}
batching: {max_batch: 4, max_wait_ms: 10}
http_port: 0
state_dir: $out/edge-state
transport: {key_file: $out/edge.key}
snapshots: {max_width: 640, crops: true, quality: 80}   # each event's frame and a crop per box, on the dashboard
streams:
  - id: vtest
    source: $video
    rules: {min_score: 0.4, severity: {critical: 0.9, warning: 0.6}}
  - id: samples
    source: /usr/share/darknet/data/*.jpg
YAML

"$vigil" aggregator --config "$out/agg.yaml" > "$out/aggregator.out" 2> "$out/aggregator.log" &
agg_pid=$!
trap 'kill $agg_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q "vigil aggregator" "$out/aggregator.out" 2>/dev/null && break; sleep 0.1; done
echo "aggregator: 127.0.0.1:$agg_port (dashboard http://127.0.0.1:$http_port/ while the demo runs; API /api/stats)"
echo "edge: vtest.avi (795 frames) + darknet images, model $(basename "$model") — under a minute on 2 cores (int8 YOLOv8n)"
"$vigil" --log-level warn edge --config "$out/edge.yaml" 2> "$out/edge.log"
python3 - "$http_port" > "$out/stats.json" <<'PY' || true
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/stats", timeout=10).read().decode())
PY
kill $agg_pid; wait $agg_pid 2>/dev/null || true
trap - EXIT
# Annotated video and sample images (vigil detect, one-shot mode; a progress line on a terminal).
echo "annotating vtest.avi (795 frames) and 3 of the sample images with vigil detect — about a minute on 2 cores"
echo "(the edge's 'samples' stream above read every /usr/share/darknet/data/*.jpg)"
"$vigil" --log-level warn detect --model "$model" --output-dir "$out/annotated" --threads "$(nproc)" "$video" \
  /usr/share/darknet/data/{dog,person,horses}.jpg

echo
echo "SQLite database : $out/vigil.db   (tables frames, events, detections)"
echo "statistics      : $out/stats.json"
echo "annotated video : $out/annotated/$(basename "${video%.*}").mp4"
echo "annotated images: $out/annotated/ (and detections.jsonl: one line per image detection or video frame)"
echo "logs            : $out/edge.log, $out/aggregator.log (warnings and errors only)"
echo "dashboard       : $vigil aggregator --config $out/agg.yaml, then open http://127.0.0.1:$http_port/"
echo
python3 - "$out/vigil.db" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
frames = con.execute("SELECT s.stream, COUNT(*), SUM(f.kind = 1), MAX(f.seq) + 1 FROM frames f "
                     "JOIN streams s ON s.id = f.stream_id GROUP BY s.stream").fetchall()
print("per stream: frames the aggregator stored; events = frames whose detections met the stream's rules (the rest")
print("are progress marks: processed, nothing that matched); seq span = the frames the run numbered")
print(f"{'stream':<10}{'frames':>8}{'events':>8}{'seq span':>10}")
for s, n, ev, span in frames:
    print(f"{s:<10}{n:>8}{ev:>8}{span:>10}")
print()
rows = con.execute("SELECT label, COUNT(*), ROUND(AVG(score), 2) FROM detections GROUP BY label "
                   "ORDER BY COUNT(*) DESC").fetchall()
print("detections the aggregator stored (the edge's rules keep score >= 0.4; vigil detect above lists conf > 0.25):")
print(f"{'class':<16}{'detections':>11}{'mean score':>12}")
for label, n, mean in rows:
    print(f"{label:<16}{n:>11}{mean:>12}")
PY
