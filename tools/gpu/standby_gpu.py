#!/usr/bin/env python3
"""Hot standby on one GPU (issue 17): `vigil edge` as primary and standby, two processes on the same GPU, N live
cameras decoded by NVDEC, SIGKILLs of the current primary; what is lost, what is stored twice, how long each
takeover takes, what mirroring costs the primary.

Method: a camera server in this process serves --clip-ts (H.264 in MPEG-TS), looped, to every client of each of
N TCP ports, each picture's bytes at the picture's time (a live camera: a client joins at the current picture; cameras serve
two clients, so the standby keeps its connection: warm_sources: all). `vigil aggregator` (SQLite) and the pair
(node-a starts as primary, node-b as standby; model on --device in --precision, `hwaccel: cuda`, mutual TLS with
--certs, heartbeat 100 ms × 3 misses) with `replication.mirror_via` / `mirror_memory` from --mirror:
  shm-gpu  the standby's picture ring in GPU memory (NV12 device to device, CUDA IPC),
  shm      the ring in shared host memory (the primary downloads each picture, copies BGR),
  channel  JPEGs over the replication channel.
After both paired and --warmup-s, the primary's /metrics gives the mirroring cost over --measure-s (its
`mirror` stage per picture, bytes per second, CPU). Then --kills times: SIGKILL the current primary, wait for
the other node's log line "takeover ... complete: first report stored N ms after the primary's last contact",
restart the killed node (it rejoins as the standby), wait until it paired, --interval-s, next. At the end both
stop (SIGTERM) and the aggregator's database is read: per stream, every seq of its run once (the frames table's
primary key) from 0 up with no gap; seqs reported lost (kind 4); events stored twice.
Prints one JSON object. Test tooling: never part of vigil.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out: dict = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$", line)
        if m:
            out[(m.group(1), frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))] = float(m.group(3))
    return out


def total(metrics: dict, name: str, **want) -> float:
    return sum(v for (n, labels), v in metrics.items()
               if n == name and all((k, str(x)) in labels for k, x in want.items()))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def ts_frames(data: bytes) -> list[tuple[int, float]]:
    """(byte offset, decode time in s) of every video PES start in an MPEG-TS clip: a camera sends each picture
    when it is taken, so the server sends the bytes of picture k at its time (DTS, else PTS)."""
    out = []
    for off in range(0, len(data) - 187, 188):
        p = data[off:off + 188]
        if p[0] != 0x47 or not p[1] & 0x40:  # sync byte; payload_unit_start_indicator
            continue
        afc = (p[3] >> 4) & 3
        i = 4 + (1 + p[4] if afc & 2 else 0)
        if not afc & 1 or i + 19 > 188 or p[i:i + 3] != b"\0\0\1" or not 0xE0 <= p[i + 3] <= 0xEF:
            continue
        flags = p[i + 7] >> 6
        if not flags & 2:
            continue
        t = p[i + 14:i + 19] if flags == 3 else p[i + 9:i + 14]  # DTS when present, else PTS
        ticks = ((t[0] >> 1) & 7) << 30 | t[1] << 22 | (t[2] >> 1) << 15 | t[3] << 7 | t[4] >> 1
        out.append((off, ticks / 90000.0))
    return out


class Cameras:
    """N TCP ports, each a live camera: every client joins at the current picture and gets each picture's bytes
    at the picture's time (the clip's DTS), looped — as a camera sends a frame when it is taken (a server pacing
    bytes at the average bit rate would spread a keyframe over hundreds of ms and delay every frame after it)."""

    def __init__(self, clip: Path, n: int):
        self.data = clip.read_bytes()
        frames = ts_frames(self.data)
        if len(frames) < 2:
            raise ValueError(f"{clip}: no video PES with timestamps found (an MPEG-TS clip is needed)")
        t0 = frames[0][1]
        step = (frames[-1][1] - t0) / (len(frames) - 1)
        self.period = frames[-1][1] - t0 + step  # one pass of the clip, s
        # (start offset, end offset, time in the pass) per picture; the bytes before the first PES go with it.
        self.frames = [(0 if k == 0 else off, frames[k + 1][0] if k + 1 < len(frames) else len(self.data), t - t0)
                       for k, (off, t) in enumerate(frames)]
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.ports = []
        self.socks = []
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(8)
            s.settimeout(0.2)
            self.socks.append(s)
            self.ports.append(s.getsockname()[1])
            threading.Thread(target=self.accept, args=(s,), daemon=True).start()

    def accept(self, s: socket.socket):
        while not self.stop.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                continue
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c: socket.socket):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        elapsed = time.monotonic() - self.t0
        lap = int(elapsed // self.period)
        k = next((i for i, f in enumerate(self.frames) if f[2] >= elapsed - lap * self.period), 0)
        try:
            while not self.stop.is_set():
                start, end, at = self.frames[k]
                wait = self.t0 + lap * self.period + at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                c.sendall(self.data[start:end])
                k += 1
                if k == len(self.frames):
                    k, lap = 0, lap + 1
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.stop.set()
        for s in self.socks:
            s.close()


class GpuSampler:
    """nvidia-smi's GPU utilisation every 200 ms until stop() (None where there is no nvidia-smi)."""

    def __init__(self):
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "200", "-i", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)

    def stop(self) -> float | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        v = [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()]
        return round(sum(v) / len(v), 1) if v else None


def node_yaml(args, d: Path, node: str, role: str, listen: int, peer: int, agg_port: int, http: int,
              ports: list[int]) -> Path:
    slots = f"  mirror_slots: {args.slots}\n" if args.slots else ""  # 0: the product's default (2 per stream)
    mirror = {"shm-gpu": f"  mirror_via: shm\n  mirror_memory: {args.device}\n{slots}"
                         f"  mirror_slot_mb: {args.slot_mb}\n",
              "shm": f"  mirror_via: shm\n{slots}  mirror_slot_mb: {args.slot_mb_host}\n",
              "shm-gpu-noresults": f"  mirror_via: shm\n  mirror_memory: {args.device}\n{slots}"
                                   f"  mirror_slot_mb: {args.slot_mb}\n  mirror_results: false\n",
              "channel": "",
              "none": "  mirror_frames: none\n"}[args.mirror]
    streams = "".join(f"  - {{id: cam{i:03d}, source: 'tcp://127.0.0.1:{p}'}}\n" for i, p in enumerate(ports))
    cfg = d / f"{node}.yaml"
    cfg.write_text(
        f"edge: standby-gpu\naggregator: 127.0.0.1:{agg_port}\n"
        f"model: {{path: {args.model}, device: {args.device}, workers: {args.workers}"
        f"{', precision: ' + args.precision if args.device != 'cpu' else ''}}}\n"
        f"batching: {{max_batch: {args.batch}, max_wait_ms: {args.max_wait_ms}}}\n"
        f"progress_flush_ms: 200\nhttp_port: {http}\nstate_dir: {d}/state-{node}\n"
        f"transport: {{max_outbox: 1000000, key_file: {d}/edge.key}}\nhwaccel: {args.hwaccel}\n"
        f"replication:\n  role: {role}\n  listen: 127.0.0.1:{listen}\n  peer: 127.0.0.1:{peer}\n  node: {node}\n"
        f"  heartbeat_ms: {args.heartbeat_ms}\n  detector: {{kind: fixed, misses: 3}}\n  warm_sources: {args.warm_sources}\n"
        f"  mirror_window: {args.window}\n{mirror}"
        f"  tls: {{cert_file: {args.certs}/{node}.pem, key_file: {args.certs}/{node}.key, ca_file: {args.certs}/ca.pem}}\n"
        f"streams:\n{streams}")
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clip-ts", required=True, type=Path)
    ap.add_argument("--certs", required=True, type=Path, help="ca.pem, node-a.{pem,key}, node-b.{pem,key}")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--heartbeat-ms", type=int, default=100, help="replication.heartbeat_ms (3 misses)")
    ap.add_argument("--stops", type=int, default=0, help="SIGSTOPs of the primary after the kills (a false "
                    "suspicion: the standby takes over, the old primary is resumed after --stop-ms, fenced, rejoins)")
    ap.add_argument("--stop-ms", type=int, default=1500)
    ap.add_argument("--soak-s", type=float, default=0.0, help="after the measurement: this long at full load, "
                    "counting takeovers nobody asked for")
    ap.add_argument("--interval-s", type=float, default=3.0)
    ap.add_argument("--budget-s", type=float, default=0.0, help="no new kill or stop once this long has passed since "
                    "the start (the run then ends with what it did: a device call's time limit)")
    ap.add_argument("--standby-early", action="store_true", help="start the standby as soon as the primary was "
                    "admitted, not once every camera's first frame was processed (both start their decoders at once)")
    ap.add_argument("--warm-sources", default="all", choices=["all", "files", "none"],
                    help="the standby's warm_sources: all decodes every camera while it waits (twice the decoding)")
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--measure-s", type=float, default=10.0)
    ap.add_argument("--mirror", choices=["shm-gpu", "shm-gpu-noresults", "shm", "channel", "none"], default="shm-gpu",
                    help="none: mirror_frames none (the replication cost's baseline; a kill then loses frames); "
                         "shm-gpu-noresults: shm-gpu with mirror_results false")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--hwaccel", default="cuda", help="cpu for a dry run on a machine without a GPU")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=int, default=5)
    ap.add_argument("--slots", type=int, default=0, help="replication.mirror_slots; 0: unset, the product's default")
    ap.add_argument("--slot-mb", type=int, default=4)        # NV12 1080p: 3.1 MB
    ap.add_argument("--slot-mb-host", type=int, default=8)   # BGR 1080p: 6.2 MB
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path("/tmp/standby-gpu"))
    ap.add_argument("--start-timeout-s", type=float, default=240)
    ap.add_argument("--keep-logs", type=Path, help="copy the nodes' and the aggregator's logs here (xz)")
    args = ap.parse_args()
    d = args.work / f"{args.mirror}-n{args.streams}"
    subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    key = secrets.token_hex(32)
    (d / "edge.key").write_text(key + "\n")
    (d / "keys.yaml").write_text(f"standby-gpu: {key}\n")
    for f in ("edge.key", "keys.yaml"):
        (d / f).chmod(0o600)
    agg_port, agg_http = free_port(), free_port()
    (d / "agg.yaml").write_text(f"listen: 127.0.0.1:{agg_port}\nhttp: 127.0.0.1:{agg_http}\ndb: {d}/vigil.db\n"
                                f"queue_max: 1000000\nauth: {{keys_file: {d}/keys.yaml}}\n")
    cams = Cameras(args.clip_ts, args.streams)
    chan = {"node-a": free_port(), "node-b": free_port()}
    http = {"node-a": free_port(), "node-b": free_port()}
    cfg = {"node-a": node_yaml(args, d, "node-a", "primary", chan["node-a"], chan["node-b"], agg_port, http["node-a"],
                               cams.ports),
           "node-b": node_yaml(args, d, "node-b", "standby", chan["node-b"], chan["node-a"], agg_port, http["node-b"],
                               cams.ports)}
    procs: dict[str, subprocess.Popen] = {}
    logs = {n: d / f"{n}.log" for n in cfg}

    def start(node: str):
        procs[node] = subprocess.Popen([args.vigil, "--log-level", "info", "edge", "--config", str(cfg[node]),
                                        "--shutdown-timeout-ms", "60000"],
                                       stdout=open(logs[node], "ab"), stderr=subprocess.STDOUT)

    def log(node: str) -> str:
        return logs[node].read_text(errors="replace") if logs[node].exists() else ""

    def paired(node: str) -> int:
        return log(node).count("of edge 'standby-gpu' paired with primary")

    def takeovers_of(node: str) -> list[int]:
        return [int(m) for m in re.findall(r"first report stored (\d+) ms after the primary's last contact", log(node))]

    def takeovers() -> list[int]:
        return [t for n in cfg for t in takeovers_of(n)]

    def timelines_of(node: str) -> list[dict]:
        return [{k: (None if v == "-" else float(v)) for k, v in (p.rsplit(" ", 1) for p in ln.split(", "))}
                for ln in re.findall(r"takeover timeline, ms after the old primary's last contact: (.*)", log(node))]

    def wait(pred, timeout: float, what: str):
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if pred():
                return
            for n, p in procs.items():
                if p.poll() is not None and p.returncode not in (-9,):
                    raise RuntimeError(f"{n} exited {p.returncode}: {log(n)[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}")

    agg = subprocess.Popen([args.vigil, "aggregator", "--config", str(d / "agg.yaml")],
                           stdout=open(d / "agg.out", "wb"), stderr=open(d / "agg.log", "wb"))
    result: dict = {"streams": args.streams, "mirror": args.mirror, "kills_asked": args.kills,
                    "clip": {"pictures": len(cams.frames), "period_s": round(cams.period, 2)},
                    "heartbeat_ms": args.heartbeat_ms}
    t_start = time.monotonic()
    events: list[tuple[float, str]] = []  # (s since start, what the run did or saw)
    samples: list[tuple[float, str, float]] = []  # (s, node, frames processed so far) of whichever node is primary
    sampling = threading.Event()

    def sample():
        """Every 0.25 s the primary's processed frames: a dip in its rate names a stall (and when it was)."""
        while not sampling.is_set():
            for n in cfg:
                p = procs.get(n)
                if p is None or p.poll() is not None:
                    continue
                try:
                    m = urllib.request.urlopen(f"http://127.0.0.1:{http[n]}/metrics", timeout=0.5).read().decode()
                except OSError:
                    continue
                if re.search(r'^vigil_edge_replication_role\{role="primary"\} 1', m, re.M):
                    done = sum(float(x) for x in re.findall(r"^vigil_edge_frames_total\{[^}]*\} (\S+)", m, re.M))
                    samples.append((time.monotonic() - t_start, n, done))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        time.sleep(1.0)
        start("node-a")
        wait(lambda: re.search(r"epoch \d+, \d+ streams", log("node-a")), args.start_timeout_s, "node-a's streams")
        def every_camera_seen() -> bool:
            try:
                m = scrape(http["node-a"])
            except OSError:
                return False
            return all(total(m, "vigil_edge_frames_total", stream=f"cam{i:03d}") > 0 for i in range(args.streams))
        if not args.standby_early:  # the standby joins a primary whose cameras all flow
            wait(every_camera_seen, args.start_timeout_s, "every camera's first frame")
        start("node-b")
        wait(lambda: paired("node-b") >= 1, args.start_timeout_s, "node-b to pair")
        wait(every_camera_seen, args.start_timeout_s, "every camera's first frame")
        if takeovers() or "takes over edge" in log("node-b"):
            raise RuntimeError("node-b took over before any kill (a false takeover under load: heartbeat_ms "
                               f"{args.heartbeat_ms} x 3 misses)")
        result["startup_s"] = round(time.monotonic() - t_start, 1)
        sampler.start()
        ring = "gets the primary's pictures raw through its ring" in log("node-b")
        result["ring_mapped"] = ring
        time.sleep(args.warmup_s)
        gpu = GpuSampler()  # the GPU's utilisation while measuring (both processes and the decoders)
        m0, c0, s0, w0 = scrape(http["node-a"]), cpu_seconds(procs["node-a"].pid), cpu_seconds(procs["node-b"].pid), time.monotonic()
        time.sleep(args.measure_s)
        m1, c1, s1, w1 = scrape(http["node-a"]), cpu_seconds(procs["node-a"].pid), cpu_seconds(procs["node-b"].pid), time.monotonic()
        gpu_util = gpu.stop()
        secs = w1 - w0
        delta = lambda name, **l: total(m1, name, **l) - total(m0, name, **l)  # noqa: E731
        frames = delta("vigil_edge_frames_total")
        mirrored = delta("vigil_edge_mirror_frames_total")
        result["steady"] = {
            "seconds": round(secs, 1),
            "frames_per_s": round(frames / secs, 1),
            "fps_per_stream_min": round(min(delta("vigil_edge_frames_total", stream=f"cam{i:03d}")
                                            for i in range(args.streams)) / secs, 2),
            "mirrored_per_s": round(mirrored / secs, 1),
            "mirror_skipped": delta("vigil_edge_mirror_frames_skipped_total"),
            "mirror_mb_per_s_per_stream": round(delta("vigil_edge_mirror_bytes_total") / secs / 1e6 / args.streams, 2),
            "mirror_stage_ms_mean": round(1e3 * delta("vigil_edge_stage_seconds_sum", stage="mirror") /
                                          max(delta("vigil_edge_stage_seconds_count", stage="mirror"), 1), 4),
            "primary_cpu_cores": round((c1 - c0) / secs, 2),
            "standby_cpu_cores": round((s1 - s0) / secs, 2),
            "primary_cpu_ms_per_frame": round(1e3 * (c1 - c0) / max(frames, 1), 3),
            "results_mirrored_per_s": round(delta("vigil_edge_mirror_results_total") / secs, 1),
            "gpu_util_pct_mean": gpu_util,
        }
        if args.soak_s > 0:
            # Full load, nothing done to either node: any takeover now is a false one.
            time.sleep(args.soak_s)
            result["soak"] = {"seconds": args.soak_s,
                              "false_takeovers": sum(log(n).count("takes over edge") for n in cfg),
                              "heartbeat_ms": args.heartbeat_ms}
        primary, standby = "node-a", "node-b"
        kills, stops = [], []

        def fault(kind: str, k: int) -> dict:
            """SIGKILL or SIGSTOP the current primary; the standby's takeover: its time and its timeline."""
            nonlocal primary, standby
            seen, steps_seen = len(takeovers_of(standby)), len(timelines_of(standby))
            paired_before = paired(primary)
            t0 = time.monotonic()
            events.append((round(t0 - t_start, 2), f"{kind} {primary}"))
            if kind == "kill":
                procs[primary].kill()
                procs[primary].wait(timeout=30)
            else:
                procs[primary].send_signal(signal.SIGSTOP)
            wait(lambda: len(takeovers_of(standby)) > seen and len(timelines_of(standby)) > steps_seen, 60,
                 f"takeover after {kind} {k}")
            took = takeovers_of(standby)[seen]
            events.append((round(time.monotonic() - t_start, 2), f"{standby} took over ({took} ms)"))
            steps = timelines_of(standby)[steps_seen:steps_seen + 1]
            if kind == "kill":
                start(primary)  # rejoins as the standby of the new primary
            else:
                time.sleep(max(0.0, t0 + args.stop_ms / 1000 - time.monotonic()))
                procs[primary].send_signal(signal.SIGCONT)  # fenced at its next report: rejoins as the standby
            events.append((round(time.monotonic() - t_start, 2), f"{primary} {'restarted' if kind == 'kill' else 'resumed'}"))
            wait(lambda: paired(primary) > paired_before, args.start_timeout_s, f"{primary} to rejoin as standby")
            events.append((round(time.monotonic() - t_start, 2), f"{primary} paired as standby"))
            primary, standby = standby, primary
            time.sleep(args.interval_s)
            return {"n": k, "takeover_ms": took, "timeline": steps[0] if steps else None}

        def time_left() -> bool:
            if args.budget_s > 0 and time.monotonic() - t_start > args.budget_s:
                result["budget_ended"] = True
                return False
            return True

        for k in range(args.kills):
            if not time_left():
                break
            kills.append(fault("kill", k + 1))
        for k in range(args.stops):
            if not time_left():
                break
            stops.append(fault("stop", k + 1))

        def summary(events: list[dict]) -> dict:
            times = sorted(e["takeover_ms"] for e in events)
            out = {"takeover_ms": times}
            if times:
                out["p50"] = times[len(times) // 2]
                out["p99"] = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))]
                out["max"] = times[-1]
            # Each takeover step by step (the new primary's "takeover timeline" line): where the time goes.
            steps = [e["timeline"] for e in events if e["timeline"]]
            phases = {}
            for key in (steps[0] if steps else {}):
                v = sorted(x[key] for x in steps if x.get(key) is not None)
                if v:
                    phases[key] = {"p50": v[len(v) // 2], "max": v[-1]}
            out["phase_ms"] = phases
            out["timelines"] = steps
            return out

        result["kill"] = summary(kills)
        if stops:
            result["stop"] = summary(stops)
        # The headline numbers: the SIGKILL takeovers.
        for key in ("p50", "p99", "max"):
            if key in result["kill"]:
                result[f"takeover_ms_{key}"] = result["kill"][key]
        result["kills"] = len(kills)
        result["stops"] = len(stops)
        result["replayed"] = sum(int(x) for n in cfg for x in
                                 re.findall(r"processing (\d+) mirrored picture\(s\) of the old primary again", log(n)))
        result["republished"] = sum(int(x) for n in cfg for x in
                                    re.findall(r"re-published the old primary's own results for (\d+) frame", log(n)))
        # The first batch after each takeover, as the new primary logged it (the "detected" step's parts).
        result["first_batches"] = [ln for n in cfg for ln in re.findall(r"takeover: first batch on (.*)", log(n))]
    except Exception as e:  # noqa: BLE001 - reported, the databases still read
        result["error"] = str(e)
    finally:
        sampling.set()
        # Stalls: 1 s windows in which the primary processed under half of what its cameras deliver.
        want = args.streams * len(cams.frames) / cams.period
        dips = []
        for k in range(len(samples)):
            t, n, done = samples[k]
            j = k
            while j + 1 < len(samples) and samples[j + 1][1] == n and samples[j + 1][0] - t < 1.0:
                j += 1
            if j > k and samples[j][0] - t >= 0.7:
                rate = (samples[j][2] - done) / (samples[j][0] - t)
                if rate < want / 2 and (not dips or t - dips[-1]["t"] >= 1.0):
                    dips.append({"t": round(t, 2), "node": n, "fps": round(rate)})
        result["primary_dips"] = dips
        result["events"] = events
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                p.kill()
        agg.send_signal(signal.SIGTERM)
        try:
            agg.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agg.kill()
        cams.close()
    db = sqlite3.connect(d / "vigil.db")
    per = db.execute("SELECT s.stream, f.run, COUNT(*), MIN(f.seq), MAX(f.seq), "
                     "SUM(CASE WHEN f.kind = 4 THEN 1 ELSE 0 END) FROM frames f JOIN streams s ON s.id = f.stream_id "
                     "GROUP BY s.stream, f.run").fetchall()
    dup_events = db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM events GROUP BY stream_id, run, seq "
                            "HAVING COUNT(*) > 1)").fetchone()[0]
    gaps = [(s, run, n, lo, hi) for s, run, n, lo, hi, _ in per if (lo, hi) != (0, n - 1)]
    result["db"] = {
        "streams": len({r[0] for r in per}), "runs": len(per), "frames": sum(r[2] for r in per),
        "lost": sum(r[5] for r in per), "gaps": gaps[:10], "events_stored_twice": dup_events,
    }
    result["ok"] = ("error" not in result and (result["db"]["lost"] == 0 or args.mirror == "none") and not gaps
                    and dup_events == 0
                    and result["db"]["runs"] == args.streams and result.get("kills") == args.kills
                    and result.get("stops") == args.stops and result.get("soak", {}).get("false_takeovers", 0) == 0
                    and (args.mirror in ("channel", "none") or result.get("ring_mapped", False)))
    for n in cfg:
        result[f"{n}_log_tail"] = log(n).splitlines()[-4:]
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
        for f in (*logs.values(), d / "agg.log"):
            if f.exists():
                (args.keep_logs / f"{args.mirror}-n{args.streams}-{f.name}.xz").write_bytes(lzma.compress(f.read_bytes()))
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
