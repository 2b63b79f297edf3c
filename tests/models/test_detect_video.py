"""`vigil detect` on a video file (issue 3): the first 30 frames of opencv-doc's vtest.avi (768x576,
10 fps, MS-MPEG4 v3) through the real int8 YOLOv8n.

- JSON lines: one object per decoded frame, in order, frame = 0..29, pts = frame / 10 s; persons found on
  >= 90% of the frames (the scene always shows several pedestrians).
- The annotated video decodes (ffprobe counts its frames): H.264, 768x576, 30 frames; its pixels equal the
  source frame's up to compression except where boxes were drawn (checked on frame 0 against OpenCV's
  decoding of the source).
- The progress line appears only when stderr is a terminal (a pty here), and ends at 30/30 frames.
"""
from __future__ import annotations

import os
import pty
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from common import THREADS, describe, read_jsonl, shared_model, vigil, vigil_bin  # noqa: E402

VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
FRAMES = 30


@pytest.fixture(scope="module")
def vtest30(tmp_path_factory) -> Path:
    if not VTEST.is_file():
        pytest.skip(f"{VTEST} missing (apt install opencv-doc)")
    if not shutil.which("ffmpeg") or not shutil.which("ffprobe"):
        pytest.skip("ffmpeg/ffprobe missing (apt install ffmpeg)")
    out = tmp_path_factory.mktemp("media") / "vtest30.avi"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(VTEST), "-frames:v", str(FRAMES), "-c", "copy", str(out)],
                   check=True, timeout=60)
    return out


def probe(path: Path) -> str:
    return subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                           "stream=codec_name,width,height,nb_read_frames", "-of", "csv=p=0", str(path)],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_video_gives_jsonl_per_frame_and_annotated_video(vtest30, tmp_path):
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    out = tmp_path / "out"
    p = vigil("detect", "--model", model, "--threads", THREADS, "--output-dir", out, vtest30)
    assert p.returncode == 0, describe(p)
    rows = read_jsonl(out / "detections.jsonl")
    assert [r["frame"] for r in rows] == list(range(FRAMES)), describe(p)
    assert all(r["file"] == str(vtest30) for r in rows)
    assert [r["pts"] for r in rows] == pytest.approx([i / 10 for i in range(FRAMES)], abs=1e-6)
    with_person = sum(any(d["name"] == "person" and d["score"] > 0.25 for d in r["detections"]) for r in rows)
    assert with_person >= 0.9 * FRAMES, f"persons on {with_person}/{FRAMES} frames"
    for r in rows:
        for d in r["detections"]:
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 <= x2 <= 768 and 0 <= y1 <= y2 <= 576 and d["score"] > 0.25, d
    assert "\r" not in p.stderr, "progress line printed although stderr is not a terminal"
    assert f"{vtest30}: {FRAMES} frames, 768x576" in p.stderr, describe(p)

    video = out / "vtest30.mp4"
    assert probe(video) == f"h264,768,576,{FRAMES}", describe(p)
    # Frame 0: away from the boxes the annotated picture is the source up to compression; on the left edge
    # of the best box it carries the drawn line.
    ok, annotated = cv2.VideoCapture(str(video)).read()
    ok2, source = cv2.VideoCapture(str(vtest30)).read()
    assert ok and ok2 and annotated.shape == source.shape == (576, 768, 3)
    diff = np.abs(annotated.astype(np.int16) - source.astype(np.int16)).max(2)
    near_boxes = np.zeros(diff.shape, bool)
    for d in rows[0]["detections"]:
        x1, y1, x2, y2 = (int(v) for v in d["box"])
        near_boxes[max(0, y1 - 30):y2 + 4, max(0, x1 - 4):x2 + 200] = True  # box, line width, label above it
    assert diff[~near_boxes].mean() < 4, f"untouched pixels differ by {diff[~near_boxes].mean():.1f} on average"
    best = max(rows[0]["detections"], key=lambda d: d["score"])
    x1, y1, x2, y2 = (int(round(v)) for v in best["box"])
    assert diff[y1 + 2:y2 - 2, x1].mean() > 40, f"no box line drawn at x={x1} for {best}"


def test_progress_line_on_a_terminal(vtest30, tmp_path):
    model = shared_model("yolox_nano_coco_416_fp32.onnx")
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([vigil_bin(), "detect", "--model", str(model), "--threads", THREADS, "--no-save",
                             str(vtest30)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    assert proc.wait(timeout=600) == 0
    text = b"".join(chunks).decode(errors="replace")
    lines = [line for line in text.replace("\r\n", "\n").split("\r") if "frames," in line]
    assert lines, text
    assert f"100% [{'#' * 24}] {FRAMES}/{FRAMES} frames" in lines[-1], text
    assert "fps" in lines[-1]
    assert any(f"/{FRAMES} frames" in line and "ETA" in line for line in lines[:-1]), text  # redrawn on the way


def test_unreadable_video_is_named(tmp_path):
    model = shared_model("yolox_nano_coco_416_fp32.onnx")
    bad = tmp_path / "notes.txt"
    bad.write_text("not a video\n")
    p = vigil("detect", "--model", model, "--no-save", bad)
    assert p.returncode == 1, describe(p)
    assert "notes.txt" in p.stderr, describe(p)
