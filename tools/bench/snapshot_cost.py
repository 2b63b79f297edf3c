#!/usr/bin/env python3
"""What snapshots cost the edge: `vigil edge` on all 795 frames of opencv-doc's vtest.avi (a person in every frame:
an event per frame) against `vigil aggregator` (SQLite), with snapshots off, the frame only, and the frame with a
crop per box, alternately, ROUNDS times. Prints per run the edge's wall time and frames per second, the pictures the
edge sent and why others were not, and the pictures and JPEG bytes the aggregator stored; JSON lines with --json.

Usage: tools/bench/snapshot_cost.py --vigil build/src/vigil --model ../shared/models/yolov8n_coco_640_int8dyn.onnx
       [--rounds 2] [--threads N] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

VTEST = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"
MODES = {"off": "", "frame": "{max_width: 640, quality: 80}",
         "frame+crops": "{max_width: 640, crops: true, quality: 80}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r'vigil_edge_snapshots_total\{result="(\w+)",stream="vtest"\} (\S+)', line) or \
            re.fullmatch(r'vigil_edge_snapshots_total\{stream="vtest",result="(\w+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = int(float(m.group(2)))
    return out


def run(vigil: str, model: str, threads: int, mode: str, tmp: Path) -> dict:
    d = Path(tempfile.mkdtemp(dir=tmp, prefix=mode.replace("+", "_") + "-"))
    port, http = free_port(), free_port()
    (d / "agg.yaml").write_text(f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\ndb: {d / 'agg.db'}\n"
                                "auth: {required: false}\n")
    agg = subprocess.Popen([vigil, "--log-level", "warn", "aggregator", "--config", str(d / "agg.yaml")],
                           stdout=subprocess.DEVNULL, stderr=open(d / "agg.log", "w"))
    time.sleep(1.0)
    snap = f"snapshots: {MODES[mode]}\n" if MODES[mode] else ""
    (d / "edge.yaml").write_text(f"edge: bench\naggregator: 127.0.0.1:{port}\nmodel: {{path: {model}, threads: {threads}}}\n"
                                 f"batching: {{max_batch: 4, max_wait_ms: 10}}\nstate_dir: {d / 'state'}\n{snap}"
                                 f"streams:\n  - id: vtest\n    source: {VTEST}\n    rules: {{min_score: 0.4}}\n")
    t0 = time.monotonic()
    rc = subprocess.run([vigil, "--log-level", "warn", "edge", "--config", str(d / "edge.yaml"), "--metrics-out",
                         str(d / "edge.prom")], stderr=open(d / "edge.log", "w")).returncode
    wall = time.monotonic() - t0
    agg.terminate()
    agg.wait(timeout=30)
    assert rc == 0, (d / "edge.log").read_text()[-2000:]
    con = sqlite3.connect(d / "agg.db")
    frames = con.execute("SELECT COUNT(*) FROM frames").fetchone()[0]
    events = con.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    pictures, jpeg_bytes = con.execute("SELECT COUNT(*), COALESCE(SUM(length(jpeg)), 0) FROM snapshots").fetchone()
    con.close()
    return {"mode": mode, "wall_s": round(wall, 2), "frames": frames, "fps": round(frames / wall, 2), "events": events,
            "edge": metrics(d / "edge.prom"), "stored_pictures": pictures, "stored_bytes": jpeg_bytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", default="build/src/vigil")
    ap.add_argument("--model", default="../shared/models/yolov8n_coco_640_int8dyn.onnx")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    a = ap.parse_args()
    out = open(a.json, "w") if a.json else None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode in MODES:
                res = run(os.path.abspath(a.vigil), os.path.abspath(a.model), a.threads, mode, Path(tmp))
                res["round"] = r + 1
                print(json.dumps(res), flush=True)
                if out:
                    out.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
