#!/usr/bin/env python3
"""Equivalent exports of one network (issue 21): one YOLOv8n, three ONNX spellings.

    build/venv/bin/python tools/testmodels/plain_export.py --out DIR [--imgsz 320] [--opset 17]

Writes, from one seeded random-weight YOLOv8n, into DIR:
  yolov8n_{S}_b1_op{O}_ultra.onnx        Ultralytics' own exporter (C2f -> forward_split -> ONNX Split)
  yolov8n_{S}_b1_op{O}_plain.onnx        plain torch.onnx.export, C2f keeps chunk(2, 1) -> channel Slices
  yolov8n_{S}_b1_op{O}_plain_rsdfl.onnx  as _plain, but DFL as softmax * arange -> ReduceSum instead of a 1x1 Conv
All three are the same function with the same output0 [B, 84, anchors] and the same metadata_props, so vigil
must compile them to the same plan and give equal outputs. The CLI prints each file's ONNX op-type counts and
checks the outputs agree under onnxruntime (CPU); exit status 1 when they do not.
Note: torch 1.13 spells each chunk as two Slices whose ends come from Shape->Gather->Add->Div->Mul of the
(static) input shape, not constants, so _plain also carries 8 such small shape subgraphs.

`export_plain` is importable (e.g. from tests) and works on any built `ultralytics.YOLO` detection model. It
mirrors what ultralytics/engine/exporter.py does to the model before export (eval, float, fuse, Detect
export flags, dry run, metadata, IR version cap) except the C2f forward_split swap. No network needed.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch

# Ultralytics: no network, no settings in $HOME, quiet.  Must be set before importing it.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "yolo-cfg"))

SEED = 20240601


def _hw(imgsz):
    return [int(imgsz), int(imgsz)] if isinstance(imgsz, int) else [int(s) for s in imgsz]


def export_ultra(yolo_model, path, imgsz=(320, 320), batch=1, opset=17, dynamic=False):
    """Ultralytics' own ONNX export (no simplify, no NMS), run in a temp dir and moved to `path`."""
    path = Path(path).resolve()
    with tempfile.TemporaryDirectory() as td, contextlib.chdir(td):
        p = yolo_model.export(format="onnx", imgsz=_hw(imgsz), batch=batch, opset=opset, simplify=False,
                              dynamic=dynamic, device="cpu", nms=False, verbose=False)
        shutil.move(p, path)
    return path


def _dfl_reducesum(self, x):
    """DFL as softmax . arange summed over the bins (ONNX ReduceSum); equals DFL.forward's 1x1 Conv."""
    b, _, a = x.shape  # batch, 4 * c1, anchors
    w = torch.arange(self.c1, dtype=x.dtype, device=x.device).view(1, 1, self.c1, 1)
    return (x.view(b, 4, self.c1, a).softmax(2) * w).sum(2)  # [b, 4, a]


def export_plain(yolo_model, path, imgsz=(320, 320), batch=1, opset=17, dynamic=False, dfl="conv", metadata=None):
    """Export `yolo_model.model` with torch.onnx.export, as Ultralytics would but keeping C2f's chunk forward.

    dfl: "conv" keeps the DFL module (1x1 Conv with arange weights); "reducesum" swaps its forward on the copy.
    metadata: ONNX metadata_props to write, as an ONNX file path or (key, value) pairs; None exports the model
    with Ultralytics once (temp dir) and copies that file's props, so vigil reads both the same way.
    """
    import onnx
    from ultralytics.nn.modules import DFL, Detect

    assert dfl in ("conv", "reducesum"), dfl
    hw = _hw(imgsz)
    if metadata is None:
        with tempfile.TemporaryDirectory() as td:
            metadata = export_ultra(yolo_model, Path(td) / "ultra.onnx", hw, batch, opset, dynamic)
            metadata = [(p.key, p.value) for p in onnx.load(str(metadata)).metadata_props]
    elif isinstance(metadata, (str, Path)):
        metadata = [(p.key, p.value) for p in onnx.load(str(metadata)).metadata_props]

    model = copy.deepcopy(yolo_model.model).cpu()
    for p in model.parameters():
        p.requires_grad = False
    model = model.eval().float().fuse(verbose=False)
    stride = model.stride.tolist()
    for m in model.modules():  # exporter.py's Detect settings for format="onnx", nms=False; no C2f change
        if isinstance(m, Detect):
            m.dynamic, m.export, m.format = dynamic, True, "onnx"
            m.max_det = min(300, sum(int(hw[0] / s) * int(hw[1] / s) for s in stride))
            m.agnostic_nms, m.xyxy, m.shape = False, False, None
        if isinstance(m, DFL) and dfl == "reducesum":
            m.forward = types.MethodType(_dfl_reducesum, m)
    im = torch.zeros(batch, model.yaml.get("channels", 3), *hw)
    model(im)  # dry run, as the exporter does: caches anchors/strides for the static shape
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}}
    torch.onnx.export(model, im, str(path), opset_version=opset, input_names=["images"],
                      output_names=["output0"], dynamic_axes=axes if dynamic else None)
    mo = onnx.load(str(path))
    for k, v in metadata:
        mo.metadata_props.add(key=k, value=v)
    mo.ir_version = min(mo.ir_version, 10)  # as the exporter does
    onnx.save(mo, str(path))
    return Path(path)


def op_counts(path):
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def run_ort(path, x):
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(["output0"], {"images": x})[0]


def main():
    import numpy as np
    from ultralytics import YOLO

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--opset", type=int, default=17)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(SEED)
    yolo = YOLO("yolov8n.yaml")
    stem = a.out / f"yolov8n_{a.imgsz}_b1_op{a.opset}"
    kw = dict(imgsz=(a.imgsz, a.imgsz), batch=1, opset=a.opset)
    ultra = export_ultra(yolo, f"{stem}_ultra.onnx", **kw)
    files = {"ultra": ultra,
             "plain": export_plain(yolo, f"{stem}_plain.onnx", dfl="conv", metadata=ultra, **kw),
             "plain_rsdfl": export_plain(yolo, f"{stem}_plain_rsdfl.onnx", dfl="reducesum", metadata=ultra, **kw)}

    outs = {}
    x = np.random.default_rng(SEED).random((1, 3, a.imgsz, a.imgsz), dtype=np.float32)
    for k, f in files.items():
        c = op_counts(f)
        print(f"{f.name}: {sum(c.values())} nodes  " + " ".join(f"{op}={n}" for op, n in sorted(c.items())))
        outs[k] = run_ort(f, x)
        print(f"  output0 {list(outs[k].shape)}")

    u, p, r = outs["ultra"], outs["plain"], outs["plain_rsdfl"]
    up = float(np.abs(u - p).max())
    pr_abs = float(np.abs(p - r).max())
    pr_rel = pr_abs / float(np.abs(p).max())
    pr_elem = float((np.abs(p - r) / np.maximum(np.abs(p), 1e-3)).max())
    print(f"ultra vs plain:       max abs diff {up:.3g}")
    print(f"plain vs plain_rsdfl: max abs diff {pr_abs:.3g} (output max {np.abs(p).max():.4g}), "
          f"relative to max {pr_rel:.3g}, elementwise relative (|ref| floor 1e-3) {pr_elem:.3g}")
    ok = up <= 1e-4 and pr_rel <= 1e-5
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
