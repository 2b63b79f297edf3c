"""`vigil bench streams` on the CPU: the stream sweep's accounting (issues 4 and 13).

The command runs the edge pipeline itself (pipeline::RunEdge) against an aggregator in the same process,
so what it measures is what `vigil edge` does. The same command measures GPUs on the GPU machine
(scripts/gpu-check.sh streams); here one CPU worker shows that a load it can carry holds (every frame due
in the window detected, and acknowledged by the aggregator after its commit) and one it cannot is
reported as unserved, and that the sweep stops at the first count that does not hold. With --video every
stream decodes an H.264 clip itself (here on the CPU; --hwaccel cuda on this GPU-less machine must fall
back to the CPU and say so).
Needs: VIGIL_BIN; the shared YOLOv8n model; for --video the generated yolov8n_320_b1_op17.onnx and the
ffmpeg CLI (libx264) to write the clip (each skips with a message when absent).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from common import MODELS_DIR, describe, shared_model, vigil

CLIP_W, CLIP_H = 320, 240


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """2 s of ffmpeg's testsrc2 at 30 FPS, 320x240, H.264 (yuv420p) in MP4."""
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg missing (apt install ffmpeg)")
    out = tmp_path_factory.mktemp("media") / "clip.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-f", "lavfi", "-i", f"testsrc2=size={CLIP_W}x{CLIP_H}:rate=30",
                    "-t", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(out)], check=True, timeout=60)
    return out


def small_model() -> Path:
    p = MODELS_DIR / "yolov8n_320_b1_op17.onnx"
    if not p.is_file():
        pytest.skip(f"{p} missing: run tools/testmodels/make_models.py --out {MODELS_DIR}")
    return p


def bench_video(clip: Path, hwaccel: str):
    # 2 streams at 5 FPS for 2 s: 20 frames due in the measured window.
    return vigil("bench", "streams", "--model", small_model(), "--video", clip, "--hwaccel", hwaccel, "--devices", "cpu",
                 "--streams", "2", "--fps", "5", "--seconds", "2", "--warmup-s", "0.5", "--workers-per-device", "1",
                 "--budget-ms", "2000", "--json", timeout=300)


def check_decoded_trial(j: dict, clip: Path) -> dict:
    assert j["frame"]["width"] == CLIP_W and j["frame"]["height"] == CLIP_H and j["frame"]["source"] == str(clip)
    assert j["fps_per_stream"] == 5, "--fps below the clip's 30 FPS: each stream keeps 5 a second"
    assert len(j["trials"]) == 1
    t = j["trials"][0]
    assert t["streams"] == 2 and t["offered_fps"] == 10
    assert t["served"] == 20 and t["unserved"] == 0 and t["dropped"] == 0 and t["holds"], t
    # Every frame served was stored: acknowledged after the aggregator's commit, after its detection.
    assert t["not_stored"] == 0, t
    assert t["stored_ms"]["p50"] >= t["latency_ms"]["p50"] > 0, t
    d = t["decode"]
    assert d["errors"] == 0, d
    assert 0 < d["ms"]["p50"] <= d["ms"]["p99"] <= d["ms"]["max"], d
    assert sum(d["decoders"].values()) == 2
    return d


def test_sweep_holds_a_light_load_and_stops_at_an_impossible_one(tmp_path):
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--streams", "1,400,1", "--fps", "4",
              "--seconds", "2", "--warmup-s", "0.5", "--workers-per-device", "1", "--width", "320",
              "--height", "240", "--budget-ms", "3000", "--json", timeout=300)
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    # Defaults on the CPU: the model's fixed batch of 1; synthetic frames.
    assert j["devices"] == ["cpu"] and j["frame"]["width"] == 320 and j["batch"] == 1
    assert j["frame"]["source"] == "synthetic:320x240?fps=4"
    light, heavy = j["trials"][0], j["trials"][1]
    assert len(j["trials"]) == 2, "the sweep stops at the first count that does not hold"
    # 1 stream at 4 FPS for 2 s: 8 frames due in the window, all served within the budget and stored.
    assert light["streams"] == 1 and light["offered_fps"] == 4
    assert light["served"] == 8 and light["unserved"] == 0 and light["dropped"] == 0 and light["holds"], light
    assert light["min_stream_fps"] == 4 and light["not_stored"] == 0
    assert 0 < light["latency_ms"]["p50"] <= light["latency_ms"]["p99"] <= 3000
    assert light["latency_ms"]["p50"] <= light["stored_ms"]["p50"]
    assert light["mean_batch"] == 1 and light["cpu_ms_per_frame"] > 0
    assert light["decode"]["decoders"] == {"cpu": 1}
    # 400 streams at 4 FPS = 1600 frames/s: far beyond one CPU worker; what it did not serve is counted.
    assert heavy["streams"] == 400 and not heavy["holds"]
    assert heavy["unserved"] > 0 and heavy["served"] + heavy["unserved"] == 3200, heavy
    assert j["max_streams_holding"] == 1


def test_bad_arguments_are_named(tmp_path):
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--streams", "4,x")
    assert p.returncode == 2 and "'x' is not a positive count" in p.stderr, describe(p)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu,gpu0")
    assert p.returncode == 2 and "--devices: 'gpu0' is not cpu or cuda:N" in p.stderr, describe(p)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--precision", "int4")
    assert p.returncode == 2 and "--precision" in p.stderr, describe(p)
    # An edge that cannot start is not a measurement: exit 1 with its error (no GPU here, or not this one).
    p = vigil("bench", "streams", "--model", model, "--devices", "cuda:63", "--streams", "1", "--seconds", "1",
              "--warmup-s", "0", timeout=120)
    assert p.returncode == 1 and "the edge did not start" in p.stderr and "--devices cpu" in p.stderr, describe(p)
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a model")
    p = vigil("bench", "streams", "--model", bad, "--devices", "cpu")
    assert p.returncode == 2 and str(bad) in p.stderr, describe(p)


def test_video_streams_decode_on_the_cpu(clip):
    p = bench_video(clip, "cpu")
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    assert j["video"] == {"file": str(clip), "hwaccel": "cpu"}
    assert check_decoded_trial(j, clip)["decoders"] == {"cpu": 2}


def test_video_streams_fall_back_to_the_cpu_without_a_gpu(clip):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA GPU: NVDEC would be used")
    p = bench_video(clip, "cuda")
    assert p.returncode == 0, describe(p)
    assert "its streams decode on the CPU" in p.stderr, describe(p)
    d = check_decoded_trial(json.loads(p.stdout), clip)
    assert all(where.startswith("cpu (") for where in d["decoders"]), d


def test_video_that_does_not_open_is_named(clip, tmp_path):
    model = small_model()
    missing = tmp_path / "missing.mp4"
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--video", missing)
    assert p.returncode == 2 and str(missing) in p.stderr, describe(p)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video" * 100)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--video", garbage)
    assert p.returncode == 2 and str(garbage) in p.stderr and "--video" in p.stderr, describe(p)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--video", clip, "--hwaccel", "vaapi")
    assert p.returncode == 2 and "--hwaccel 'vaapi'" in p.stderr, describe(p)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--video", clip, "--width", "64")
    assert p.returncode == 2 and "--width" in p.stderr, describe(p)
