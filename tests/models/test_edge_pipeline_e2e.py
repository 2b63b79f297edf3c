"""The edge pipeline under load, end to end (issue 13): `vigil aggregator` + `vigil edge` as processes.

Eight live cameras (synthetic sources with live=1: a test pattern delivered at 10 FPS by the clock, whose
readers drop their oldest frame when the pipeline is behind, as a network camera's do) on a slow engine
(the int8 YOLOv8n at 640 on this machine's CPU: a few frames a second for all eight together). The engine is
the bottleneck, so:
- every stream is served fairly: the per-stream processed counts stay within one batch (max_batch) of
  each other (round-robin batches, pipeline/batcher.h);
- what a stream could not process is dropped by its reader, counted per stream
  (vigil_edge_frames_dropped_total{reason="queue_full"}) and reported as drop marks, so the aggregator
  accounts for every seq of every stream exactly once: processed (event or progress) or dropped, no gap;
- SIGTERM stops the edge without waiting for the engine to get through the queues (queued frames of a
  live stream become "shutdown" drop marks), and it exits 0.

Needs: VIGIL_BIN and the model in VIGIL_SHARED_MODELS — skipped otherwise.
"""
from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from common import SHARED_DIR, vigil_bin
from edge_harness import Aggregator, free_port, metric, query, read_metrics

MODEL = SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"
STREAMS = 8
MAX_BATCH = 4


def per_stream_kinds(db: Path, stream: str) -> tuple[dict[int, int], int, int]:
    """({kind: frames}, lowest seq, highest seq) of the stream's one run; asserts one run."""
    runs = query(db, "SELECT f.run, COUNT(*), MIN(f.seq), MAX(f.seq) FROM frames f JOIN streams s "
                     "ON s.id = f.stream_id WHERE s.stream = ? GROUP BY f.run", stream)
    assert len(runs) == 1, f"{stream}: expected one run, got {runs}"
    run, count, lo, hi = runs[0]
    assert (count, lo) == (hi + 1, 0), f"{stream}: {count} frames stored, seqs {lo}..{hi}: a gap"
    kinds = dict(query(db, "SELECT f.kind, COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id "
                           "WHERE s.stream = ? GROUP BY f.kind", stream))
    return kinds, lo, hi


def test_eight_live_cameras_on_a_slow_engine_are_served_fairly_and_every_drop_is_counted(tmp_path):
    if not MODEL.is_file():
        pytest.skip(f"{MODEL} missing (set VIGIL_SHARED_MODELS)")
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    streams = "".join(f"  - {{id: cam{i}, source: 'synthetic:320x240?fps=10&live=1'}}\n" for i in range(STREAMS))
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"""edge: load-edge
aggregator: 127.0.0.1:{agg.port}
model: {{path: {MODEL}, threads: 2}}
batching: {{max_batch: {MAX_BATCH}, max_wait_ms: 5}}
state_dir: {tmp_path / 'state'}
progress_flush_ms: 100
http_port: {free_port()}
streams:
{streams}""")
    log = open(tmp_path / "edge.log", "ab")
    prom = tmp_path / "edge.prom"
    edge = subprocess.Popen([vigil_bin(), "--log-level", "info", "edge", "--config", str(cfg), "--metrics-out",
                             str(prom), "--shutdown-timeout-ms", "30000"], stdout=log, stderr=log)
    try:
        # Long enough for several rounds over the eight streams and for every reader to have dropped.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and edge.poll() is None:
            text = (tmp_path / "edge.log").read_text(errors="replace")
            if re.search(r"epoch \d+, \d+ streams", text):  # admitted, readers started
                break
            time.sleep(0.2)
        time.sleep(12)
        assert edge.poll() is None, (tmp_path / "edge.log").read_text()[-3000:]
        edge.send_signal(signal.SIGTERM)
        rc = edge.wait(timeout=120)
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
    assert rc == 0, (tmp_path / "edge.log").read_text()[-3000:]

    m = read_metrics(prom)
    processed = {f"cam{i}": metric(m, "vigil_edge_frames_total", stream=f"cam{i}") for i in range(STREAMS)}
    assert min(processed.values()) >= 2, processed
    # Fair: within one batch of each other, whatever the order the readers started in.
    assert max(processed.values()) - min(processed.values()) <= MAX_BATCH, processed
    for stream, n in processed.items():
        queue_full = metric(m, "vigil_edge_frames_dropped_total", stream=stream, reason="queue_full")
        shutdown = metric(m, "vigil_edge_frames_dropped_total", stream=stream, reason="shutdown")
        assert queue_full > 0, f"{stream}: the slow engine made no reader drop"
        kinds, _, hi = per_stream_kinds(agg.db, stream)
        # Every seq once: processed as event or progress, or dropped (queue_full or shutdown); none lost.
        assert kinds.get(1, 0) + kinds.get(2, 0) == n, (stream, kinds, n)
        assert kinds.get(3, 0) == queue_full + shutdown, (stream, kinds, queue_full, shutdown)
        assert kinds.get(4, 0) == 0, (stream, kinds)
        assert hi + 1 == n + queue_full + shutdown, (stream, hi, n, queue_full, shutdown)
