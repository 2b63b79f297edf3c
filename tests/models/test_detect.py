"""`vigil detect` end to end (letterbox, inference, decode, NMS, mapping back) against the numpy
reference in tools/testmodels/oracle.py run on ONNX Runtime outputs.

Detection-level matching (oracle.match_detections), both directions: every reference detection with
score >= conf + 0.05 must have a vigil detection of the same class, score >= conf, IoU >= min_iou and
|score difference| <= max_dscore, and vice versa. The 0.05 margin keeps detections near the threshold
from flipping the verdict.
- Real int8 YOLOv8n (activations quantized at run time exactly as ONNX Runtime does: test_int8_exact.py):
  conf 0.25, IoU >= 0.9, |dscore| <= 0.02 (the boxes are mapped back through vigil's own letterbox).
- Generated fp32 models: the same preprocessing and fp32 arithmetic leave ~1e-5 differences, so
  IoU >= 0.98 and |dscore| <= 0.01: a box mapped back without removing the padding or with the wrong
  gain fails, as does a wrong letterbox (the outputs of these random-weight models follow the image).
  Random-weight models can have hundreds of boxes over 0.25, so `conf` is raised until the reference
  keeps at most 60 (vigil gets the same --conf).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import oracle  # noqa: E402
from common import MODELS_DIR, SHARED_DIR, describe, model_params, model_path, read_jsonl, \
    shared_model, vigil  # noqa: E402

IMAGES = [p for p in oracle.SAMPLE_IMAGES[:3]]
IOU = 0.7


def images():
    found = [p for p in IMAGES if p.is_file()]
    if not found:
        pytest.skip("sample photos missing: apt-get install darknet opencv-doc")
    return found


def run_detect(tmp_path, model, paths, conf=0.25, extra=()):
    out = tmp_path / "dets.jsonl"
    p = vigil("detect", "--model", model, "--conf", conf, "--iou", IOU, "--max-det", 300, "--json", out,
              "--no-save", *extra, *paths)
    return p, read_jsonl(out)


def assert_match(ref, got, conf, min_iou, max_dscore, proc):
    hi = conf + 0.05
    a = oracle.match_detections(ref, got, hi, conf, min_iou, max_dscore)
    b = oracle.match_detections(got, ref, hi, conf, min_iou, max_dscore)
    assert not a and not b, (f"reference dets without vigil match: {a[:10]}\nvigil dets without reference match: "
                             f"{b[:10]}\n(ref {len(ref)}, vigil {len(got)} dets)\n{describe(proc)}")


def adaptive_conf(model, paths, imgsz=None, cap=60):
    """Lowest conf >= 0.25 (in steps of 0.05) at which the reference keeps <= cap detections per photo."""
    conf = 0.25
    ref = oracle.detect(model, paths, conf=conf, iou=IOU, imgsz=imgsz)
    while max([sum(r["file"] == str(p) for r in ref) for p in paths]) > cap and conf < 0.9:
        conf = round(conf + 0.05, 2)
        ref = [r for r in ref if r["score"] > conf]  # = NMS at the higher conf (suppressors score higher)
    return conf, ref


# ------------------------------------------------------------------ real models
def test_yolov8n_int8_matches_reference(tmp_path):
    """Real dynamically-quantized YOLOv8n: detections agree with ORT + numpy decode/NMS."""
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    paths = images()
    p, got = run_detect(tmp_path, model, paths)
    assert p.returncode == 0, describe(p)
    ref = oracle.detect(model, paths, conf=0.25, iou=IOU)
    assert_match(ref, got, 0.25, 0.9, 0.02, p)


def test_yolov8n_int8_dog():
    """dog.jpg (768x576) with the real YOLOv8n: a dog, a bicycle and a car/truck at the top right."""
    import tempfile

    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    dog = oracle.DARKNET_DATA / "dog.jpg"
    if not dog.is_file():
        pytest.skip("dog.jpg missing: apt-get install darknet")
    with tempfile.TemporaryDirectory() as td:
        p, got = run_detect(Path(td), model, [dog])
    assert p.returncode == 0, describe(p)
    classes = {d["class_id"] for d in got if d["score"] >= 0.3}
    assert {16, 1} <= classes, f"want dog(16) and bicycle(1): {got}"
    vehicles = [d for d in got if d["class_id"] in (2, 7) and d["score"] >= 0.3]
    assert any((d["box"][0] + d["box"][2]) / 2 > 768 * 0.55 and (d["box"][1] + d["box"][3]) / 2 < 576 * 0.4
               for d in vehicles), f"want a car(2)/truck(7) at the top right: {vehicles}"
    for d in got:
        assert d["file"].endswith("dog.jpg") and d["name"] == oracle.COCO80[d["class_id"]]
        x1, y1, x2, y2 = d["box"]
        assert 0 <= x1 <= x2 <= 768 and 0 <= y1 <= y2 <= 576, d


def test_yolox_nano_matches_reference(tmp_path):
    """Real YOLOX-Nano (no metadata: BGR 0..255 top-left letterbox must be inferred from the layout)."""
    model = shared_model("yolox_nano_coco_416_fp32.onnx")
    paths = images()
    p, got = run_detect(tmp_path, model, paths)
    assert p.returncode == 0, describe(p)
    ref = oracle.detect(model, paths, conf=0.25, iou=IOU)
    assert_match(ref, got, 0.25, 0.98, 0.01, p)


# ------------------------------------------------------------------ generated models
DETECT_SET = {  # file -> (--imgsz or None, min_iou, max_dscore)
    "yolov8n_640_b1_op17.onnx": (None, 0.98, 0.01),
    "yolo11n_640_b1_op17.onnx": (None, 0.98, 0.01),
    "yolov5nu_640_b1_op17.onnx": (None, 0.98, 0.01),
    "yolo26n_640_b1_op17.onnx": (None, 0.98, 0.01),
    "yolox_nano_416_b1_op11.onnx": (None, 0.98, 0.01),
    "yolov5n_640_b1_op12.onnx": (None, 0.98, 0.01),
    "yolov8n_320_dyn_op17.onnx": ((256, 320), 0.98, 0.01),
    "yolov8n_320_b1_op17_fp16.onnx": (None, 0.9, 0.05),
    # The generated int8dyn model is checked raw against its float twin (test_raw_outputs.py): with
    # random weights, ORT's activation quantization moves boxes past any detection-level tolerance.
    # Likewise the QDQ model (test_raw_outputs.py::test_generated_qdq_vs_ort).
}


@pytest.mark.parametrize("entry", model_params(lambda e: e["file"] in DETECT_SET))
def test_generated_detect(tmp_path, entry):
    """Each family's default export, a dynamic-H/W export with --imgsz, fp16 and both int8 flavours."""
    model = model_path(entry)
    imgsz, min_iou, max_dscore = DETECT_SET[entry["file"]]
    paths = images()
    conf, ref = adaptive_conf(model, paths, imgsz)
    extra = ["--imgsz", f"{imgsz[0]},{imgsz[1]}"] if imgsz else []
    p, got = run_detect(tmp_path, model, paths, conf, extra)
    assert p.returncode == 0, describe(p)
    assert ref, f"reference found nothing at conf {conf}: regenerate the models"
    assert_match(ref, got, conf, min_iou, max_dscore, p)
    want = oracle.class_names(oracle.model_metadata(model), 80)
    assert all(d["name"] == want[d["class_id"]] for d in got)


# ------------------------------------------------------------------ bad images
def _detector():
    """The real YOLOv8n if present, else the generated one."""
    if (SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx").is_file():
        return SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"
    if (MODELS_DIR / "yolov8n_640_b1_op17.onnx").is_file():
        return MODELS_DIR / "yolov8n_640_b1_op17.onnx"
    pytest.skip("no detector model (shared yolov8n or generated yolov8n_640_b1_op17)")


def test_classes_before_the_paths_keeps_the_paths():
    """`--classes 16 dog.jpg`: the option takes one (comma-separated) value, the image stays a path."""
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    dog = oracle.DARKNET_DATA / "dog.jpg"
    if not dog.is_file():
        pytest.skip("dog.jpg missing: apt-get install darknet")
    p = vigil("detect", "--model", model, "--classes", "16,1", dog, "--no-save", "--json", "-")
    assert p.returncode == 0, describe(p)
    got = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert {d["class_id"] for d in got} == {16, 1}, got  # dog and bicycle; the car/truck filtered out


def test_unreadable_image_among_good(tmp_path):
    """An unreadable image is reported on stderr by name; the good ones are still processed; exit 0."""
    good = images()[:2]
    bad = tmp_path / "broken_image.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg" * 10)
    missing = tmp_path / "no_such_image.png"
    p, got = run_detect(tmp_path, _detector(), [good[0], bad, missing, good[1]])
    assert p.returncode == 0, describe(p)
    assert "broken_image.jpg" in p.stderr and "no_such_image.png" in p.stderr, describe(p)
    files = {Path(d["file"]).name for d in got}
    assert {good[0].name, good[1].name} <= files, f"good images missing from the output: {files}"
    assert not files & {"broken_image.jpg", "no_such_image.png"}


def test_all_images_unreadable(tmp_path):
    """No image succeeded: non-zero exit (not a crash), each file named on stderr."""
    bad = tmp_path / "empty.jpg"
    bad.write_bytes(b"")
    p, got = run_detect(tmp_path, _detector(), [bad, tmp_path / "absent.jpg"])
    assert p.returncode > 0, describe(p)
    assert "empty.jpg" in p.stderr and "absent.jpg" in p.stderr, describe(p)
    assert got == []


def test_image_copies_detect_identically(tmp_path):
    """The same photo under two names gives identical detections (no state leaks between images)."""
    src = images()[0]
    a, b = tmp_path / "a.jpg", tmp_path / "b.jpg"
    shutil.copy(src, a)
    shutil.copy(src, b)
    p, got = run_detect(tmp_path, _detector(), [a, b])
    assert p.returncode == 0, describe(p)
    da = sorted((d["class_id"], d["score"], *d["box"]) for d in got if d["file"].endswith("a.jpg"))
    db = sorted((d["class_id"], d["score"], *d["box"]) for d in got if d["file"].endswith("b.jpg"))
    assert da and np.allclose(np.array(da), np.array(db), atol=1e-5), (da[:5], db[:5])
