#!/usr/bin/env python3
"""CPU latency of int8-dynamic YOLOv8n as exported vs its float paths and ONNX Runtime (issue 21's benchmark).

    build/venv/bin/python tools/bench_int8_cpu.py --vigil build/src/vigil --int8 ../shared/models/yolov8n_coco_640_int8dyn.onnx \
        --fp32 build/testmodels/yolov8n_640_b1_op17.onnx --out int8_cpu.json [--threads 2] [--iters 30]

Times, at batch 1 and the same thread count, alternating the runners round by round so that a busy neighbour on a
shared machine hits them all alike:
  - vigil on the int8 file, `--int8-activations quantized` (as exported: ONNX Runtime's arithmetic) and `float`;
  - vigil on an fp32 YOLOv8n export (the same architecture; random weights change no op or shape);
  - ONNX Runtime (CPUExecutionProvider, intra-op threads = --threads, all graph optimisations) on both files.
vigil: `vigil bench engine --json` (its p50 over --iters timed runs after 3 warm-up); ORT: the p50 of --iters
session.run calls after 3 warm-up, on a random 640x640 input. Prints a table and writes every round's numbers.
Test and benchmark tooling only (ONNX Runtime is never a product dependency).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np


def vigil_p50(vigil: str, model: str, threads: int, iters: int, *extra: str) -> float:
    cmd = [vigil, "bench", "engine", "--model", model, "--threads", str(threads), "--iters", str(iters), "--warmup", "3",
           "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(p.stdout)["latency_ms"]["p50"])


def ort_p50(model: str, threads: int, iters: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((1, 3, 640, 640), dtype=np.float32)
    name = s.get_inputs()[0].name
    for _ in range(3):
        s.run(None, {name: x})
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        s.run(None, {name: x})
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--int8", required=True)
    ap.add_argument("--fp32", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    runners = {
        "vigil int8, activations quantized (as exported)": lambda: vigil_p50(a.vigil, a.int8, a.threads, a.iters),
        "vigil int8, activations float": lambda: vigil_p50(a.vigil, a.int8, a.threads, a.iters,
                                                           "--int8-activations", "float"),
        "vigil fp32": lambda: vigil_p50(a.vigil, a.fp32, a.threads, a.iters),
        "ONNX Runtime int8": lambda: ort_p50(a.int8, a.threads, a.iters),
        "ONNX Runtime fp32": lambda: ort_p50(a.fp32, a.threads, a.iters),
    }
    rounds = {k: [] for k in runners}
    for _ in range(a.rounds):
        for k, fn in runners.items():
            rounds[k].append(fn())
    result = {"threads": a.threads, "iters": a.iters, "int8": a.int8, "fp32": a.fp32,
              "p50_ms_per_round": rounds, "p50_ms": {k: statistics.median(v) for k, v in rounds.items()}}
    a.out.write_text(json.dumps(result, indent=1))
    print(f"{'runner':52s} p50 ms (median of {a.rounds} rounds; each round's p50)")
    for k, v in rounds.items():
        print(f"{k:52s} {statistics.median(v):7.1f}   {', '.join(f'{x:.1f}' for x in v)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
