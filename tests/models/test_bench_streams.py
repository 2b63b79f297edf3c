"""`vigil bench streams` on the CPU: the stream sweep's accounting (issue #4's pipeline benchmark tool).

The same command measures GPUs on the GPU machine (scripts/gpu-check.sh streams); here one CPU worker
shows that a load it can carry holds and one it cannot is reported as unserved, and that the sweep stops
at the first count that does not hold.
Needs: VIGIL_BIN; the shared YOLOv8n model (skips with a message when absent).
"""
from __future__ import annotations

import json

from common import describe, shared_model, vigil


def test_sweep_holds_a_light_load_and_stops_at_an_impossible_one(tmp_path):
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--streams", "1,400,1", "--fps", "4",
              "--seconds", "2", "--warmup-s", "0.5", "--workers-per-device", "1", "--width", "320",
              "--height", "240", "--budget-ms", "3000", "--json", timeout=120)
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    # Defaults on the CPU: pageable frames ("auto"), the model's fixed batch of 1.
    assert j["gpu_stages"] is False and j["devices"] == ["cpu"] and j["frame"]["width"] == 320
    assert j["frame"]["memory"] == "host" and j["batch"] == 1
    light, heavy = j["trials"][0], j["trials"][1]
    assert len(j["trials"]) == 2, "the sweep stops at the first count that does not hold"
    # 1 stream at 4 FPS for 2 s: 8 frames due in the window, all served within the budget.
    assert light["streams"] == 1 and light["offered_fps"] == 4
    assert light["served"] == 8 and light["unserved"] == 0 and light["holds"], light
    assert 0 < light["latency_ms"]["p50"] <= light["latency_ms"]["p99"] <= 3000
    assert light["mean_batch"] == 1 and light["cpu_ms_per_frame"] > 0
    # 400 streams at 4 FPS = 1600 frames/s: far beyond one CPU worker; what it did not serve is counted.
    assert heavy["streams"] == 400 and not heavy["holds"]
    assert heavy["unserved"] > 0 and heavy["served"] + heavy["unserved"] == 3200, heavy
    assert j["max_streams_holding"] == 1


def test_bad_arguments_are_named(tmp_path):
    model = shared_model("yolov8n_coco_640_int8dyn.onnx")
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--streams", "4,x")
    assert p.returncode == 2 and "'x' is not a positive count" in p.stderr, describe(p)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--memory", "gpu")
    assert p.returncode == 2 and "--memory 'gpu'" in p.stderr, describe(p)
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--memory", "pinned")
    assert p.returncode == 2 and "--memory pinned needs CUDA devices only" in p.stderr, describe(p)
    bad = tmp_path / "frame.npy"
    bad.write_bytes(b"not a numpy file")
    p = vigil("bench", "streams", "--model", model, "--devices", "cpu", "--frame", bad)
    assert p.returncode == 2 and str(bad) in p.stderr, describe(p)
