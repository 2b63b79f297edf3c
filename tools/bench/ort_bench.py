#!/usr/bin/env python3
"""ONNX Runtime CPU latency/throughput/peak-RSS baseline for a model (test tooling only).

    build/venv/bin/python tools/bench/ort_bench.py --model M.onnx --batch 1 --threads 2 --iters 50 --json

Each measurement runs in a fresh child process, so the reported peak RSS (the child's ru_maxrss,
read by the parent through getrusage(RUSAGE_CHILDREN) after it exits) belongs to that one run:
session creation + warm-up + timed iterations. Symbolic H/W take --imgsz (default: the model's
static size, else 640); a symbolic batch takes --batch. Inputs are random with a fixed seed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def child(a) -> dict:
    import numpy as np
    import onnxruntime as ort

    t0 = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t0) * 1e3
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = []
        for k, d in enumerate(i.shape):
            static = isinstance(d, int) and d > 0
            if k == 0:
                shape.append(a.batch if a.batch_given or not static else d)
            elif static:
                shape.append(d)
            else:
                shape.append(a.imgsz[k - 2] if len(i.shape) == 4 and k >= 2 else 1)
        dtype = np.float16 if "float16" in i.type else np.float32
        feeds[i.name] = rng.random(shape, dtype=np.float32).astype(dtype)
    batch = next(iter(feeds.values())).shape[0]
    for _ in range(a.warmup):
        sess.run(None, feeds)
    lat = []
    t_all = time.perf_counter()
    for _ in range(a.iters):
        t = time.perf_counter()
        sess.run(None, feeds)
        lat.append((time.perf_counter() - t) * 1e3)
    total = time.perf_counter() - t_all
    lat = np.array(lat)
    return dict(engine="onnxruntime", version=ort.__version__, model=a.model, batch=int(batch), threads=a.threads,
                iters=a.iters, warmup=a.warmup, input_shapes={k: list(v.shape) for k, v in feeds.items()},
                load_ms=round(load_ms, 2), latency_ms=dict(p50=round(float(np.percentile(lat, 50)), 3),
                                                           p90=round(float(np.percentile(lat, 90)), 3),
                                                           p99=round(float(np.percentile(lat, 99)), 3),
                                                           mean=round(float(lat.mean()), 3),
                                                           min=round(float(lat.min()), 3)),
                throughput_ips=round(batch * a.iters / total, 3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=None, help="batch (default: the model's static batch, else 1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--imgsz", default="640,640", help="H,W for symbolic spatial dims")
    ap.add_argument("--json", action="store_true", help="print one JSON object (else a one-line summary)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.batch_given = a.batch is not None
    a.batch = a.batch or 1
    a.imgsz = [int(v) for v in a.imgsz.split(",")]
    if a.child:
        print(json.dumps(child(a)))
        return
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", a.model, "--threads", str(a.threads),
           "--iters", str(a.iters), "--warmup", str(a.warmup), "--imgsz", ",".join(map(str, a.imgsz))]
    if a.batch_given:
        cmd += ["--batch", str(a.batch)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"benchmark child failed ({p.returncode}):\n{p.stderr}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)  # KiB on Linux
    if a.json:
        print(json.dumps(res))
    else:
        lm = res["latency_ms"]
        print(f"{os.path.basename(a.model)} b{res['batch']} t{a.threads}: p50 {lm['p50']} ms, p99 {lm['p99']} ms, "
              f"{res['throughput_ips']} img/s, peak RSS {res['peak_rss_mb']} MiB")


if __name__ == "__main__":
    main()
