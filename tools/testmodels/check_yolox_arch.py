#!/usr/bin/env python3
"""Check that yolox_nano.py is YOLOX-Nano exactly: load the real model's weights into it and compare.

    build/venv/bin/python tools/testmodels/check_yolox_arch.py [path/to/yolox_nano_coco_416_fp32.onnx]

Maps the real file's 113 Conv weights onto this module (BN folded) by walking both graphs from the
output in input order, then compares PyTorch's output with ORT's on dog.jpg (last run: max abs
difference 2e-4 on a scale of 3.6, i.e. fp32 noise). A developer check, not part of CI.
"""
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import yolox_nano as Y  # noqa: E402

REAL = sys.argv[1] if len(sys.argv) > 1 else str(HERE.parents[2] / "shared" / "models" / "yolox_nano_coco_416_fp32.onnx")
TMP = "/tmp/yolox_nano_arch_check.onnx"
m = Y.yolox_nano().eval()
for mod in m.modules():  # fold BN away so each conv has weight+bias params named by module
    if isinstance(mod, Y.BaseConv):
        mod.conv.bias = torch.nn.Parameter(torch.zeros(mod.conv.out_channels)); mod.bn = torch.nn.Identity()
torch.onnx.export(m, torch.zeros(1, 3, 416, 416), TMP, opset_version=11, do_constant_folding=False,
                  input_names=['images'], output_names=['output'])
def conv_order(g):
    prod = {o: n for n in g.node for o in n.output}; inits = {i.name for i in g.initializer}
    seen, order = set(), []
    def visit(t):
        n = prod.get(t)
        if n is None or id(n) in seen: return
        seen.add(id(n))
        if n.op_type == 'Conv': order.append(n)
        for i in n.input:
            if i not in inits: visit(i)
    sys.setrecursionlimit(100000); visit(g.output[0].name); return order
mine, real = onnx.load(TMP), onnx.load(REAL)
rinit = {i.name: numpy_helper.to_array(i) for i in real.graph.initializer}
sd = m.state_dict(); mo, ro = conv_order(mine.graph), conv_order(real.graph); print(len(mo), len(ro))
for a, b in zip(mo, ro):
    for k in (1, 2):
        w = rinit[b.input[k]]; assert sd[a.input[k]].shape == w.shape, (a.input[k], w.shape); sd[a.input[k]] = torch.from_numpy(w.copy())
m.load_state_dict(sd)
img = cv2.imread('/usr/share/darknet/data/dog.jpg'); r = min(416 / img.shape[0], 416 / img.shape[1])
rs = cv2.resize(img, (int(img.shape[1] * r), int(img.shape[0] * r)))
p = np.full((416, 416, 3), 114, np.uint8); p[:rs.shape[0], :rs.shape[1]] = rs; x = p.transpose(2, 0, 1)[None].astype(np.float32)
ref = ort.InferenceSession(REAL).run(None, {'images': x})[0]
with torch.no_grad(): out = m(torch.from_numpy(x)).numpy()
print(ref.shape, out.shape, 'max abs diff', np.abs(ref - out).max(), 'scale', np.abs(ref).max())
