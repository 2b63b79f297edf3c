#!/usr/bin/env bash
# Pipeline benchmark: `vigil edge` with 4 file streams (opencv-doc's vtest.avi, realtime off) into
# `vigil aggregator` on loopback, next to `vigil bench engine` on the same model, batch and threads
# (method: tools/bench/pipeline_bench.py). Prints Markdown rows for docs/benchmarks.md.
# Usage: scripts/bench-pipeline.sh [MODEL BATCH]...   (pairs; default: the shared int8 YOLOv8n at batch 1
# and the generated dynamic YOLOv8n at batch 4). Env: FRAMES per stream (200), STREAMS (4), THREADS (nproc).
# Needs build/src/vigil (scripts/build.sh), ffmpeg, opencv-doc; the default models need ../shared/models
# and build/testmodels (tools/testmodels/make_models.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  set -- ../shared/models/yolov8n_coco_640_int8dyn.onnx 1 build/testmodels/yolov8n_320_dyn_op17.onnx 4
fi
echo "| model | batch | streams x frames | pipeline frames/s | engine images/s before / after | ratio (to the faster) | frame-to-stored p50 / p99 ms | ms per frame: decode / preprocess / inference / postprocess / publish | CPU ms per frame: edge / aggregator |"
echo "|---|---|---|---|---|---|---|---|---|"
while [[ $# -ge 2 ]]; do
  python3 tools/bench/pipeline_bench.py --model "$1" --batch "$2" --frames "${FRAMES:-200}" \
    --streams "${STREAMS:-4}" --threads "${THREADS:-$(nproc)}" --out "runs/bench-pipeline/$(basename "$1" .onnx)-b$2"
  shift 2
done
echo
echo "$(date -u +%F), $(nproc) CPUs, load average before the last run ended: $(cut -d' ' -f1-3 /proc/loadavg)"
