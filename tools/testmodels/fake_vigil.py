#!/usr/bin/env python3
"""A stand-in for the vigil CLI built on ONNX Runtime + oracle.py, to validate tests/models itself.

Implements the CLI contract the tests are written against (`model run`, `model inspect`, `detect`)
so the suites can be shown to pass on a correct implementation before the C++ one exists:

    printf '#!/bin/sh\\nexec %s %s "$@"\\n' build/venv/bin/python tools/testmodels/fake_vigil.py > /tmp/vigil
    chmod +x /tmp/vigil && VIGIL_BIN=/tmp/vigil build/venv/bin/python -m pytest tests/models

Set FAKE_VIGIL_BUG=letterbox|sigmoid|nms to inject a defect and see the tests catch it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

BUG = os.environ.get("FAKE_VIGIL_BUG", "")


def fail(msg: str):
    print(f"vigil: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    import onnx

    if not Path(path).is_file():
        fail(f"{path}: no such file")
    try:
        m = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001
        fail(f"{path}: not a valid ONNX model ({type(e).__name__})")
    if not m.graph.node:
        fail(f"{path}: not a valid ONNX model (empty graph)")
    return m


def unsupported(m):
    import onnx

    opset = {o.domain or "ai.onnx": o.version for o in m.opset_import}
    out = []
    for n in m.graph.node:
        dom = n.domain or "ai.onnx"
        if dom != "com.microsoft" and not onnx.defs.has(n.op_type, n.domain):
            out.append({"op_type": n.op_type, "node": n.name, "domain": dom, "opset": opset.get(dom)})
    return out


def cmd_run(a):
    import onnxruntime as ort

    m = load(a.model)
    bad = unsupported(m)
    if bad:
        b = bad[0]
        fail(f"unsupported op {b['op_type']} (node '{b['node']}', {b['domain']} opset {b['opset']})")
    feeds = {}
    for spec in a.input:
        name, _, path = spec.partition("=")
        feeds[name] = np.load(path)
    names = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    for k in feeds:
        if k not in names:
            fail(f"no graph input named {k!r} (inputs: {names})")
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001
        node = re.search(r"[Nn]ode(?: name)?[ :(']*([\w/.:-]+)", str(e))
        fail(f"{a.model}: {node.group(1) if node else ''}: {e}")
    os.makedirs(a.output_dir, exist_ok=True)
    for o, v in zip(sess.get_outputs(), outs):
        if BUG == "sigmoid" and v.ndim == 3:
            v = v.copy()
            v[:, 4:] = np.clip(v[:, 4:] * 1.001, 0, 1)
        np.save(Path(a.output_dir) / (re.sub(r"[/:]", "_", o.name) + ".npy"), v.astype(np.float32))


def cmd_inspect(a):
    import oracle
    import onnxruntime as ort

    m = load(a.model)
    tn = {1: "float32", 10: "float16", 7: "int64"}

    def io(v):
        t = v.type.tensor_type
        return {"name": v.name, "dtype": tn.get(t.elem_type, str(t.elem_type)),
                "shape": [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]}

    meta = {p.key: p.value for p in m.metadata_props}
    family = "unknown"
    try:
        sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
        shp = sess.get_inputs()[0].shape
        imgsz = [d if isinstance(d, int) else 640 for d in shp[2:]] if len(shp) == 4 else None
        if imgsz:
            family = oracle.model_family(sess, imgsz, meta)
    except Exception:  # noqa: BLE001
        pass
    nc = 80
    print(json.dumps({"inputs": [io(v) for v in m.graph.input], "outputs": [io(v) for v in m.graph.output],
                      "family": family, "names": oracle.class_names(meta, nc),
                      "op_counts": dict(collections.Counter(n.op_type for n in m.graph.node)),
                      "unsupported_ops": unsupported(m)}))


def cmd_detect(a):
    import cv2
    import onnxruntime as ort

    import oracle

    m = load(a.model)
    sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    if len(inp.shape) != 4 or inp.shape[1] != 3:
        fail(f"model input {inp.name!r} has shape {inp.shape}: not an image tensor [N,3,H,W]")
    del m
    imgsz = [int(v) for v in a.imgsz.split(",")] if a.imgsz else [d if isinstance(d, int) else 640 for d in inp.shape[2:]]
    if BUG == "letterbox":
        orig = oracle.letterbox_ultralytics
        oracle.letterbox_ultralytics = lambda img, s, color=114: (lambda r: (np.roll(r[0], 1, 2), r[1], r[2]))(orig(img, s, color))
    ok, recs = 0, []
    for p in a.paths:
        if cv2.imread(p) is None:
            print(f"vigil: error: cannot read image {p}", file=sys.stderr)
            continue
        ok += 1
        recs += oracle.detect(a.model, [p], conf=a.conf, iou=a.iou if BUG != "nms" else 0.95, max_det=a.max_det,
                              agnostic=a.agnostic, imgsz=imgsz)
    if a.json:
        with open(a.json, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    sys.exit(0 if ok else 1)


def main():
    ap = argparse.ArgumentParser(prog="vigil")
    sub = ap.add_subparsers(dest="cmd", required=True)
    mp = sub.add_parser("model").add_subparsers(dest="sub", required=True)
    r = mp.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--input", action="append", default=[])
    r.add_argument("--output-dir", required=True)
    r.add_argument("--threads", type=int, default=1)
    i = mp.add_parser("inspect")
    i.add_argument("model")
    i.add_argument("--json", action="store_true")
    d = sub.add_parser("detect")
    d.add_argument("--model", required=True)
    d.add_argument("--conf", type=float, default=0.25)
    d.add_argument("--iou", type=float, default=0.7)
    d.add_argument("--max-det", type=int, default=300)
    d.add_argument("--agnostic", action="store_true")
    d.add_argument("--imgsz")
    d.add_argument("--json")
    d.add_argument("--output-dir")
    d.add_argument("--no-save", action="store_true")
    d.add_argument("--threads", type=int, default=1)
    d.add_argument("paths", nargs="+")
    a = ap.parse_args()
    if a.cmd == "detect":
        cmd_detect(a)
    elif a.sub == "run":
        cmd_run(a)
    else:
        cmd_inspect(a)


if __name__ == "__main__":
    main()
