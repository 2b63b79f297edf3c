"""End to end on loopback: `vigil aggregator` and `vigil edge` as separate processes (issue 3).

The edge reads the first 200 frames of opencv-doc's vtest.avi and darknet's sample images, runs the
int8 YOLOv8n model, and reports every frame to the aggregator (events for frames with a person, resp.
any detection for the images, progress marks for the rest). The aggregator's SQLite database must then
account for every frame exactly once: one row per (stream, run, seq) in `frames`, seqs 0..N-1 with no
hole, one run per stream, at most one event per frame. Then the same after a SIGKILL of the aggregator
mid-run (restarted on the same database and port), and after a SIGKILL of the edge mid-run (restarted
with the same state dir: same run, resumes after its cursor, a new epoch).

Boxes: the edge saves every frame it processes exactly as decoded (stream option save_frames: BGR .npy
per seq); ONNX Runtime runs the same model on those pictures (tools/testmodels/oracle.py: the family's
letterbox, decoding, NMS) and its detections are matched, both ways, with what the aggregator stored for
the same seq (detections within 0.05 of conf 0.25 may flip, as in test_detect.py):
- fp32 YOLOX-nano: every box corner within 2 px, |dscore| <= 0.01, no exception.
- int8 YOLOv8n (dynamic quantization): vigil quantizes each activation as the file's DynamicQuantizeLinear
  does and sums the integer products exactly, ONNX Runtime's arithmetic (test_int8_exact.py; until issue 21 it
  kept activations in float and missed int8 ORT on 29 of 1260 detections here). So it is held to ORT on the
  int8 file itself: IoU >= 0.98 (or corners within 0.5 px), |dscore| <= 0.02 (issue 21's rule), no exception.
  Measured: the 200 vtest frames within 0.01; on darknet's images one horse at 0.369 vs ORT's 0.382 — the ORT
  side letterboxes the saved picture with OpenCV, whose resize differs from the edge's by a grey level on some
  pixels, and the input's quantization carries that into the network.
The edge's final metrics (vigil edge --metrics-out) must count every processed frame once in each stage
histogram.

Needs: VIGIL_BIN, the model in VIGIL_SHARED_MODELS (default <repo>/../shared/models), ffmpeg/ffprobe,
/usr/share/doc/opencv-doc/examples/data/vtest.avi, /usr/share/darknet/data/*.jpg — skipped otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from common import SHARED_DIR, THREADS, vigil_bin
from edge_harness import (Aggregator, engine, free_port, metric, parse_metrics, query, read_metrics,  # noqa: F401
                          stored_frames)

VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
DARKNET = Path("/usr/share/darknet/data")
MODEL = SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"
YOLOX = SHARED_DIR / "yolox_nano_coco_416_fp32.onnx"
FRAMES = 200
IMAGES = sorted(p.name for p in DARKNET.glob("*.jpg")) if DARKNET.is_dir() else []


@pytest.fixture(scope="module")
def vtest200(tmp_path_factory) -> Path:
    for need, what in ((vigil_bin(), "VIGIL_BIN"), (shutil.which("ffmpeg"), "ffmpeg"), (shutil.which("ffprobe"), "ffprobe")):
        if not need:
            pytest.skip(f"{what} not available")
    if not VTEST.is_file() or not IMAGES:
        pytest.skip(f"{VTEST} or {DARKNET}/*.jpg missing (apt install opencv-doc darknet)")
    if not MODEL.is_file():
        pytest.skip(f"{MODEL} missing (set VIGIL_SHARED_MODELS)")
    out = tmp_path_factory.mktemp("media") / "vtest200.avi"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(VTEST), "-frames:v", str(FRAMES), "-c", "copy", str(out)],
                   check=True, timeout=60)
    n = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                        "stream=nb_read_frames", "-of", "csv=p=0", str(out)], check=True, capture_output=True,
                       text=True, timeout=60).stdout.strip()
    assert int(n) == FRAMES, f"the 200-frame copy decodes to {n} frames"
    return out


def write_edge_config(tmp: Path, agg_port: int, video: Path, with_images: bool, model: Path = MODEL,
                      save_frames: bool = False, persons_only: bool = True, snapshots: str = "") -> Path:
    """edge.yaml for stream 'vtest' (events for persons, or for any detection) and optionally 'images' (events
    for any detection); with save_frames, each stream's decoded frames go to <tmp>/frames/<stream>; `snapshots`:
    the top-level snapshots section's flow map ("{crops: true}"), "" for none."""
    def extra(stream):
        return f"    save_frames: {tmp / 'frames' / stream}\n" if save_frames else ""
    streams = f"""  - id: vtest
    source: {video}
{extra('vtest')}"""
    if persons_only:
        streams += """    rules:
      classes: [person]
      severity: {critical: 0.8, warning: 0.5}
"""
    if with_images:
        streams += f"""  - id: images
    source: {DARKNET}/*.jpg
{extra('images')}"""
    cfg = tmp / "edge.yaml"
    cfg.write_text(f"""edge: e2e-edge
aggregator: 127.0.0.1:{agg_port}
model: {{path: {model}, threads: {THREADS}}}
batching: {{max_batch: 2, max_wait_ms: 5}}
http_port: {free_port()}
state_dir: {tmp / 'state'}
progress_flush_ms: 200
{f"snapshots: {snapshots}" if snapshots else ""}
streams:
{streams}""")
    return cfg


def start_edge(cfg: Path, tmp: Path) -> subprocess.Popen:
    log = open(tmp / "edge.log", "ab")  # spdlog writes to stdout, errors of the command to stderr
    return subprocess.Popen([vigil_bin(), "--log-level", "info", "edge", "--config", str(cfg),
                             "--shutdown-timeout-ms", "60000", "--metrics-out", str(tmp / "edge.prom")],
                            stdout=log, stderr=log)


def assert_accounted_once(db: Path, stream: str, n: int):
    runs = query(db, "SELECT f.run, COUNT(*), MIN(f.seq), MAX(f.seq), SUM(CASE WHEN f.kind = 1 THEN 1 ELSE 0 END), "
                     "SUM(CASE WHEN f.kind = 2 THEN 1 ELSE 0 END) "
                     "FROM frames f JOIN streams s ON s.id = f.stream_id WHERE s.stream = ? GROUP BY f.run", stream)
    assert len(runs) == 1, f"{stream}: expected one run, got {runs}"
    run, count, lo, hi, events, marks = runs[0]
    # frames has PRIMARY KEY(stream_id, run, seq): count == n with seqs 0..n-1 means each frame once.
    assert (count, lo, hi) == (n, 0, n - 1), f"{stream}: {count} frames stored, seqs {lo}..{hi}; want {n}, 0..{n-1}"
    assert events + marks == n
    dup_events = query(db, "SELECT e.seq, COUNT(*) FROM events e JOIN streams s ON s.id = e.stream_id "
                           "WHERE s.stream = ? GROUP BY e.run, e.seq HAVING COUNT(*) > 1", stream)
    assert dup_events == [], f"{stream}: events stored twice: {dup_events}"
    n_events = query(db, "SELECT COUNT(*) FROM events e JOIN streams s ON s.id = e.stream_id WHERE s.stream = ?",
                     stream)[0][0]
    assert n_events == events, f"{stream}: {n_events} event rows for {events} event frames"
    return run, events


def labels_at(db: Path, stream: str, seq: int) -> set[str]:
    return {r[0] for r in query(db, "SELECT d.label FROM detections d JOIN events e ON e.id = d.event_id "
                                    "JOIN streams s ON s.id = e.stream_id WHERE s.stream = ? AND e.seq = ?",
                                stream, seq)}


def stored_detections(db: Path, stream: str) -> dict[int, list[dict]]:
    """seq -> detections the aggregator stored with that frame's event, as oracle records (file = seq)."""
    out: dict[int, list[dict]] = {}
    for seq, cls, label, score, *box in query(
            db, "SELECT e.seq, d.class_id, d.label, d.score, d.x1, d.y1, d.x2, d.y2 FROM detections d "
                "JOIN events e ON e.id = d.event_id JOIN streams s ON s.id = e.stream_id WHERE s.stream = ?", stream):
        out.setdefault(seq, []).append({"file": str(seq), "class_id": cls, "name": label, "score": score, "box": box})
    return out


def boxes_vs_ort(db: Path, frames_dir: Path, stream: str, model, n: int, iou: float, min_iou: float,
                 box_atol: float, max_dscore: float, classes=None, conf=0.25) -> tuple[list[str], int]:
    """ORT (`model`: a file) on the frames the edge saved vs the detections stored for the same seqs,
    both directions; a box matches at IoU >= min_iou or with every corner within box_atol px.
    Returns (mismatches, reference detections with score >= conf + 0.05)."""
    import oracle

    files = sorted(frames_dir.glob("*.npy"))
    assert [int(f.stem) for f in files] == list(range(n)), f"{frames_dir}: {len(files)} frames saved, want {n}"
    ref = oracle.detect_images(model, ((str(int(f.stem)), np.load(f)) for f in files), conf=conf, iou=iou)
    if classes is not None:
        ref = [r for r in ref if r["class_id"] in classes]
    got = stored_detections(db, stream)
    fails = []
    for seq in range(n):
        r = [d for d in ref if d["file"] == str(seq)]
        g = got.get(seq, [])
        fails += [f"{stream} seq {seq}: ORT {m}" for m in
                  oracle.match_detections(r, g, conf + 0.05, conf, min_iou, max_dscore, box_atol)]
        fails += [f"{stream} seq {seq}: vigil {m}" for m in
                  oracle.match_detections(g, r, conf + 0.05, conf, min_iou, max_dscore, box_atol)]
    compared = sum(d["score"] >= conf + 0.05 for d in ref)
    assert compared > 0, f"{stream}: ORT found nothing to compare"
    return fails, compared


def describe_fails(fails: list[str], compared: int) -> str:
    return f"{len(fails)} mismatches over {compared} reference detections:\n" + "\n".join(fails[:20])


def wait_edge(edge: subprocess.Popen, tmp: Path, timeout=300):
    rc = edge.wait(timeout=timeout)
    assert rc == 0, f"edge exited {rc}:\n{(tmp / 'edge.log').read_text()[-3000:]}"


def test_every_frame_accounted_persons_and_dog(vtest200, tmp_path):
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    try:
        edge = start_edge(write_edge_config(tmp_path, agg.port, vtest200, True, save_frames=True), tmp_path)
        wait_edge(edge, tmp_path)
    finally:
        agg.kill(signal.SIGTERM)
    _, person_frames = assert_accounted_once(agg.db, "vtest", FRAMES)
    assert person_frames >= 0.9 * FRAMES, f"persons on {person_frames}/{FRAMES} vtest frames"
    assert_accounted_once(agg.db, "images", len(IMAGES))
    dog = labels_at(agg.db, "images", IMAGES.index("dog.jpg"))
    assert {"dog", "bicycle"} <= dog, f"dog.jpg gave {dog}"

    # Metrics at the end of the run: every processed frame once per stage.
    m = read_metrics(tmp_path / "edge.prom")
    total = FRAMES + len(IMAGES)
    assert metric(m, "vigil_edge_frames_total", stream="vtest") == FRAMES
    assert metric(m, "vigil_edge_frames_total", stream="images") == len(IMAGES)
    for stage in ("decode", "queue", "preprocess", "inference", "postprocess", "rules", "frame_to_ack"):
        assert metric(m, "vigil_edge_stage_seconds_count", stage=stage) == total, stage
        assert metric(m, "vigil_edge_stage_seconds_sum", stage=stage) > 0, stage
        assert metric(m, "vigil_edge_stage_seconds_bucket", stage=stage, le="+Inf") == total, stage
    assert 1 <= metric(m, "vigil_edge_stage_seconds_count", stage="publish") <= total  # marks are coalesced
    # Frame to detection spans queue + preprocess + inference + postprocess of the same frames.
    assert metric(m, "vigil_edge_frame_to_detection_seconds_count") == total
    spanned = sum(metric(m, "vigil_edge_stage_seconds_sum", stage=s)
                  for s in ("queue", "preprocess", "inference", "postprocess"))
    assert spanned * 0.99 <= metric(m, "vigil_edge_frame_to_detection_seconds_sum") <= spanned * 1.5 + 1.0
    # The engine runs each batch once; every frame of a batch observes the whole run (max_batch 2).
    inference = metric(m, "vigil_edge_stage_seconds_sum", stage="inference")
    busy = metric(m, "vigil_edge_engine_busy_seconds_total")
    assert inference / 2 * 0.999 <= busy <= inference * 1.001, (busy, inference)
    for stream in ("vtest", "images"):
        assert metric(m, "vigil_edge_frames_dropped_total", stream=stream, reason="queue_full") == 0
        assert metric(m, "vigil_edge_decode_errors_total", stream=stream) == 0
        assert metric(m, "vigil_edge_stream_decoder", stream=stream, decoder="cpu") == 1
        assert metric(m, "vigil_edge_reconnects_total", stream=stream) == 0
        assert metric(m, "vigil_edge_stream_errors_total", stream=stream) == 0
        assert metric(m, "vigil_edge_fps", stream=stream) >= 0
        assert metric(m, "vigil_edge_queue_depth", queue="reader", stream=stream) == 0
    assert metric(m, "vigil_edge_queue_depth", queue="outbox") == 0  # everything acknowledged

    # Boxes vs ONNX Runtime on the very pictures the edge decoded (module docstring: why two references).
    import oracle

    for stream, n, classes in (("vtest", FRAMES, {0}), ("images", len(IMAGES), None)):
        frames = tmp_path / "frames" / stream
        fails, compared = boxes_vs_ort(agg.db, frames, stream, MODEL, n, iou=0.7, min_iou=0.98, box_atol=0.5,
                                       max_dscore=0.02, classes=classes)
        assert not fails, "vs ORT on the int8 file: " + describe_fails(fails, compared)
    shutil.rmtree(tmp_path / "frames")  # ~270 MB


def test_yolox_boxes_match_ort_within_2px(vtest200, tmp_path):
    """fp32 YOLOX-nano through edge and aggregator: every stored box within 2 px of ONNX Runtime's on the same
    decoded frame (a box corner compared, not IoU: IoU >= 1.01 cannot hold), scores within 0.01."""
    if not YOLOX.is_file():
        pytest.skip(f"{YOLOX} missing (set VIGIL_SHARED_MODELS)")
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    try:
        cfg = write_edge_config(tmp_path, agg.port, vtest200, True, model=YOLOX, save_frames=True, persons_only=False)
        edge = start_edge(cfg, tmp_path)
        wait_edge(edge, tmp_path)
    finally:
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)
    assert_accounted_once(agg.db, "images", len(IMAGES))
    for stream, n in (("vtest", FRAMES), ("images", len(IMAGES))):
        fails, compared = boxes_vs_ort(agg.db, tmp_path / "frames" / stream, stream, YOLOX, n, iou=0.45,
                                       min_iou=1.01, box_atol=2.0, max_dscore=0.01)
        assert not fails, describe_fails(fails, compared)
    shutil.rmtree(tmp_path / "frames")


def kill_aggregator_mid_run(agg: Aggregator, edge: subprocess.Popen):
    """SIGKILLs the aggregator once 40 frames of 'vtest' are stored (and before all are), then restarts it."""
    deadline = time.monotonic() + 120
    while stored_frames(agg.db, "vtest") < 40 and time.monotonic() < deadline and edge.poll() is None:
        time.sleep(0.2)
    stored = stored_frames(agg.db, "vtest")
    assert 0 < stored < FRAMES, f"{stored} frames stored before the kill: cannot test a kill mid-run"
    agg.kill()
    time.sleep(1.0)
    agg.start()


def test_aggregator_killed_and_restarted(vtest200, tmp_path, engine):
    port = free_port()
    agg = Aggregator(tmp_path, port, pg=engine)
    agg.start()
    edge = start_edge(write_edge_config(tmp_path, port, vtest200, False), tmp_path)
    try:
        kill_aggregator_mid_run(agg, edge)
        wait_edge(edge, tmp_path)
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)


def run_a_link_across_an_aggregator_kill(tmp: Path, video: Path, agg_extra: str, transport: str):
    """`vigil edge` with `transport` (the edge config's transport section, as a flow map) against an aggregator
    with `agg_extra`, SIGKILLed mid-run and restarted; every frame must be stored once. Returns (edge metrics,
    the restarted aggregator's metrics)."""
    port = free_port()
    agg = Aggregator(tmp, port, extra=agg_extra)
    agg.start()
    cfg = write_edge_config(tmp, port, video, False)
    cfg.write_text(cfg.read_text().replace("streams:\n", f"transport: {transport}\nstreams:\n", 1))
    edge = start_edge(cfg, tmp)
    try:
        kill_aggregator_mid_run(agg, edge)
        wait_edge(edge, tmp)
        text = urllib.request.urlopen(f"http://127.0.0.1:{agg.http_port}/metrics", timeout=10).read().decode()
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)
    return read_metrics(tmp / "edge.prom"), parse_metrics(text)


def test_cuda_ipc_link_with_a_host_ring_across_an_aggregator_kill(vtest200, tmp_path):
    """The cuda_ipc link as shipped, on a machine without a GPU (`device: host`): the edge prefers it over tcp,
    the aggregator is SIGKILLed mid-run and restarted; every frame is stored once and the reports went
    through the ring (the edge's link counters, the aggregator's ring counters)."""
    sock = tmp_path / "agg.sock"
    m, am = run_a_link_across_an_aggregator_kill(
        tmp_path, vtest200, f"cuda_ipc: {{socket: {sock}, device: host, slots: 8}}\nallow: [127.0.0.1/32]\n",
        f"{{links: [cuda_ipc, tcp], cuda_ipc: {sock}, probe_interval_ms: 100}}")
    assert metric(m, "vigil_edge_link_messages_total", link="cuda_ipc") > 0
    assert metric(m, "vigil_edge_link_messages_total", link="tcp") == 0
    assert metric(m, "vigil_edge_link_sessions_total", link="cuda_ipc") >= 2  # before and after the kill
    assert metric(m, "vigil_edge_link_transports", link="cuda_ipc", transports="shm") == 1
    assert metric(m, "vigil_edge_cuda_ipc_slots_total") > 0
    assert metric(am, "vigil_cuda_ipc_slots_total") > 0
    assert metric(am, "vigil_cuda_ipc_slots_rejected_total") == 0
    assert metric(am, "vigil_transport_rejected_total", link="cuda_ipc", reason="address") == 0


def test_ucx_link_across_an_aggregator_kill(vtest200, tmp_path):
    """The ucx link as shipped: the edge prefers it over tcp, the aggregator is SIGKILLed mid-run and restarted
    on the same ucx_listen port at once (the killed one's connections wait in TIME_WAIT there: a restart used to
    fail with "Address already in use"); every frame is stored once, all of them over ucx."""
    ucx_port = free_port()
    m, am = run_a_link_across_an_aggregator_kill(
        tmp_path, vtest200, f"ucx_listen: 127.0.0.1:{ucx_port}\n",
        f"{{links: [ucx, tcp], ucx: 127.0.0.1:{ucx_port}, probe_interval_ms: 100}}")
    assert metric(m, "vigil_edge_link_messages_total", link="ucx") > 0
    assert metric(m, "vigil_edge_link_sessions_total", link="ucx") >= 2  # before and after the kill
    assert metric(am, "vigil_transport_connections_total", link="ucx", result="authenticated") >= 1


def test_edge_killed_and_restarted(vtest200, tmp_path):
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    cfg = write_edge_config(tmp_path, port, vtest200, False)
    edge = start_edge(cfg, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while stored_frames(agg.db, "vtest") < 40 and time.monotonic() < deadline and edge.poll() is None:
            time.sleep(0.2)
        stored = stored_frames(agg.db, "vtest")
        assert 0 < stored < FRAMES, f"{stored} frames stored before the kill: cannot test a kill mid-run"
        edge.kill()
        edge.wait(timeout=30)
        state = json.loads((tmp_path / "state" / "ledger.json").read_text())
        edge = start_edge(cfg, tmp_path)
        wait_edge(edge, tmp_path)
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
    run, _ = assert_accounted_once(agg.db, "vtest", FRAMES)
    (record,) = [s for s in state["streams"] if s["stream"] == "vtest"]
    assert record["run"] == run, f"state before the restart: {state}; stored run {run}"
    # The aggregator granted each start its own epoch; the resumed run kept the first one's id.
    assert query(agg.db, "SELECT epoch FROM edges WHERE edge = 'e2e-edge'") == [(2,)]
    assert run == 1
    epochs = {r[0] for r in query(agg.db, "SELECT DISTINCT f.epoch FROM frames f")}
    assert epochs == {1, 2}, f"frames stored from epochs {epochs}; want both edge starts"
    log = (tmp_path / "edge.log").read_text()
    assert "resuming run" in log, log[-3000:]


def test_bad_streams_do_not_affect_the_good_one(vtest200, tmp_path):
    """One config with a corrupt file, a missing file, an unreachable RTSP URL and a good file: the
    good stream completes and is accounted exactly once, the others are counted as errors (edge
    /metrics), and the edge stays up (the unreachable URL keeps it retrying until SIGTERM)."""
    import json
    import urllib.request

    corrupt = tmp_path / "corrupt.mp4"
    data = bytearray(vtest200.read_bytes())
    data[64:64 + 4096] = os.urandom(4096)  # smash the container header
    corrupt.write_bytes(bytes(data[: len(data) // 3]))
    dead_port = free_port()  # nothing listens there
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    http_port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"""edge: mixed-edge
aggregator: 127.0.0.1:{agg.port}
model: {{path: {MODEL}, threads: {THREADS}}}
batching: {{max_batch: 2, max_wait_ms: 5}}
http_port: {http_port}
state_dir: {tmp_path / 'state'}
streams:
  - id: good
    source: {vtest200}
  - id: corrupt
    source: {corrupt}
  - id: missing
    source: {tmp_path / 'no-such-file.mp4'}
  - id: camera
    source: rtsp://127.0.0.1:{dead_port}/live
""")
    edge = start_edge(cfg, tmp_path)
    try:
        deadline = time.monotonic() + 300
        while stored_frames(agg.db, "good") < FRAMES and time.monotonic() < deadline and edge.poll() is None:
            time.sleep(0.5)
        assert edge.poll() is None, f"edge exited {edge.returncode}:\n{(tmp_path / 'edge.log').read_text()[-3000:]}"
        assert_accounted_once(agg.db, "good", FRAMES)
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10).read())
        assert (health["status"], health["edge"], health["aggregator_connected"]) == ("ok", "mixed-edge", True), health
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
        errors = {line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("vigil_edge_stream_errors_total{")}
        assert errors.get("missing", 0) >= 1, f"missing file not counted: {errors}"
        assert errors.get("good", 0) == 0, f"good stream counted as failed: {errors}"
        bad_corrupt = errors.get("corrupt", 0) >= 1 or any(
            line.startswith('vigil_edge_decode_errors_total{stream="corrupt"}') and float(line.split()[-1]) > 0
            for line in metrics.splitlines())
        assert bad_corrupt, "corrupt file neither failed nor counted decode errors"
        log = (tmp_path / "edge.log").read_text()
        assert "no-such-file.mp4" in log, "the missing file's error does not name it"
        assert f"127.0.0.1:{dead_port}" in log, "the unreachable camera is never mentioned in the log"
    finally:
        if edge.poll() is None:
            edge.send_signal(signal.SIGTERM)
            try:
                edge.wait(timeout=60)
            except subprocess.TimeoutExpired:
                edge.kill()
        agg.kill(signal.SIGTERM)


def test_hwaccel_cuda_decodes_where_it_can_and_says_where(vtest200, tmp_path):
    """`hwaccel: cuda` for every stream, on vtest.avi's MS-MPEG4 v3, which NVDEC cannot decode: on any machine,
    GPU or not, the stream decodes on the CPU and delivers every frame, and the edge says where it decoded and
    why, in /metrics (vigil_edge_stream_decoder, one series at 1) and in the stream's "ended" log line.
    (NVDEC itself is tested on the GPU machine: vigil_video_tests GpuDecode.*, scripts/gpu-check.sh edge.)"""
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    try:
        cfg = write_edge_config(tmp_path, agg.port, vtest200, with_images=False)
        cfg.write_text(cfg.read_text() + "hwaccel: cuda\n")
        wait_edge(start_edge(cfg, tmp_path), tmp_path)
        assert_accounted_once(agg.db, "vtest", FRAMES)
    finally:
        agg.kill(signal.SIGTERM)
    m = read_metrics(tmp_path / "edge.prom")
    series = {dict(k[1])["decoder"]: v for k, v in m.items() if k[0] == "vigil_edge_stream_decoder"}
    assert [d for d, v in series.items() if v == 1] == list(series), series  # one series, at 1
    (decoder,) = series
    assert decoder == "cpu (the msmpeg4 decoder has no CUDA hwaccel in this FFmpeg)", decoder
    log = (tmp_path / "edge.log").read_text()
    assert f"stream 'vtest': ended; decoded on {decoder}, 0 decode errors" in log, log[-2000:]


def test_edge_with_no_openable_stream_fails(tmp_path):
    """Every stream fails to open: the edge exits non-zero naming why, so a supervisor notices."""
    from common import describe, shared_model, vigil

    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"edge: e1\naggregator: 127.0.0.1:{free_port()}\n"
                   f"model: {{path: {shared_model('yolov8n_coco_640_int8dyn.onnx')}}}\n"
                   f"state_dir: {tmp_path / 'state'}\nstreams:\n  - {{id: a, source: {tmp_path / 'absent.avi'}}}\n")
    p = vigil("edge", "--config", cfg, timeout=120)
    assert p.returncode == 2, describe(p)
    assert "none of the 1 configured streams could be opened" in p.stderr, describe(p)
    assert "absent.avi" in p.stderr, describe(p)
