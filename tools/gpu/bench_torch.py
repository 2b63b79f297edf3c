#!/usr/bin/env python3
"""vigil's CUDA engine vs PyTorch on the same GPU, architecture and weights (issue #4 benchmarks).

    python3 tools/gpu/bench_torch.py --engine vigil-engine --work /tmp/bench --out bench.json \
        [--archs yolov8n,yolo11n,yolo26n,yolox_nano] [--batches 1,8,32,64] [--compile default] [--autotune-b32]

Per architecture: Ultralytics builds the network from its YAML (no download) with a fixed seed,
fuses Conv+BatchNorm as its `predict` does, and exports that same module to ONNX (opset 17, dynamic
batch) for vigil; YOLOX-nano comes from tools/testmodels/yolox_nano.py. Then, at 640x640 fp16:
  - vigil: `vigil-engine bench engine --device cuda:0 --precision fp16 --batch B --json` (inputs
    resident on the GPU; per-call latency with a stream sync, and pipelined throughput);
  - PyTorch eager: module.half().cuda(), channels_last, torch.inference_mode();
  - torch.compile (mode "default"; "max-autotune" at batch 32 with --autotune-b32), compile time reported.
Timing (PyTorch): 20 warm-up calls, then 200 (batch <= 8) or 50 calls, each timed with CUDA events
around the call and a synchronize (latency percentiles); throughput = batch * calls / wall time of
the same loop without per-call syncs. Results: one JSON list, one object per (arch, batch, runner).
Test and benchmark tooling only; runs where PyTorch with CUDA is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "vigil-yolo-config"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

SEED = 20240601
IMGSZ = 640


def build(arch: str, work: Path):
    """(torch module in eval mode, fused; path of its ONNX export)."""
    torch.manual_seed(SEED)
    onnx_path = work / f"{arch}_{IMGSZ}_dyn.onnx"
    if arch == "yolox_nano":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testmodels"))
        import yolox_nano

        model = yolox_nano.yolox_nano().eval()
        if not onnx_path.exists():
            yolox_nano.export_onnx(model, str(onnx_path), (IMGSZ, IMGSZ), 1, 17, True)
        return model, onnx_path
    from ultralytics import YOLO

    yolo = YOLO(f"{arch}.yaml")
    if not onnx_path.exists():
        cwd = os.getcwd()
        os.chdir(work)
        try:
            p = yolo.export(format="onnx", imgsz=IMGSZ, dynamic=True, opset=17, simplify=False, device="cpu",
                            verbose=False)
        finally:
            os.chdir(cwd)
        (Path(p) if Path(p).is_absolute() else work / p).rename(onnx_path)
    model = yolo.model.fuse(verbose=False).eval()
    return model, onnx_path


def build_plain(arch: str, work: Path, dfl: str, ultra_onnx: Path) -> Path:
    """The same seeded network exported by PyTorch's own exporter from the module (C2f's chunk as channel Slices;
    dfl "reducesum": the DFL as softmax * arange summed), dynamic batch, 640 (tools/testmodels/plain_export.py)."""
    onnx_path = work / f"{arch}_{IMGSZ}_dyn_plain{'_rsdfl' if dfl == 'reducesum' else ''}.onnx"
    if not onnx_path.exists():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testmodels"))
        import plain_export
        from ultralytics import YOLO

        torch.manual_seed(SEED)
        yolo = YOLO(f"{arch}.yaml")  # the same weights as build(): same seed, same construction
        plain_export.export_plain(yolo, onnx_path, imgsz=(IMGSZ, IMGSZ), batch=1, opset=17, dynamic=True, dfl=dfl,
                                  metadata=ultra_onnx)
    return onnx_path


def time_torch(fn, x, iters: int) -> dict:
    with torch.inference_mode():
        for _ in range(20):
            fn(x)
        torch.cuda.synchronize()
        lat = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(x)
            e.record()
            e.synchronize()
            lat.append(s.elapsed_time(e))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(x)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(np.ceil(q * len(lat))) - 1)]  # noqa: E731
    return {"latency_ms": {"p50": pick(0.5), "p99": pick(0.99), "mean": float(np.mean(lat))},
            "throughput_images_per_s": x.shape[0] * iters / wall}


def bench_vigil(engine: str, onnx: Path, batch: int, iters: int) -> dict:
    cmd = [engine, "bench", "engine", "--model", str(onnx), "--device", "cuda:0", "--precision", "fp16", "--batch",
           str(batch), "--iters", str(iters), "--warmup", "20", "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-1500:]}
    j = json.loads(p.stdout)
    return {"latency_ms": j["latency_ms"], "host_io_latency_ms": j.get("host_io_latency_ms"),
            "throughput_images_per_s": j["pipelined_throughput_images_per_s"],
            "synced_throughput_images_per_s": j["throughput_images_per_s"], "load_ms": j["load_ms"],
            "arena_mib": j["arena_mib"], "wall_s": time.perf_counter() - t0,
            "ops": j["ops"][:8], "slowest_nodes": j["slowest_nodes"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench"))
    ap.add_argument("--models", type=Path, help="unused: models are built here")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--archs", default="yolov8n,yolo11n,yolo26n,yolox_nano")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--vigil-batches", default="", help="batches vigil is timed at (default: --batches)")
    ap.add_argument("--compile", default="default", help="'default' or 'none'")
    ap.add_argument("--autotune-b32", action="store_true")
    ap.add_argument("--torch-archs", default="yolov8n", help="architectures also timed in PyTorch ('none': none)")
    ap.add_argument("--quick-archs", default="", help="architectures timed by vigil only at the first and last "
                    "batch, with VIGIL_CUDNN_AUTOTUNE=2 (shorter loads)")
    ap.add_argument("--export-only", action="store_true", help="only write the ONNX files into --work")
    ap.add_argument("--plain-exports", default="", help="architectures vigil also times as PyTorch's own export of "
                    "the module, with the Conv DFL and with the ReduceSum DFL (issue 21: every spelling equally fast)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    if a.export_only:
        for arch in a.archs.split(","):
            print(build(arch, a.work)[1], flush=True)
        return 0
    torch.backends.cudnn.benchmark = True
    results = []

    def emit(r):
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("ops", "slowest_nodes")}), flush=True)
        a.out.write_text(json.dumps(results, indent=1))

    batches = [int(b) for b in a.batches.split(",")]
    quick = [q for q in a.quick_archs.split(",") if q]
    models = {}
    for arch in a.archs.split(",") + quick:  # vigil first: its results are the ones that must not be cut off
        model, onnx = build(arch, a.work)
        models[arch] = model
        if arch in quick:
            os.environ["VIGIL_CUDNN_AUTOTUNE"] = "2"
        vb = [int(b) for b in a.vigil_batches.split(",")] if a.vigil_batches else batches
        for b in ([vb[0], vb[-1]] if arch in quick else vb):
            emit({"arch": arch, "batch": b, "runner": "vigil fp16" + (" (autotune 2)" if arch in quick else ""),
                  **bench_vigil(a.engine, onnx, b, 200 if b <= 8 else 50)})
        os.environ.pop("VIGIL_CUDNN_AUTOTUNE", None)
        if arch in a.plain_exports.split(","):
            for dfl, label in (("conv", "plain"), ("reducesum", "plain_rsdfl")):
                plain = build_plain(arch, a.work, dfl, onnx)
                for b in vb:
                    emit({"arch": f"{arch}:{label}", "batch": b, "runner": "vigil fp16",
                          **bench_vigil(a.engine, plain, b, 200 if b <= 8 else 50)})
    for arch in [t for t in a.torch_archs.split(",") if t and t != "none"]:
        net = models[arch].half().cuda().to(memory_format=torch.channels_last)
        xs = {b: torch.rand(b, 3, IMGSZ, IMGSZ, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
              for b in batches}
        for b in batches:
            emit({"arch": arch, "batch": b, "runner": "torch eager fp16 channels_last",
                  **time_torch(net, xs[b], 200 if b <= 8 else 50)})
        if a.compile == "default":
            for b in batches:  # one static compilation per batch size, as a deployment would pin it
                torch._dynamo.reset()  # else the shared code objects hit dynamo's recompile limit and fall back to eager
                compiled = torch.compile(net, dynamic=False)
                t0 = time.perf_counter()
                with torch.inference_mode():
                    compiled(xs[b])
                torch.cuda.synchronize()
                emit({"arch": arch, "batch": b, "runner": "torch.compile default", "compile_s": time.perf_counter() - t0,
                      **time_torch(compiled, xs[b], 200 if b <= 8 else 50)})
        if a.autotune_b32 and 32 in xs:
            torch._dynamo.reset()
            tuned = torch.compile(net, mode="max-autotune", dynamic=False)
            t0 = time.perf_counter()
            with torch.inference_mode():
                tuned(xs[32])
            torch.cuda.synchronize()
            emit({"arch": arch, "batch": 32, "runner": "torch.compile max-autotune",
                  "compile_s": time.perf_counter() - t0, **time_torch(tuned, xs[32], 50)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
