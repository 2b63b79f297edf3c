#!/usr/bin/env bash
# The main job on this machine: sets up, builds and runs vigil on sample images.
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
scripts/deps.sh build
scripts/build.sh >/dev/null
out=runs/demo
rm -rf "$out"
images=(/usr/share/darknet/data/{dog,person,horses,giraffe,kite}.jpg
        /usr/share/doc/opencv-doc/examples/data/{messi5.jpg,basketball1.png,fruits.jpg})
build/src/vigil detect --model "$model" --output-dir "$out" --json "$out/detections.jsonl" "${images[@]}"
echo
echo "annotated images : $out/"
echo "detections (JSON): $out/detections.jsonl"
echo
echo "detections per class:"
python3 - "$out/detections.jsonl" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
per = collections.Counter(r["name"] for r in rows)
print(f"  {'class':<16}{'count':>6}")
for name, n in per.most_common():
    print(f"  {name:<16}{n:>6}")
print(f"  {'total':<16}{len(rows):>6}")
PY
