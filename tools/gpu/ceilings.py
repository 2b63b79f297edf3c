#!/usr/bin/env python3
"""ceilings.py — the GPU's measured compute and memory-bandwidth ceilings, for the roofline in
docs/benchmarks.md (scripts/gpu-check.sh's `profile` stage). PyTorch is the measuring tool (present on the
GPU machine); nothing of vigil runs here.

  * fp16 tensor-core GEMM: torch.matmul of two 8192 x 8192 fp16 matrices (cuBLAS), 2*n^3 FLOP per call;
  * DRAM bandwidth: copy of a 2 GiB buffer device-to-device (read + write = 4 GiB moved per copy), and a
    read-only pass (sum of a 2 GiB fp16 tensor);
  * device-to-device memcpy also gives what the Concat/Split copies of a model can reach.
Each figure is the best of 5 timed rounds (CUDA events) after warm-up; clocks are left as they are.
Prints one JSON object.
"""
import json
import sys

import torch


def best_ms(fn, rounds=5, reps=10):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop) / reps)
    return best


def main():
    if not torch.cuda.is_available():
        sys.exit("ceilings.py: no CUDA device")
    dev = torch.device("cuda:0")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.float16)
    b = torch.randn(n, n, device=dev, dtype=torch.float16)
    gemm_ms = best_ms(lambda: torch.matmul(a, b))
    del a, b
    nbytes = 2 << 30
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.float16).normal_()
    dst = torch.empty_like(src)
    copy_ms = best_ms(lambda: dst.copy_(src), reps=5)
    read_ms = best_ms(lambda: src.sum(dtype=torch.float32), reps=5)
    props = torch.cuda.get_device_properties(dev)
    print(json.dumps({
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "fp16_gemm_tflops": round(2 * n**3 / (gemm_ms * 1e-3) / 1e12, 1),
        "gemm": f"torch.matmul fp16 {n}x{n}x{n}, {gemm_ms:.3f} ms",
        "d2d_copy_gb_s": round(2 * nbytes / (copy_ms * 1e-3) / 1e9, 1),
        "read_gb_s": round(nbytes / (read_ms * 1e-3) / 1e9, 1),
        "copy": f"2 GiB device-to-device, {copy_ms:.3f} ms (read + write counted); read-only sum {read_ms:.3f} ms",
        "torch": torch.__version__,
    }, indent=1))


if __name__ == "__main__":
    main()
