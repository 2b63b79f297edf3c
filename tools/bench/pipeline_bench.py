"""Pipeline benchmark (issue 3): `vigil edge` on N file streams (realtime off) into `vigil aggregator` on
loopback, next to `vigil bench engine` on the same model, engine batch and thread count.

Method (one run; scripts/bench-pipeline.sh is the entry point):
- The first --frames frames of opencv-doc's vtest.avi (768x576, MS-MPEG4 v3) copied without re-encoding;
  --streams streams read that file, realtime off, so the pipeline runs as fast as it can (file sources
  block instead of dropping). Rules: none (an event for every frame with a detection).
- Edge: model batch = cross-stream max_batch = --batch, max_wait 10 ms; its final metrics come from
  `vigil edge --metrics-out`. Aggregator: SQLite in the output folder.
- Throughput: frames stored / (last frame stored at the aggregator - first frame released by a source at
  the edge), both on the system clock of this machine (events carry capture_ns, frames stored_ns), so
  model loading and process start are excluded. Frame-to-stored latency: per event frame, stored_ns -
  capture_ns (percentiles by nearest rank); with realtime off it includes the time frames wait in the
  bounded queues behind the engine.
- Time by stage: the edge's per-stage histogram sums (wall time of the thread running the stage) per
  frame; inference is the engine's busy time (each run once) per frame. CPU: user + system time of the
  edge and aggregator processes (os.wait4) per frame.
- Engine only: `vigil bench engine --json` on the same model/batch/threads, once before and once after the
  pipeline run (the machine is shared: the two show how much it moved); its throughput is
  batch * 1000 / mean latency. The ratio is taken against the faster of the two (the harder goal).
Prints Markdown for docs/benchmarks.md and writes everything to <out>/result.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sqlite3
import secrets
import subprocess
import time
from pathlib import Path

VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[max(0, min(len(v) - 1, int(-(-q * len(v) // 1)) - 1))]  # nearest rank


def read_metrics(path: Path) -> dict[tuple[str, frozenset], float]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if m and not line.startswith("#"):
            out[(m.group(1), frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))] = float(m.group(3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--frames", type=int, default=200, help="frames per stream")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--workers", type=int, default=1,
                    help="edge model.workers; each gets threads // workers kernel threads (engine-only keeps --threads)")
    ap.add_argument("--iters", type=int, default=30, help="engine benchmark runs")
    ap.add_argument("--vigil", default="build/src/vigil")
    ap.add_argument("--out", default="runs/bench-pipeline")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    clip = out / f"vtest{a.frames}.avi"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(VTEST), "-frames:v", str(a.frames), "-c", "copy", str(clip)],
                   check=True)

    agg_port, agg_http = free_port(), free_port()
    key = secrets.token_hex(32)  # authenticated, as shipped
    (out / "edge.key").write_text(key + "\n")
    (out / "keys.yaml").write_text(f"bench-edge: {key}\n")
    for f in ("edge.key", "keys.yaml"):
        (out / f).chmod(0o600)
    (out / "agg.yaml").write_text(f"listen: 127.0.0.1:{agg_port}\nhttp: 127.0.0.1:{agg_http}\ndb: {out / 'agg.db'}\n"
                                  f"auth: {{keys_file: {out / 'keys.yaml'}}}\n")
    streams = "".join(f"  - id: s{i}\n    source: {clip}\n" for i in range(a.streams))
    (out / "edge.yaml").write_text(f"""edge: bench-edge
aggregator: 127.0.0.1:{agg_port}
model: {{path: {Path(a.model).resolve()}, threads: {max(1, a.threads // a.workers)}, batch: {a.batch}, workers: {a.workers}}}
batching: {{max_batch: {a.batch}, max_wait_ms: 10}}
state_dir: {out / 'state'}
progress_flush_ms: 200
transport: {{key_file: {out / 'edge.key'}}}
streams:
{streams}""")
    def engine():
        return json.loads(subprocess.run([a.vigil, "bench", "engine", "--model", a.model, "--batch", str(a.batch),
                                          "--threads", str(a.threads), "--iters", str(a.iters), "--warmup", "3",
                                          "--json"], check=True, capture_output=True, text=True).stdout)

    engine_before = engine()
    agg = subprocess.Popen([a.vigil, "aggregator", "--config", str(out / "agg.yaml")], stdout=subprocess.PIPE,
                           stderr=open(out / "agg.log", "wb"))
    assert agg.stdout.readline().startswith(b"vigil aggregator:"), "aggregator did not start"
    t0 = time.monotonic()
    edge = subprocess.Popen([a.vigil, "--log-level", "warn", "edge", "--config", str(out / "edge.yaml"),
                             "--metrics-out", str(out / "edge.prom")], stdout=open(out / "edge.log", "wb"),
                            stderr=subprocess.STDOUT)
    _, status, edge_ru = os.wait4(edge.pid, 0)
    edge.returncode = os.waitstatus_to_exitcode(status)
    edge_wall = time.monotonic() - t0
    assert edge.returncode == 0, (out / "edge.log").read_text()[-2000:]
    agg.send_signal(signal.SIGTERM)
    _, _, agg_ru = os.wait4(agg.pid, 0)

    db = sqlite3.connect(out / "agg.db")
    frames, last_stored = db.execute("SELECT COUNT(*), MAX(stored_ns) FROM frames").fetchone()
    first_capture, events = db.execute("SELECT MIN(capture_ns), COUNT(*) FROM events").fetchone()
    lat = [r[0] * 1e-6 for r in db.execute("SELECT stored_ns - capture_ns FROM events")]
    want = a.streams * a.frames
    assert frames == want, f"{frames} frames stored, want {want}"
    fps = (frames - 1) / ((last_stored - first_capture) * 1e-9)

    m = read_metrics(out / "edge.prom")
    stage = {s: m[("vigil_edge_stage_seconds_sum", frozenset({("stage", s)}))] * 1e3 / frames
             for s in ("decode", "preprocess", "postprocess", "rules")}
    stage["inference"] = m[("vigil_edge_engine_busy_seconds_total", frozenset())] * 1e3 / frames
    stage["publish"] = m[("vigil_edge_stage_seconds_sum", frozenset({("stage", "publish")}))] * 1e3 / frames
    cpu = lambda ru: (ru.ru_utime + ru.ru_stime) * 1e3 / frames  # noqa: E731

    engine_after = engine()
    eng = max(engine_before, engine_after, key=lambda e: e["throughput_images_per_s"])
    res = {"model": Path(a.model).name, "batch": a.batch, "streams": a.streams, "frames": frames, "events": events,
           "threads": a.threads, "workers": a.workers, "pipeline_fps": fps, "edge_wall_s": edge_wall,
           "frame_to_stored_ms": {"p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99)},
           "stage_ms_per_frame": stage, "edge_cpu_ms_per_frame": cpu(edge_ru), "agg_cpu_ms_per_frame": cpu(agg_ru),
           "engine_images_per_s": eng["throughput_images_per_s"], "engine_latency_ms": eng["latency_ms"],
           "engine_images_per_s_before_after": [e["throughput_images_per_s"] for e in (engine_before, engine_after)],
           "engine_cpu_ms_per_run": eng["cpu_ms_per_run"], "ratio": fps / eng["throughput_images_per_s"],
           "loadavg": os.getloadavg()}
    (out / "result.json").write_text(json.dumps(res, indent=1))
    before, after = res["engine_images_per_s_before_after"]
    print(f"| {res['model']} | {a.batch} | {a.streams}x{a.frames} | {fps:.2f} | {before:.2f} / {after:.2f} | "
          f"{res['ratio']:.2f} | {res['frame_to_stored_ms']['p50']:.0f} / {res['frame_to_stored_ms']['p99']:.0f} | "
          + " / ".join(f"{stage[s]:.1f}" for s in ("decode", "preprocess", "inference", "postprocess", "publish"))
          + f" | {res['edge_cpu_ms_per_frame']:.0f} / {res['agg_cpu_ms_per_frame']:.1f} |")


if __name__ == "__main__":
    main()
