"""Self-checks of the reference (tools/testmodels/oracle.py); they need no vigil binary.

If these fail, the vigil comparisons in this folder are meaningless, so they run everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import oracle  # noqa: E402
from common import manifest, model_params, model_path, shared_model  # noqa: E402
from measures import end2end_errors, raw_errors  # noqa: E402

pytestmark = pytest.mark.no_vigil


def _dog():
    p = oracle.DARKNET_DATA / "dog.jpg"
    if not p.is_file():
        pytest.skip("dog.jpg missing: apt-get install darknet")
    return p


@pytest.mark.parametrize("name", ["yolov8n_coco_640_int8dyn.onnx", "yolox_nano_coco_416_fp32.onnx"])
def test_oracle_finds_dog_bicycle_vehicle(name):
    """ORT + numpy decode/NMS on the real models: dog, bicycle and a car/truck at the top right of dog.jpg."""
    dets = oracle.detect(shared_model(name), [_dog()], conf=0.25, iou=0.7)
    by = {d["class_id"]: d for d in sorted(dets, key=lambda d: d["score"])}
    assert 16 in by and 1 in by, dets
    vehicle = by.get(2) or by.get(7)
    assert vehicle is not None, dets
    x1, y1, x2, y2 = vehicle["box"]
    assert (x1 + x2) / 2 > 768 * 0.55 and (y1 + y2) / 2 < 576 * 0.4, vehicle
    dog = by[16]["box"]
    assert dog[0] < 200 and dog[3] > 450, by[16]  # lower left


def test_letterbox_ultralytics_padding():
    """Odd padding goes to the bottom/right; content is RGB/255; pad value 114/255."""
    img = np.zeros((103, 200, 3), np.uint8)
    img[..., 2] = 255  # red in BGR
    chw, gain, (left, top) = oracle.letterbox_ultralytics(img, (64, 64))
    assert chw.shape == (3, 64, 64) and chw.dtype == np.float32
    # r = 0.32, resized 64 x round(32.96) = 33 rows, padding 31 -> top round(15.4) = 15, bottom 16
    assert (left, top) == (0, 15) and gain == (33 / 103, 64 / 200)
    rows = np.where(np.abs(chw[0, :, 32] - 1.0) < 1e-6)[0]
    assert (rows.min(), rows.max()) == (15, 47) and np.allclose(chw[:, 0, 0], 114 / 255)
    assert np.allclose(chw[1:, 20, 20], 0)  # green/blue empty: channels were swapped to RGB


def test_letterbox_yolox_top_left():
    img = np.full((100, 200, 3), 7, np.uint8)
    chw, gain, pad = oracle.letterbox_yolox(img, (64, 64))
    assert pad == (0, 0) and chw[0, 0, 0] == 7 and chw[0, 63, 63] == 114 and chw[0, 31, 0] == 7
    assert chw[0, 32, 0] == 114  # int(100 * 0.32) = 32 rows of content


def test_nms_class_aware():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10]], np.float32)
    scores = np.zeros((3, 3), np.float32)
    scores[0, 0], scores[1, 0], scores[2, 1] = 0.9, 0.8, 0.7
    b, s, c = oracle.non_max_suppression(boxes, scores, conf=0.25, iou=0.5)
    assert list(c) == [0, 1] and np.allclose(s, [0.9, 0.7])
    b, s, c = oracle.non_max_suppression(boxes, scores, conf=0.25, iou=0.5, agnostic=True)
    assert list(c) == [0]


@pytest.mark.parametrize("entry", model_params())
def test_manifest_matches_ort(entry):
    """MANIFEST.json's declared I/O and expected output shapes are what ORT gives on the test inputs."""
    sess = oracle.ort_session(model_path(entry))
    assert [i.name for i in sess.get_inputs()] == [i["name"] for i in entry["inputs"]]
    assert entry["family"] in oracle.FAMILIES
    shp = entry["test_inputs"][0]
    dtype = np.float16 if entry["inputs"][0]["dtype"] == "float16" else np.float32
    out = oracle.ort_run(sess, {entry["inputs"][0]["name"]: oracle.make_batch(entry["family"], shp[0], shp[2:], dtype)})
    assert {k: list(v.shape) for k, v in out.items()} == entry["expected_outputs"][0]
    raw = next(iter(out.values()))
    assert oracle.infer_family(raw.shape, shp[2:], oracle.model_metadata(model_path(entry))) == entry["family"]


def test_manifest_covers_the_matrix():
    m = manifest()
    if m is None:
        pytest.skip("no generated models")
    es = m["models"]
    for fam in oracle.FAMILIES:
        assert any(e["family"] == fam for e in es), fam
    assert {1, 4, "dynamic"} <= {e["batch"] for e in es}
    assert min(e["opset"] for e in es) <= 12 and max(e["opset"] for e in es) >= 17
    assert any(e["imgsz"] == [640, 640] for e in es) and any(e["imgsz"] != [640, 640] for e in es)
    assert {"fp32", "fp16", "int8-dynamic", "int8-qdq"} <= {e["precision"] for e in es}


@pytest.mark.parametrize("entry", model_params(lambda e: e["precision"] == "fp32" and not e["dynamic"]))
def test_tolerances_above_noise_floor(entry):
    """Two correct fp32 implementations (ORT with all graph optimisations vs none: other kernels,
    fusions, layouts) must agree well inside the tolerances of test_raw_outputs (<= 1/3 of them),
    else those tolerances would fail correct engines."""
    import onnxruntime as ort
    from test_raw_outputs import FP32_TOL

    path = model_path(entry)
    shp = entry["test_inputs"][0]
    x = oracle.make_batch(entry["family"], shp[0], shp[2:])
    a = next(iter(oracle.ort_run(path, {"images": x}).values()))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    b = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
    err = end2end_errors(b, a)[0] if entry["family"] == "end2end" else raw_errors(b, a, entry["family"])
    assert err["box"] <= FP32_TOL["box"] / 3 and err["score"] <= FP32_TOL["score"] / 3, err


def test_real_tolerance_above_noise_floor():
    import onnxruntime as ort
    from test_raw_outputs import REAL_TOL

    path = shared_model("yolox_nano_coco_416_fp32.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for img in oracle.sample_images(4):
        x = oracle.make_batch("yolox", 1, (416, 416), images=[img])
        err = raw_errors(plain.run(None, {"images": x})[0], oracle.ort_run(path, {"images": x})["output"], "yolox")
        assert err["box"] <= REAL_TOL["box"] / 3 and err["score"] <= REAL_TOL["score"] / 3, (img.name, err)
