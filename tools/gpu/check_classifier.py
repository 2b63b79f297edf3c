#!/usr/bin/env python3
"""The aggregator's second model on the GPU (issue 20): `vigil model classify --device cuda:0` against the CPU backend
(itself checked against ONNX Runtime by tests/models/test_classifier.py), and what one crop costs on each.

    python3 tools/gpu/check_classifier.py --vigil vigil --images DIR --out result.json

Builds two classifiers here with PyTorch (seeded, random weights): Ultralytics' YOLOv8n-cls from its YAML at 224
(Softmax at the end; the wheels `pack` carries) and a plain PyTorch module exported at opset 13 (logits). Cuts crops
of the pictures in DIR (JPEG), runs `vigil model classify --json` on the CPU and on cuda:0, and requires the same top
class and probabilities within 1e-3 for every crop. Timing: after a first run (the GPU's cuDNN plans chosen and kept
in VIGIL_CUDNN_PLAN_CACHE), the wall time of a run over N crops minus a run over one crop, per crop (load and warm-up
excluded), on each device. Exit status 1 when a crop differs. Test tooling only.
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

import cv2
import numpy as np
import torch


def ultralytics_cls(out: Path) -> Path:
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO
    torch.manual_seed(0)
    path = YOLO("yolov8n-cls.yaml").export(format="onnx", imgsz=224, opset=17, simplify=False, dynamic=False)
    target = out / "yolov8n-cls-224.onnx"
    Path(path).replace(target)
    return target


def plain_cls(out: Path) -> Path:
    torch.manual_seed(1)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 5)).eval()
    with torch.no_grad():
        m[-1].weight.mul_(8.0)
    target = out / "plain-cls-96.onnx"
    torch.onnx.export(m, torch.zeros(1, 3, 96, 96), str(target), opset_version=13, input_names=["images"],
                      output_names=["logits"])
    return target


def crops(images: Path, out: Path, count: int) -> list[Path]:
    pictures = sorted(p for p in images.glob("*.jpg"))
    rng = np.random.default_rng(0)
    paths = []
    while len(paths) < count:
        img = cv2.imread(str(pictures[len(paths) % len(pictures)]))
        h, w = img.shape[:2]
        x1, y1 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        x2, y2 = x1 + int(rng.integers(32, w // 2)), y1 + int(rng.integers(32, h // 2))
        p = out / f"crop{len(paths):03d}.jpg"
        cv2.imwrite(str(p), img[y1:y2, x1:x2], [cv2.IMWRITE_JPEG_QUALITY, 85])
        paths.append(p)
    return paths


def classify(vigil: str, model: Path, device: str, pictures: list[Path]) -> tuple[list[dict], float]:
    t0 = time.monotonic()
    r = subprocess.run([vigil, "model", "classify", "--model", str(model), "--device", device, "--json",
                        *map(str, pictures)], capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{device}: {r.stderr[-2000:]}")
    return json.loads(r.stdout), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--images", required=True, type=Path)
    ap.add_argument("--crops", type=int, default=200)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda:0", help="the device compared with the CPU (cpu: a dry run here)")
    a = ap.parse_args()
    result, failed = {"models": []}, False
    with tempfile.TemporaryDirectory(prefix="vigil-cls-") as tmp:
        work = Path(tmp)
        pictures = crops(a.images, work, a.crops)
        for make in (ultralytics_cls, plain_cls):
            model = make(work)
            row = {"model": model.name}
            got = {}
            for device in ("cpu", a.device):
                first = classify(a.vigil, model, device, pictures[:1])[1]  # cuDNN plans chosen, kept in the cache
                one = classify(a.vigil, model, device, pictures[:1])[1]
                got[device], wall = classify(a.vigil, model, device, pictures)
                row[f"{device}_ms_per_crop"] = 1e3 * (wall - one) / (len(pictures) - 1)
                row[f"{device}_first_load_s"] = first  # a cold load (the GPU: cuDNN plans timed)
                row[f"{device}_one_crop_s"] = one  # a warm load and one crop
            worst, flips = 0.0, 0
            for c, g in zip(got["cpu"], got[a.device]):
                worst = max(worst, float(np.max(np.abs(np.array(c["probabilities"]) - np.array(g["probabilities"])))))
                flips += c["index"] != g["index"]
            row.update({"crops": len(pictures), "max_abs_prob_diff": worst, "top_class_differs": flips})
            row["pass"] = worst <= 1e-3 and flips == 0
            failed |= not row["pass"]
            result["models"].append(row)
            print(json.dumps(row), flush=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
