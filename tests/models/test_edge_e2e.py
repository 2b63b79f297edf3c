"""End to end on loopback: `vigil aggregator` and `vigil edge` as separate processes (issue 3).

The edge reads the first 200 frames of opencv-doc's vtest.avi and darknet's sample images, runs the
int8 YOLOv8n model, and reports every frame to the aggregator (events for frames with a person, resp.
any detection for the images, progress marks for the rest). The aggregator's SQLite database must then
account for every frame exactly once: one row per (stream, run, seq) in `frames`, seqs 0..N-1 with no
hole, one run per stream, at most one event per frame. Then the same after a SIGKILL of the aggregator
mid-run (restarted on the same database and port), and after a SIGKILL of the edge mid-run (restarted
with the same state dir: same run, resumes after its cursor, a new epoch).

Needs: VIGIL_BIN, the model in VIGIL_SHARED_MODELS (default <repo>/../shared/models), ffmpeg/ffprobe,
/usr/share/doc/opencv-doc/examples/data/vtest.avi, /usr/share/darknet/data/*.jpg — skipped otherwise.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from common import SHARED_DIR, THREADS, vigil_bin

VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
DARKNET = Path("/usr/share/darknet/data")
MODEL = SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"
FRAMES = 200
IMAGES = sorted(p.name for p in DARKNET.glob("*.jpg")) if DARKNET.is_dir() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class Aggregator:
    def __init__(self, tmp: Path, port: int):
        self.port = port
        self.db = tmp / "agg.db"
        self.config = tmp / "agg.yaml"
        self.config.write_text(f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{free_port()}\ndb: {self.db}\n")
        self.log = open(tmp / "agg.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([vigil_bin(), "aggregator", "--config", str(self.config)],
                                     stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        assert line.startswith("vigil aggregator:"), f"aggregator did not start: {line!r}"

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)


def write_edge_config(tmp: Path, agg_port: int, video: Path, with_images: bool) -> Path:
    streams = f"""  - id: vtest
    source: {video}
    rules:
      classes: [person]
      severity: {{critical: 0.8, warning: 0.5}}
"""
    if with_images:
        streams += f"""  - id: images
    source: {DARKNET}/*.jpg
"""
    cfg = tmp / "edge.yaml"
    cfg.write_text(f"""edge: e2e-edge
aggregator: 127.0.0.1:{agg_port}
model: {{path: {MODEL}, threads: {THREADS}}}
batching: {{max_batch: 2, max_wait_ms: 5}}
http_port: {free_port()}
state_dir: {tmp / 'state'}
progress_flush_ms: 200
streams:
{streams}""")
    return cfg


def start_edge(cfg: Path, tmp: Path) -> subprocess.Popen:
    log = open(tmp / "edge.log", "ab")  # spdlog writes to stdout, errors of the command to stderr
    return subprocess.Popen([vigil_bin(), "--log-level", "info", "edge", "--config", str(cfg),
                             "--shutdown-timeout-ms", "60000"], stdout=log, stderr=log)


def query(db: Path, sql: str, *args):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def stored_frames(db: Path, stream: str) -> int:
    if not db.exists():
        return 0
    try:
        return query(db, "SELECT COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id WHERE s.stream = ?",
                     stream)[0][0]
    except sqlite3.OperationalError:  # schema not created yet
        return 0


def assert_accounted_once(db: Path, stream: str, n: int):
    runs = query(db, "SELECT f.run, COUNT(*), MIN(f.seq), MAX(f.seq), SUM(f.kind = 1), SUM(f.kind = 2) "
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


def wait_edge(edge: subprocess.Popen, tmp: Path, timeout=300):
    rc = edge.wait(timeout=timeout)
    assert rc == 0, f"edge exited {rc}:\n{(tmp / 'edge.log').read_text()[-3000:]}"


def test_every_frame_accounted_persons_and_dog(vtest200, tmp_path):
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    try:
        edge = start_edge(write_edge_config(tmp_path, agg.port, vtest200, True), tmp_path)
        wait_edge(edge, tmp_path)
    finally:
        agg.kill(signal.SIGTERM)
    _, person_frames = assert_accounted_once(agg.db, "vtest", FRAMES)
    assert person_frames >= 0.9 * FRAMES, f"persons on {person_frames}/{FRAMES} vtest frames"
    assert_accounted_once(agg.db, "images", len(IMAGES))
    dog = labels_at(agg.db, "images", IMAGES.index("dog.jpg"))
    assert {"dog", "bicycle"} <= dog, f"dog.jpg gave {dog}"


def test_aggregator_killed_and_restarted(vtest200, tmp_path):
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    edge = start_edge(write_edge_config(tmp_path, port, vtest200, False), tmp_path)
    try:
        deadline = time.monotonic() + 120
        while stored_frames(agg.db, "vtest") < 40 and time.monotonic() < deadline and edge.poll() is None:
            time.sleep(0.2)
        stored = stored_frames(agg.db, "vtest")
        assert 0 < stored < FRAMES, f"{stored} frames stored before the kill: cannot test a kill mid-run"
        agg.kill()
        time.sleep(1.0)
        agg.start()
        wait_edge(edge, tmp_path)
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)


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
        state = (tmp_path / "state" / "streams" / "vtest.state").read_text()
        edge = start_edge(cfg, tmp_path)
        wait_edge(edge, tmp_path)
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
    run, _ = assert_accounted_once(agg.db, "vtest", FRAMES)
    assert state.startswith(f"run {run}\n"), f"state before the restart: {state!r}; stored run {run}"
    assert (tmp_path / "state" / "epoch").read_text().strip() == "2"
    epochs = {r[0] for r in query(agg.db, "SELECT DISTINCT f.epoch FROM frames f")}
    assert epochs == {1, 2}, f"frames stored from epochs {epochs}; want both edge starts"
    log = (tmp_path / "edge.log").read_text()
    assert "resuming run" in log, log[-3000:]


def test_bad_streams_do_not_affect_the_good_one(vtest200, tmp_path):
    """One config with a corrupt file, a missing file, an unreachable RTSP URL and a good file: the
    good stream completes and is accounted exactly once, the others are counted as errors (edge
    /metrics), and the edge stays up (the unreachable URL keeps it retrying until SIGTERM)."""
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
