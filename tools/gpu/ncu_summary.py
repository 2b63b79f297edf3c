#!/usr/bin/env python3
"""ncu_summary.py — one inference's Nsight Compute profile, summarised for docs/benchmarks.md.

Input: `ncu --import REPORT --csv --page raw` of a run made by scripts/gpu-check.sh's `profile` stage (one
batch of `vigil-engine bench engine --profile-range 1`, metrics gpu__time_duration.sum, dram__bytes_read.sum,
dram__bytes_write.sum, sm__throughput.avg.pct_of_peak_sustained_elapsed and
gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed): a header row, a units row, a row per
kernel. Kernels are grouped by kind (cuDNN convolutions, vigil's own kernels by name), and the whole
inference is placed against the card's measured ceilings (tools/gpu/ceilings.py's JSON): achieved DRAM
bandwidth vs the device-to-device copy rate, achieved FLOP rate vs the fp16 GEMM rate. ncu runs kernels one
at a time (serialised, caches flushed between replays by default), so the summed durations are an upper
bound of the graph's own time; the JSON says both.

  ncu_summary.py ncu-raw.csv --ceilings ceilings.json --gflop-per-image 8.7 --batch 64 > profile.json
"""
import argparse
import csv
import json
import re
import sys

TIME = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
         "Kibibyte": 1024, "Mebibyte": 1024**2, "Gibibyte": 1024**3, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}

# Kernel kinds, first match wins: vigil's own kernels by their template names (src/infer/cuda/kernels.cu,
# src/detect/cuda/detect_kernels.cu), then cuDNN/cuBLAS by their libraries' naming (both ship "xmma" kernels;
# cuDNN's convolutions say fprop/implicit/conv, so they are matched before any "gemm").
KINDS = [
    ("copy: Concat/Split/Slice/layout (StridedCopy, CopyRows)", r"StridedCopyKernel|CopyRowsKernel"),
    ("elementwise binary (Add, Mul, ...)", r"BinaryKernel|BinaryFlatKernel"),
    ("elementwise unary / bias+activation", r"UnaryKernel|BiasActivationKernel"),
    ("MaxPool", r"MaxPool(Group)?Kernel"),
    ("Resize (nearest)", r"ResizeNearestKernel"),
    ("Softmax", r"SoftmaxKernel"),
    ("detector stages (letterbox, decode, NMS)", r"LetterboxKernel|DecodeKernel|NmsKernel|MapKernel|SegmentOffsets|cub::|DeviceSegmentedRadixSort"),
    ("cuDNN convolution (incl. fused bias+SiLU)", r"cudnn|fprop|implicit|conv|nhwc|fusion|fort_native"),
    ("cuBLAS GEMM (MatMul)", r"gemm|cublas|Gemm"),
]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--ceilings", help="tools/gpu/ceilings.py's JSON")
    ap.add_argument("--gflop-per-image", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    if len(rows) < 3:
        sys.exit(f"ncu_summary.py: {args.csv}: no kernel rows")
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    name_col = next((col[c] for c in ("Kernel Name", "Function Name", "Demangled Name") if c in col), None)
    need = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"]
    if name_col is None or any(m not in col for m in need):
        sys.exit(f"ncu_summary.py: {args.csv}: columns missing (have {header[:20]}...)")
    sm_col = col.get("sm__throughput.avg.pct_of_peak_sustained_elapsed")
    mem_col = col.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")

    def scaled(row, metric, table):
        i = col[metric]
        v = number(row[i])
        scale = table.get(units[i].strip())
        if v is None or scale is None:
            sys.exit(f"ncu_summary.py: {metric}: cannot read '{row[i]}' in unit '{units[i]}'")
        return v * scale

    kernels = []
    for r in data:
        name = r[name_col]
        kind = next((k for k, pat in KINDS if re.search(pat, name)), "other")
        kernels.append({
            "name": name[:160], "kind": kind,
            "s": scaled(r, "gpu__time_duration.sum", TIME),
            "bytes": scaled(r, "dram__bytes_read.sum", BYTES) + scaled(r, "dram__bytes_write.sum", BYTES),
            "sm_pct": number(r[sm_col]) if sm_col is not None else None,
            "mem_pct": number(r[mem_col]) if mem_col is not None else None,
        })
    total_s = sum(k["s"] for k in kernels)
    total_b = sum(k["bytes"] for k in kernels)
    groups = {}
    for k in kernels:
        g = groups.setdefault(k["kind"], {"kernels": 0, "s": 0.0, "bytes": 0.0, "sm": 0.0, "mem": 0.0})
        g["kernels"] += 1
        g["s"] += k["s"]
        g["bytes"] += k["bytes"]
        g["sm"] += (k["sm_pct"] or 0) * k["s"]
        g["mem"] += (k["mem_pct"] or 0) * k["s"]
    out_groups = []
    for kind, g in sorted(groups.items(), key=lambda kv: -kv[1]["s"]):
        out_groups.append({
            "kind": kind, "kernels": g["kernels"], "ms": round(g["s"] * 1e3, 3),
            "percent_of_time": round(100 * g["s"] / total_s, 1),
            "dram_mb": round(g["bytes"] / 1e6, 1), "dram_gb_s": round(g["bytes"] / g["s"] / 1e9, 1) if g["s"] else 0,
            "sm_pct_time_weighted": round(g["sm"] / g["s"], 1) if g["s"] else 0,
            "memory_pct_time_weighted": round(g["mem"] / g["s"], 1) if g["s"] else 0,
        })
    top = sorted(kernels, key=lambda k: -k["s"])[:12]
    result = {
        "kernels": len(kernels), "summed_kernel_ms": round(total_s * 1e3, 3), "dram_mb": round(total_b / 1e6, 1),
        "dram_gb_s": round(total_b / total_s / 1e9, 1),
        "groups": out_groups,
        "top_kernels": [{"name": k["name"], "kind": k["kind"], "us": round(k["s"] * 1e6, 1),
                         "dram_gb_s": round(k["bytes"] / k["s"] / 1e9, 1), "sm_pct": k["sm_pct"],
                         "memory_pct": k["mem_pct"]} for k in top],
    }
    if args.gflop_per_image > 0:
        result["tflop_s"] = round(args.gflop_per_image * args.batch / total_s / 1e3, 1)
    if args.ceilings:
        with open(args.ceilings) as f:
            c = json.load(f)
        result["ceilings"] = c
        result["dram_fraction_of_copy_rate"] = round(result["dram_gb_s"] / c["d2d_copy_gb_s"], 3)
        if "tflop_s" in result:
            result["flop_fraction_of_gemm_rate"] = round(result["tflop_s"] / c["fp16_gemm_tflops"], 3)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
