#!/usr/bin/env bash
# CPU engine benchmark, vigil side by side with ONNX Runtime (same model, same input size, same
# thread count, one process per measurement): YOLOv8n fp32 at 640, batch 1 and 4, threads 1 and 2.
# Prints a Markdown table for docs/benchmarks.md. Needs build/ (scripts/build.sh), build/venv
# (scripts/test-venv.sh) and build/testmodels (tools/testmodels/make_models.py).
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${ITERS:-30}
py=build/venv/bin/python
b1=build/testmodels/yolov8n_640_b1_op17.onnx      # static [1,3,640,640]
dyn=build/testmodels/yolov8n_320_dyn_op17.onnx    # dynamic batch/H/W, run at 640
$py - "$iters" "$b1" "$dyn" <<'PY'
import json, subprocess, sys
iters, b1, dyn = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
for batch, model in ((1, b1), (4, dyn)):
    for threads in (1, 2):
        v = json.loads(subprocess.run(
            ["build/src/vigil", "bench", "engine", "--model", model, "--batch", str(batch), "--imgsz", "640,640",
             "--threads", str(threads), "--iters", iters, "--warmup", "3", "--json"],
            check=True, capture_output=True, text=True).stdout)
        o = json.loads(subprocess.run(
            ["build/venv/bin/python", "tools/bench/ort_bench.py", "--model", model, "--batch", str(batch),
             "--imgsz", "640,640", "--threads", str(threads), "--iters", iters, "--json"],
            check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        rows.append((batch, threads, v, o))
print("| batch | threads | vigil p50 / p99 ms | ORT p50 / p99 ms | latency ratio (p50) | vigil img/s | ORT img/s | vigil peak RSS MiB | ORT peak RSS MiB | RSS ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for batch, threads, v, o in rows:
    vl, ol = v["latency_ms"], o["latency_ms"]
    print(f"| {batch} | {threads} | {vl['p50']:.1f} / {vl['p99']:.1f} | {ol['p50']:.1f} / {ol['p99']:.1f} | "
          f"{vl['p50'] / ol['p50']:.2f} | {v['throughput_images_per_s']:.2f} | {o['throughput_ips']:.2f} | "
          f"{v['peak_rss_mib']:.0f} | {o['peak_rss_mb']:.0f} | {v['peak_rss_mib'] / o['peak_rss_mb']:.2f} |")
print()
v = next(r[2] for r in rows if r[0] == 1 and r[1] == 2)
print("Five slowest ops (vigil, batch 1, 2 threads, ms per run summed over nodes of that op and kernel):")
print()
for op in sorted(v["ops"], key=lambda o: -o["ms_per_run"])[:5]:
    print(f"- {op['op_type']} ({op['kernel']}, {op['count']} nodes): {op['ms_per_run']:.1f} ms")
print()
print(f"ONNX Runtime {rows[0][3].get('version', '?')}")
PY
