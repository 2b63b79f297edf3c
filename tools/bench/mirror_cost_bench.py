"""What mirroring a camera's pictures to the hot standby costs the primary (issues 16 and 17): `vigil edge` as a
primary with its standby paired, one live camera, run with `replication.mirror_frames: none`, with `live` (the
default: JPEGs over the replication channel) and with `live` + `mirror_via: shm` (raw pictures through the
standby's shared-memory ring, both on this host), side by side.

Method: `vigil aggregator`, the pair (tests/models/test_standby_e2e.py Pair) and a camera on loopback: FFmpeg
serves opencv-doc's vtest.avi, looped, scaled to --size, at 10 fps as H.264 in MPEG-TS over TCP (a real scene:
a JPEG's size and encode time depend on the picture). The int8 YOLOv8n on the CPU, rules {classes: [person]}.
Once the standby has paired, the primary runs --seconds; then the standby is stopped and the primary is sent
SIGTERM, and its metrics file is read: the mirror stage (the JPEG encode, or the copy into the ring, on the reader
thread: vigil_edge_stage_seconds{stage="mirror"}), pictures and bytes sent (vigil_edge_mirror_*), frames processed,
and frame→detection latency (vigil_edge_frame_to_detection_seconds, which includes the encode: the picture is
mirrored before it is queued). The primary's and the standby's CPU time are read from /proc over the same
window.
Usage: VIGIL_BIN=build/src/vigil build/venv/bin/python tools/bench/mirror_cost_bench.py --size 1280x720 --out /tmp/mc
Prints Markdown for docs/benchmarks.md and writes <out>/result.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "models"))

from edge_harness import Aggregator, free_port, read_metrics  # noqa: E402
from test_edge_e2e import VTEST  # noqa: E402
from test_standby_e2e import camera_pair, wait_for  # noqa: E402


class VideoCamera:
    """FFmpeg serving `video` looped, scaled to `size`, at 10 fps as H.264 MPEG-TS on tcp://127.0.0.1:port."""

    def __init__(self, tmp: Path, video: Path, size: str):
        self.port = free_port()
        w, h = size.split("x")
        self.proc = subprocess.Popen(
            ["ffmpeg", "-v", "error", "-re", "-stream_loop", "-1", "-i", str(video), "-vf", f"scale={w}:{h},fps=10",
             "-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-g", "10", "-f", "mpegts",
             f"tcp://127.0.0.1:{self.port}?listen=1"],
            stdout=open(tmp / "camera.log", "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"tcp://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def histogram_mean(m: dict, name: str, **labels) -> float:
    key = frozenset(labels.items())
    total = m.get((name + "_sum", key), 0.0)
    count = m.get((name + "_count", key), 0.0)
    return total / count if count else float("nan")


def histogram_quantile(m: dict, name: str, q: float, **labels) -> float:
    """Upper bound of the bucket holding quantile q (Prometheus buckets: coarse)."""
    buckets = sorted((float(dict(k)["le"]), v) for (n, k), v in m.items()
                     if n == name + "_bucket" and {kk: vv for kk, vv in k if kk != "le"} == labels)
    total = buckets[-1][1] if buckets else 0
    for le, c in buckets:
        if total and c >= q * total:
            return le
    return float("nan")


def run_mode(mode: str, size: str, seconds: float, out: Path) -> dict:
    tmp = out / mode
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    agg = Aggregator(tmp, free_port())
    agg.start()
    camera = VideoCamera(tmp, VTEST, size)
    pair = camera_pair(tmp, agg, camera.url, mirror_frames="none" if mode == "none" else "live",
                       mirror_via="shm" if mode == "shm" else None)
    try:
        pair.start("node-a")
        pair.start("node-b")
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        time.sleep(2)  # past the first frames (connection, first batches)
        pid, standby_pid = pair.procs["node-a"].pid, pair.procs["node-b"].pid
        cpu0, scpu0, t0 = cpu_seconds(pid), cpu_seconds(standby_pid), time.monotonic()
        time.sleep(seconds)
        cpu = cpu_seconds(pid) - cpu0
        scpu = cpu_seconds(standby_pid) - scpu0
        wall = time.monotonic() - t0
        pair.procs["node-b"].send_signal(signal.SIGTERM)
        pair.procs["node-b"].wait(timeout=60)
        pair.procs["node-a"].send_signal(signal.SIGTERM)
        rc = pair.procs["node-a"].wait(timeout=120)
        assert rc == 0, f"node-a exited {rc}:\n{pair.log('node-a')[-3000:]}"
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
    m = read_metrics(tmp / "node-a.prom")
    get = lambda name, **l: m.get((name, frozenset(l.items())), 0.0)
    frames = get("vigil_edge_frames_total", stream="vtest")
    mirrored = get("vigil_edge_mirror_frames_total", stream="vtest")
    return {
        "mode": mode, "size": size, "seconds": round(wall, 1), "frames": frames, "mirrored": mirrored,
        "skipped": get("vigil_edge_mirror_frames_skipped_total", stream="vtest"),
        "kib_per_picture": get("vigil_edge_mirror_bytes_total", stream="vtest") / mirrored / 1024 if mirrored else 0.0,
        "ring_sessions": get("vigil_edge_mirror_ring_sessions_total"),
        "encode_ms": histogram_mean(m, "vigil_edge_stage_seconds", stage="mirror") * 1e3 if mirrored else 0.0,
        "cpu_s_per_s": cpu / wall,
        "standby_cpu_s_per_s": scpu / wall,
        "f2d_mean_ms": histogram_mean(m, "vigil_edge_frame_to_detection_seconds") * 1e3,
        "f2d_p99_le_ms": histogram_quantile(m, "vigil_edge_frame_to_detection_seconds", 0.99) * 1e3,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--out", type=Path, default=Path("/tmp/vigil-mirror-cost"))
    ap.add_argument("--modes", default="none,live,shm", help="none, live (JPEG over the channel), shm (raw, ring)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results = [run_mode(mode, a.size, a.seconds, a.out) for mode in a.modes.split(",")]
    for r in results:
        if r["mode"] == "shm" and r["ring_sessions"] < 1:
            raise SystemExit("mode shm: the standby never mapped a ring (the pictures went as JPEGs)")
    (a.out / "result.json").write_text(json.dumps(results, indent=1))
    print(f"\n| mirroring ({a.size}, 10 fps) | frames | mirrored | KiB per picture | mirror stage ms (mean) | "
          f"primary CPU (cores) | standby CPU (cores) | frame→detection mean ms | p99 ≤ ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['frames']:.0f} | {r['mirrored']:.0f} | {r['kib_per_picture']:.0f} | "
              f"{r['encode_ms']:.2f} | {r['cpu_s_per_s']:.2f} | {r['standby_cpu_s_per_s']:.2f} | "
              f"{r['f2d_mean_ms']:.1f} | {r['f2d_p99_le_ms']:.0f} |")


if __name__ == "__main__":
    main()
