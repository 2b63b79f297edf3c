"""The stream ledger end to end (issue 12): `vigil aggregator` and `vigil edge` as processes on loopback, a live
camera (an FFmpeg mpegts feed over TCP) and a proxy between edge and aggregator that can withhold acks and
hold or swallow reports, so the tests can build the states a crash or a partition leaves behind.

- Live restart: the aggregator stored frames whose acks never reached the edge, and the edge numbered frames
  that never reached the aggregator; the edge is SIGKILLed and restarted on the same state_dir. The restarted
  edge continues the same run above every seq the dead one assigned, reports exactly the assigned-but-never-
  delivered seqs as lost_on_restart, re-sends nothing, and the run has no gap.
- Zombie: an edge with reports in flight is SIGSTOPped; a second edge with the same id (its own state_dir)
  is admitted with a newer epoch; the first one's held reports then reach the aggregator and are all refused
  as stale (nothing of the old session stored after the new Hello), and once continued the first edge exits 3
  naming the fencing.

Needs: VIGIL_BIN, ffmpeg (lavfi testsrc, libx264, mpegts), the int8 YOLOv8n in VIGIL_SHARED_MODELS.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from common import SHARED_DIR, THREADS, vigil_bin
from edge_harness import Aggregator, Camera, ReportProxy, free_port, parse_metrics, query, skip_without, stop

MODEL = SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"


@pytest.fixture(autouse=True)
def needs():
    skip_without(MODEL, "ffmpeg")


def edge_config(tmp: Path, name: str, port: int, source: str, state: str, extra_stream: str = "") -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(f"""edge: ledger-edge
aggregator: 127.0.0.1:{port}
model: {{path: {MODEL}, threads: {THREADS}}}
batching: {{max_batch: 2, max_wait_ms: 5}}
http_port: {free_port()}
state_dir: {tmp / state}
progress_flush_ms: 100
streams:
  - id: cam
    source: {source}
    target_fps: 5
{extra_stream}""")
    return cfg


def start_edge(cfg: Path, tmp: Path, name: str) -> subprocess.Popen:
    log = open(tmp / f"{name}.log", "ab")
    return subprocess.Popen([vigil_bin(), "--log-level", "info", "edge", "--config", str(cfg),
                             "--shutdown-timeout-ms", "5000"], stdout=log, stderr=log)


def http_port_of(cfg: Path) -> int:
    return int(next(line.split(":")[1] for line in cfg.read_text().splitlines() if line.startswith("http_port")))


def scrape(port: int) -> dict:
    return parse_metrics(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())


def frames(db: Path, stream="cam"):
    """[(run, seq, kind, epoch, stored_ns)] of the stream, by seq."""
    return query(db, "SELECT f.run, f.seq, f.kind, f.epoch, f.stored_ns FROM frames f JOIN streams s ON s.id = "
                     "f.stream_id WHERE s.stream = ? ORDER BY f.run, f.seq", stream)


def wait_for(what: str, cond, timeout=120, edge=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if edge is not None and edge.poll() is not None:
            pytest.fail(f"edge exited {edge.returncode} while waiting for {what}:\n{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}" + (f":\n{log.read_text()[-3000:]}" if log else ""))


def test_live_restart_continues_above_every_assigned_seq_and_reports_the_lost_ones(tmp_path):
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    proxy = ReportProxy(agg.port)
    camera = Camera(tmp_path)
    camera.start()
    cfg = edge_config(tmp_path, "edge", proxy.port, camera.url, "state")
    log = tmp_path / "edge.log"
    edge = None
    try:
        proxy.acks = "drop"  # the aggregator stores, the edge never learns it
        edge = start_edge(cfg, tmp_path, "edge")
        wait_for("15 frames stored", lambda: len(frames(agg.db)) >= 15 if agg.db.exists() else False, edge=edge, log=log)
        proxy.reports = "drop"  # from now on the edge numbers frames that never reach the aggregator
        wait_for("6 reports swallowed", lambda: proxy.dropped_reports >= 6, edge=edge, log=log)
        camera.stop()  # no new pictures: the edge drains its queues and persists its high-water mark
        state = tmp_path / "state" / "ledger.json"
        last = [None]

        def settled():
            now = (json.loads(state.read_text())["streams"][0]["next_seq"], len(frames(agg.db)))
            done = now == last[0]
            last[0] = now
            return done
        time.sleep(1.0)
        wait_for("the edge to settle", settled, edge=edge, log=log)
        time.sleep(1.0)
        assert settled(), "the edge kept numbering frames with its camera stopped"
        assigned = json.loads(state.read_text())["streams"][0]["next_seq"]
        before = frames(agg.db)
        edge.send_signal(signal.SIGKILL)
        edge.wait(timeout=30)

        run = before[0][0]
        stored_before = {seq for r, seq, *_ in before}
        highest = max(stored_before)
        assert stored_before == set(range(highest + 1)), "the run had a gap before the kill"
        assert highest + 1 < assigned, f"nothing assigned above the highest stored seq {highest}: cannot test loss"

        proxy.acks, proxy.reports = "pass", "pass"
        camera.start()
        edge = start_edge(cfg, tmp_path, "edge")
        wait_for("frames after the restart", lambda: max(r[1] for r in frames(agg.db)) >= assigned + 5, edge=edge,
                 log=log)
        m = scrape(http_port_of(cfg))
        lost_metric = m[("vigil_edge_frames_lost_on_restart_total", frozenset({("stream", "cam")}))]
    finally:
        stop(edge)
        camera.stop()
        proxy.close()
        agg.kill(signal.SIGTERM)

    after = frames(agg.db)
    assert {r for r, *_ in after} == {run}, "the restarted edge must continue the same run"
    seqs = [s for _, s, *_ in after]
    assert seqs == list(range(len(seqs))), "every seq of the run is accounted exactly once, with no gap"
    lost = [s for _, s, kind, *_ in after if kind == 4]
    assert lost == list(range(highest + 1, assigned)), f"lost {lost[:3]}..{lost[-3:]}; want {highest + 1}..{assigned - 1}"
    assert lost_metric == assigned - highest - 1
    new = [s for _, s, kind, epoch, _ in after if epoch == 2 and kind != 4]
    assert min(new) == assigned, f"the restarted edge's first frame is seq {min(new)}, want {assigned}"
    assert query(agg.db, "SELECT duplicates FROM streams WHERE stream = 'cam'") == [(0,)]
    assert query(agg.db, "SELECT epoch FROM edges") == [(2,)]
    assert "seqs lost on restart" in log.read_text()


def test_zombie_edge_is_fenced_and_nothing_of_its_session_is_stored_after_the_new_hello(tmp_path):
    agg = Aggregator(tmp_path, free_port(), extra="peer_timeout_ms: 120000\n")
    agg.start()
    proxy = ReportProxy(agg.port)
    camera_a, camera_b = Camera(tmp_path), Camera(tmp_path)
    camera_a.start()
    camera_b.start()
    cfg_a = edge_config(tmp_path, "a", proxy.port, camera_a.url, "state-a")
    cfg_b = edge_config(tmp_path, "b", agg.port, camera_b.url, "state-b")
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = b = None
    try:
        proxy.acks = "drop"  # a keeps its reports unacknowledged
        a = start_edge(cfg_a, tmp_path, "a")
        wait_for("a's frames", lambda: len(frames(agg.db)) >= 5 if agg.db.exists() else False, edge=a, log=log_a)
        proxy.reports = "hold"
        wait_for("a's reports in flight", lambda: len(proxy.held) >= 3, edge=a, log=log_a)
        a.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # what a wrote before the stop reaches the proxy, what passed it is committed
        b_started_ns = time.time_ns()
        b = start_edge(cfg_b, tmp_path, "b")
        wait_for("b's frames", lambda: any(e == 2 for *_, e, _ in frames(agg.db)), edge=b, log=log_b)
        stale_before = query(agg.db, "SELECT COALESCE(SUM(stale_rejected), 0) FROM streams")[0][0]
        released = proxy.release()  # a's old-epoch reports arrive after b was admitted
        assert released >= 3
        wait_for("a's reports refused as stale",
                 lambda: query(agg.db, "SELECT COALESCE(SUM(stale_rejected), 0) FROM streams")[0][0] >= stale_before + released)
        a.send_signal(signal.SIGCONT)
        rc = a.wait(timeout=60)
        assert rc == 3, f"the fenced edge exited {rc}:\n{log_a.read_text()[-3000:]}"
        assert b.poll() is None, f"edge b exited {b.returncode}:\n{log_b.read_text()[-3000:]}"
    finally:
        if a is not None and a.poll() is None:
            a.send_signal(signal.SIGCONT)
        stop(a)
        stop(b)
        camera_a.stop()
        camera_b.stop()
        proxy.close()
        agg.kill(signal.SIGTERM)

    rows = frames(agg.db)
    assert any(epoch == 2 for *_, epoch, _ in rows)
    late_old = [seq for _, seq, _, epoch, stored in rows if epoch == 1 and stored >= b_started_ns]
    assert late_old == [], f"frames of the old session stored after the second edge started: {late_old}"
    assert query(agg.db, "SELECT epoch FROM edges") == [(2,)]
    text = log_a.read_text()
    assert "vigil edge: fenced:" in text, text[-3000:]


def test_a_second_edge_on_the_same_state_dir_is_refused(tmp_path):
    """The state_dir is one edge's: a second `vigil edge` on it exits 2 naming the dir and the holder's pid,
    and the first runs on (here: waiting for an aggregator that is not there, until SIGTERM)."""
    clip = tmp_path / "clip.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=5", "-t", "2",
                    "-c:v", "libx264", "-preset", "ultrafast", str(clip)], check=True, timeout=60)
    nobody = free_port()  # no aggregator listens: the first edge waits to be admitted
    cfg_a = edge_config(tmp_path, "a", nobody, str(clip), "state")
    cfg_b = edge_config(tmp_path, "b", nobody, str(clip), "state")
    a = start_edge(cfg_a, tmp_path, "a")
    try:
        wait_for("the first edge to wait for its aggregator",
                 lambda: "waiting for the aggregator" in (tmp_path / "a.log").read_text(), edge=a, log=tmp_path / "a.log")
        b = subprocess.run([vigil_bin(), "edge", "--config", str(cfg_b)], capture_output=True, text=True, timeout=120)
        assert b.returncode == 2, b.stderr[-2000:]
        assert f"state_dir '{tmp_path / 'state'}' is in use by another vigil edge (pid {a.pid})" in b.stderr, b.stderr
        assert a.poll() is None
    finally:
        stop(a)
    assert a.returncode == 0, (tmp_path / "a.log").read_text()[-2000:]
