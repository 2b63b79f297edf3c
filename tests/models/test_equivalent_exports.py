"""Equivalent exports of one network compile to the same plan and give the same outputs (issue 21, item 3).

The generated models (tools/testmodels/make_models.py make_equivalent) include one calibrated YOLOv8n at 320
exported five ways; each non-anchor entry names its anchor (`equivalent_to`, the simplified opset-17 Ultralytics
export) and what differs (`spelling`): unsimplified, opset 11, PyTorch's own exporter from the module (C2f's
chunk as channel Slices instead of Split) and that with the DFL as softmax * arange summed (ReduceSum) instead of
a 1x1 convolution. For each pair:
- the CUDA plan `vigil model inspect --device cuda:0 --precision fp16` computes without a GPU has the same NHWC
  region (values) and the same layout conversions, and no host node (a Slice that broke the region cost 21
  conversions instead of 6 and 2x the time on the H200); the unsimplified and the channel-Slice spellings have the
  anchor's very nodes (ops and kernels, counted: the Slices become the Split);
- `vigil model run` on the CPU gives the anchor's outputs bit for bit, except the DFL spelling, whose sums are
  ordered differently: within 1e-5 of the output's largest value.
"""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("cv2")

import oracle  # noqa: E402
from common import MODELS_DIR, describe, model_params, model_path, output_file, vigil  # noqa: E402


def plan_of(model) -> dict:
    p = vigil("model", "inspect", model, "--json", "--device", "cuda:0", "--precision", "fp16")
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    if "no CUDA backend" in j.get("plan_error", ""):
        pytest.skip("this build has no CUDA backend")
    assert "plan" in j, j
    return j["plan"]


def run(tmp_path, model, x) -> np.ndarray:
    np.save(tmp_path / "x.npy", x)
    p = vigil("model", "run", "--model", model, "--input", f"images={tmp_path / 'x.npy'}", "--output-dir",
              tmp_path / "out", "--threads", 2)
    assert p.returncode == 0, describe(p)
    return np.load(output_file(tmp_path / "out", "output0"))


@pytest.mark.parametrize("entry", model_params(lambda e: "equivalent_to" in e))
def test_equivalent_export_same_plan_same_outputs(tmp_path, entry):
    model, anchor = model_path(entry), MODELS_DIR / entry["equivalent_to"]
    assert anchor.is_file(), f"{anchor} missing"
    a, b = plan_of(anchor), plan_of(model)
    for key in ("channels_last_values", "conversions", "host_nodes"):
        assert b[key] == a[key], f"{entry['spelling']}: {key} {b[key]} vs the anchor's {a[key]}"
    assert b["host_nodes"] == 0 and b["conversions"] == 6, b
    if entry["spelling"] in ("unsimplified", "torch.onnx.export: channel Slices"):
        # The same nodes, kernel by kernel (passes.h SlicesToSplit merges the chunk's Slices into the Split); the
        # exporters order them differently.
        ops = lambda p: Counter((n["op"], n["kernel"]) for n in p["nodes"])  # noqa: E731
        assert ops(b) == ops(a), f"{entry['spelling']}: {ops(b) - ops(a)} more, {ops(a) - ops(b)} fewer"
    x = oracle.make_batch("ultralytics", 1, (320, 320), images=oracle.sample_images()[:1])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    want, got = run(tmp_path / "a", anchor, x), run(tmp_path / "b", model, x)
    assert got.shape == want.shape
    if "ReduceSum" in entry["spelling"]:
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err <= 1e-5, f"{entry['spelling']}: {err:.3g} of the largest output"
    else:
        differ = int((got != want).sum())
        assert differ == 0, f"{entry['spelling']}: {differ} values differ, max {np.abs(got - want).max():.3g}"
