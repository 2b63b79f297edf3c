"""int8-dynamic models as exported (issue 21): vigil's CPU results against ONNX Runtime on the int8 file itself.

By default (`--int8-activations quantized`) vigil quantizes every activation exactly as the model's
DynamicQuantizeLinear defines it, sums the integer products in a float32 convolution (exact while the sums stay
below 2^24) and applies the export's own scale Mul and bias Add; its Sigmoid is MLAS's rational logistic with
fused multiply-adds (src/infer/ops/elementwise.cc). That is ONNX Runtime's arithmetic, so on an x86 CPU with FMA
the scores come out equal bit for bit (the real int8 YOLOv8n, four sample pictures) and the boxes within 0.3 px
(the one float op vigil does not share with ORT before a quantization is the DFL's softmax). The assertions leave
room for what can legitimately differ on another machine (a CPU without FMA takes MLAS's SSE2 sigmoid; one
different last bit can move one activation by one quantization level), and detections are held to the issue's
rule — same classes, IoU >= 0.9, |dscore| <= 0.02, both ways. `--int8-activations float` (activations kept in float) is held to ORT on
the file's float twin in test_raw_outputs.py.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import oracle  # noqa: E402
from common import describe, output_file, read_jsonl, shared_model, vigil  # noqa: E402

IOU = 0.7


def has_fma() -> bool:
    try:
        return " fma" in open("/proc/cpuinfo").read()
    except OSError:
        return False


def run_raw(tmp_path, model, x: np.ndarray, *extra) -> np.ndarray:
    np.save(tmp_path / "x.npy", x)
    p = vigil("model", "run", "--model", model, "--input", f"images={tmp_path / 'x.npy'}", "--output-dir",
              tmp_path / "out", "--threads", 2, *extra)
    assert p.returncode == 0, describe(p)
    return np.load(output_file(tmp_path / "out", "output0"))


def test_sigmoid_is_onnxruntimes_bit_for_bit(tmp_path):
    """The reference Sigmoid against ORT's on 200,000 values over [-25, 25] and the special values."""
    if not has_fma():
        pytest.skip("ONNX Runtime takes its SSE2 sigmoid on a CPU without FMA")
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "sigmoid",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [200_008])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [200_008])])
    model = tmp_path / "sigmoid.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model))
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-25, 25, 200_000),
                        [0.0, -0.0, 18.0, -18.0, 40.0, -40.0, np.inf, -np.inf]]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    p = vigil("model", "run", "--model", model, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    assert p.returncode == 0, describe(p)
    got = np.load(output_file(tmp_path / "out", "y"))
    want = oracle.ort_session(model).run(None, {"x": x})[0]
    differ = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, f"{differ.size} values differ, e.g. x={x[differ[:5]]}: {got[differ[:5]]} vs {want[differ[:5]]}"


def test_real_int8_yolov8n_raw_outputs_are_onnxruntimes(tmp_path):
    """Scores (rows 4..83) bit-equal to ORT's; boxes (rows 0..3) within 0.5 px. Measured on this project's CPU: every
    score equal on the four pictures; boxes equal on messi5, within 1.2e-4 px on dog (the decode's last bit), and on
    person / basketball1 one anchor's box moved by 0.18 / 0.28 px: the DFL softmax (vigil's exp, not MLAS's) is
    quantized before the DFL convolution, and one of its values sat on a level boundary."""
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    sess = oracle.ort_session(model, threads=2)
    paths = oracle.sample_images()[:4]
    exact_scores, report = 0, []
    for path in paths:
        x = oracle.make_batch("ultralytics", 1, (640, 640), images=[path])
        got = run_raw(tmp_path, model, x)
        want = sess.run(None, {"images": x})[0]
        box = float(np.abs(got[:, :4] - want[:, :4]).max())
        score = float(np.abs(got[:, 4:] - want[:, 4:]).max())
        exact_scores += int(np.array_equal(got[:, 4:], want[:, 4:]))
        report.append(f"{path.name}: box {box:.3g} px, score {score:.3g}")
        assert box <= 0.5 and score <= 0.02, "; ".join(report)
    if has_fma():
        assert exact_scores >= len(paths) - 1, f"scores bit-equal on {exact_scores} of {len(paths)}: {report}"


def test_real_int8_yolov8n_detections_are_onnxruntimes(tmp_path):
    """The issue's rule: ORT's detections on the sample pictures, same classes, IoU >= 0.9, |dscore| <= 0.02."""
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    paths = oracle.sample_images()
    out = tmp_path / "dets.jsonl"
    p = vigil("detect", "--model", model, "--conf", 0.25, "--iou", IOU, "--json", out, "--no-save", *paths)
    assert p.returncode == 0, describe(p)
    got = read_jsonl(out)
    ref = oracle.detect(model, paths, conf=0.25, iou=IOU)
    a = oracle.match_detections(ref, got, 0.3, 0.25, 0.9, 0.02)
    b = oracle.match_detections(got, ref, 0.3, 0.25, 0.9, 0.02)
    assert not a and not b, f"ORT without vigil: {a[:10]}\nvigil without ORT: {b[:10]}\n(ref {len(ref)}, vigil {len(got)})"
    assert len(ref) >= 10, "the sample pictures should give a dozen detections or more"


def test_float_activations_stay_available_and_differ(tmp_path):
    """--int8-activations float keeps activations in float: ORT on the float twin's arithmetic, not the int8 file's
    (so the option really changes the computation)."""
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    x = oracle.make_batch("ultralytics", 1, (640, 640), images=oracle.sample_images()[:1])
    quantized = run_raw(tmp_path, model, x)
    floating = run_raw(tmp_path, model, x, "--int8-activations", "float")
    twin = oracle.ort_session(oracle.float_twin_of_dynamic_quant(model), threads=2).run(None, {"images": x})[0]
    assert np.abs(floating - twin).max() / np.abs(twin).max() <= 1e-4
    assert np.abs(quantized - twin).max() / np.abs(twin).max() > 1e-3, "quantized activations should move outputs"
    p = vigil("model", "run", "--model", model, "--input", f"images={tmp_path / 'x.npy'}", "--output-dir",
              tmp_path / "bad", "--int8-activations", "int4")
    assert p.returncode == 2 and "int8 activations 'int4' is not one of: quantized, float" in p.stderr, describe(p)
