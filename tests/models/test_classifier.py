"""The aggregator's second model (issue 20) against ONNX Runtime: `vigil model classify` runs the very code the
aggregator runs on an event's crops (aggregator/classifier.h) on JPEG crops of real photos, with classifiers exported
two ways — Ultralytics' YOLOv8n-cls built from its YAML (random weights; Softmax at the end) and a plain PyTorch
module through torch.onnx.export at another opset (logits) —, and its probabilities are compared with ONNX
Runtime's on the same input tensor (`--save-inputs`): same top class, probabilities within 1e-4. Its preprocessing
is compared with OpenCV's (decode, area resize, RGB, /255): the crops' inputs within 2 levels.
Needs: VIGIL_BIN, the test virtualenv (onnxruntime, torch, ultralytics), darknet's sample pictures.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from common import describe, vigil

ort = pytest.importorskip("onnxruntime")
cv2 = pytest.importorskip("cv2")
torch = pytest.importorskip("torch")
import oracle  # noqa: E402 (tools/testmodels, on sys.path via common)


def ultralytics_cls(out: Path) -> Path:
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO
    torch.manual_seed(0)
    model = YOLO("yolov8n-cls.yaml")  # from the YAML: no download
    path = model.export(format="onnx", imgsz=64, opset=17, simplify=False, dynamic=False)
    target = out / "yolov8n-cls-64.onnx"
    Path(path).replace(target)
    return target


class PlainClassifier(torch.nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.body(x))


def plain_cls(out: Path) -> Path:
    torch.manual_seed(1)
    m = PlainClassifier().eval()
    with torch.no_grad():  # spread the logits so the classes differ clearly
        m.head.weight.mul_(8.0)
    target = out / "plain-cls-48x80.onnx"
    torch.onnx.export(m, torch.zeros(1, 3, 48, 80), str(target), opset_version=13, input_names=["images"],
                      output_names=["logits"])
    return target


def crops(out: Path) -> list[Path]:
    dog = oracle.DARKNET_DATA / "dog.jpg"
    if not dog.is_file():
        pytest.skip("dog.jpg missing: apt-get install darknet")
    img = cv2.imread(str(dog))
    regions = [(120, 220, 320, 540), (460, 70, 690, 180), (130, 120, 570, 430), (0, 0, 40, 30)]  # x1, y1, x2, y2
    paths = []
    for i, (x1, y1, x2, y2) in enumerate(regions):
        p = out / f"crop{i}.jpg"
        cv2.imwrite(str(p), img[y1:y2, x1:x2], [cv2.IMWRITE_JPEG_QUALITY, 85])
        paths.append(p)
    return paths


@pytest.mark.parametrize("make", [ultralytics_cls, plain_cls], ids=["ultralytics-yolov8n-cls", "torch-plain-opset13"])
def test_classify_gives_onnxruntimes_probabilities_on_jpeg_crops(make, tmp_path):
    model = make(tmp_path)
    pictures = crops(tmp_path)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    r = vigil("model", "classify", "--model", model, "--json", "--save-inputs", inputs, *pictures)
    assert r.returncode == 0, describe(r)
    got = json.loads(r.stdout)
    assert [Path(g["image"]).name for g in got] == [p.name for p in pictures]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    h, w = session.get_inputs()[0].shape[2:]
    for i, (g, picture) in enumerate(zip(got, pictures)):
        x = np.load(inputs / f"input.{i}.npy")
        assert x.shape == (1, 3, h, w) and x.dtype == np.float32
        raw = session.run(None, {name: x})[0][0].astype(np.float64)
        probs = raw if abs(raw.sum() - 1) < 1e-3 and raw.min() >= 0 else np.exp(raw - raw.max()) / np.exp(
            raw - raw.max()).sum()
        assert g["index"] == int(np.argmax(probs)), f"{picture.name}: vigil {g['index']}, ORT {np.argmax(probs)}"
        np.testing.assert_allclose(g["probabilities"], probs, atol=1e-4, err_msg=picture.name)
        assert g["score"] == pytest.approx(probs.max(), abs=1e-4)
        # The input is the picture decoded, area-resized, RGB, /255: OpenCV's own within JPEG decoders' rounding.
        bgr = cv2.imread(str(picture))
        want = cv2.resize(bgr, (w, h), interpolation=cv2.INTER_AREA)[:, :, ::-1].transpose(2, 0, 1)[None] / 255.0
        assert np.abs(x - want).mean() < 2 / 255, f"{picture.name}: mean |Δ| {np.abs(x - want).mean() * 255:.2f} levels"


def test_classify_names_what_is_wrong(tmp_path):
    model = plain_cls(tmp_path)
    bad = tmp_path / "not-a-picture.jpg"
    bad.write_text("hello")
    r = vigil("model", "classify", "--model", model, "--labels", "a,b,c", bad)
    assert r.returncode == 1
    assert "confirm.classifier.labels: 3 names for a model of 5 classes" in r.stderr, describe(r)
    r = vigil("model", "classify", "--model", model, bad, tmp_path / "missing.jpg")
    assert r.returncode == 1
    assert "not-a-picture.jpg: jpeg: not a JPEG picture" in r.stderr, describe(r)
    assert "missing.jpg: cannot read the file" in r.stderr, describe(r)
