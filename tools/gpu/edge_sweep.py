#!/usr/bin/env python3
"""The product under load: `vigil aggregator` + `vigil edge` as separate processes, N camera streams each.

For each N of --streams: an aggregator (SQLite in a fresh folder) and an edge with N streams of --clip
(real time, looped, `hwaccel` --hwaccel), the model on --device in --precision, batches of --batch with
--max-wait-ms, --workers Detectors, progress marks flushed every --progress-flush-ms. After the streams
started (the edge logs "epoch E, N streams", and every stream processed a frame) and --warmup-s, both
processes' /metrics are scraped, again
--seconds later; everything below is the difference of the two scrapes, i.e. the steady state:
- frame->detection: the edge's vigil_edge_frame_to_detection_seconds (frame released by its source ->
  detections ready); frame->stored: the aggregator's vigil_aggregator_frame_to_stored_seconds (capture ->
  committed; one observation per report, a progress mark's is its oldest frame's); p50/p99 are read off
  the histogram buckets (linear within a bucket; metrics::LatencyBuckets is fine between 1 and 100 ms);
- frames per second per stream (vigil_edge_frames_total), frames dropped (all reasons) as a share of the
  frames numbered, the edge's CPU time per frame (/proc/PID/stat utime + stime) and the aggregator's.
Then SIGTERM to the edge (and the aggregator). One JSON object on stdout. Test tooling: never part of vigil.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, save: Path | None = None) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    if save is not None:
        save.write_text(text)
    out: dict = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$", line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def total(metrics: dict, name: str, **want) -> float:
    return sum(v for (n, labels), v in metrics.items()
               if n == name and all((k, str(x)) in labels for k, x in want.items()))


def buckets(metrics: dict, name: str) -> dict[float, float]:
    """Cumulative counts by upper bound, summed over every label set (le aside)."""
    out: dict[float, float] = {}
    for (n, labels), v in metrics.items():
        if n != name + "_bucket":
            continue
        le = dict(labels)["le"]
        b = float("inf") if le == "+Inf" else float(le)
        out[b] = out.get(b, 0) + v
    return out


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """q-quantile (ms) of what was observed between two scrapes, linear within its bucket."""
    bounds = sorted(after)
    cum = [after[b] - before.get(b, 0) for b in bounds]
    if not cum or cum[-1] <= 0:
        return None
    rank = q * cum[-1]
    lo_bound, lo_count = 0.0, 0.0
    for b, c in zip(bounds, cum):
        if c >= rank:
            if b == float("inf"):
                return lo_bound * 1e3  # beyond the last bound: at least that
            frac = (rank - lo_count) / (c - lo_count) if c > lo_count else 1.0
            return (lo_bound + frac * (b - lo_bound)) * 1e3
        lo_bound, lo_count = b, c
    return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def run(args, n: int, work: Path) -> dict:
    d = work / f"n{n}"
    subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    agg_port, agg_http, edge_http = free_port(), free_port(), free_port()
    key = secrets.token_hex(32)  # authenticated, as shipped
    (d / "edge.key").write_text(key + "\n")
    (d / "keys.yaml").write_text(f"sweep: {key}\n")
    for f in ("edge.key", "keys.yaml"):
        (d / f).chmod(0o600)
    ipc = f"cuda_ipc: {{socket: {d}/agg.sock, device: {args.device}}}\n" if args.link == "cuda_ipc" else ""
    (d / "agg.yaml").write_text(f"listen: 127.0.0.1:{agg_port}\nhttp: 127.0.0.1:{agg_http}\ndb: {d}/vigil.db\n"
                                f"queue_max: 1000000\nauth: {{keys_file: {d}/keys.yaml}}\n{ipc}")
    links = "cuda_ipc, tcp" if args.link == "cuda_ipc" else "tcp"
    streams = "".join(f"  - {{id: cam{i:03d}, source: {args.clip}, realtime: true, loop: true}}\n" for i in range(n))
    (d / "edge.yaml").write_text(
        f"edge: sweep\naggregator: 127.0.0.1:{agg_port}\n"
        f"model: {{path: {args.model}, device: {args.device}, precision: {args.precision}, workers: {args.workers}}}\n"
        f"batching: {{max_batch: {args.batch}, max_wait_ms: {args.max_wait_ms}}}\n"
        f"progress_flush_ms: {args.progress_flush_ms}\nhttp_port: {edge_http}\nstate_dir: {d}/state\n"
        f"transport: {{max_outbox: 1000000, key_file: {d}/edge.key, links: [{links}], cuda_ipc: {d}/agg.sock}}\n"
        f"hwaccel: {args.hwaccel}\n{args.edge_yaml + chr(10) if args.edge_yaml else ''}streams:\n{streams}")
    agg = subprocess.Popen([args.vigil, "aggregator", "--config", str(d / "agg.yaml")],
                           stdout=open(d / "agg.out", "wb"), stderr=open(d / "agg.log", "wb"))
    time.sleep(1.0)
    edge_log = d / "edge.log"
    edge = subprocess.Popen([args.vigil, "--log-level", "info", "edge", "--config", str(d / "edge.yaml")],
                            stdout=open(edge_log, "wb"), stderr=subprocess.STDOUT)
    result: dict = {"streams": n}
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < args.start_timeout_s:
            if edge.poll() is not None:
                raise RuntimeError(f"edge exited {edge.returncode}: {edge_log.read_text(errors='replace')[-2000:]}")
            if re.search(r"epoch \d+, \d+ streams", edge_log.read_text(errors="replace")):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the edge did not start its streams in time")
        # Every stream decoding (NVDEC decoders are created one after another: seconds for hundreds).
        while time.monotonic() - t0 < args.start_timeout_s:
            m = scrape(edge_http)
            if all(total(m, "vigil_edge_frames_total", stream=f"cam{i:03d}") > 0 for i in range(n)):
                break
            if edge.poll() is not None:
                raise RuntimeError(f"edge exited {edge.returncode}: {edge_log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        else:
            raise RuntimeError("not every stream delivered a frame in time")
        result["startup_s"] = round(time.monotonic() - t0, 1)
        time.sleep(args.warmup_s)
        e0, a0 = scrape(edge_http), scrape(agg_http)
        c0, ca0, w0 = cpu_seconds(edge.pid), cpu_seconds(agg.pid), time.monotonic()
        time.sleep(args.seconds)
        dump = Path(args.dump) / f"n{n}" if args.dump else None
        if dump:
            dump.mkdir(parents=True, exist_ok=True)
            top = subprocess.run(["top", "-H", "-b", "-n", "2", "-d", "1", "-p", str(edge.pid)], capture_output=True,
                                 text=True).stdout
            (dump / "top.txt").write_text(top)
        e1, a1 = scrape(edge_http, dump / "edge.prom" if dump else None), scrape(agg_http)
        c1, ca1, w1 = cpu_seconds(edge.pid), cpu_seconds(agg.pid), time.monotonic()
        secs = w1 - w0
        frames = total(e1, "vigil_edge_frames_total") - total(e0, "vigil_edge_frames_total")
        dropped = total(e1, "vigil_edge_frames_dropped_total") - total(e0, "vigil_edge_frames_dropped_total")
        per_stream = [total(e1, "vigil_edge_frames_total", stream=f"cam{i:03d}") -
                      total(e0, "vigil_edge_frames_total", stream=f"cam{i:03d}") for i in range(n)]
        det0, det1 = (buckets(m, "vigil_edge_frame_to_detection_seconds") for m in (e0, e1))
        st0, st1 = (buckets(m, "vigil_aggregator_frame_to_stored_seconds") for m in (a0, a1))
        decoders: dict[str, int] = {}
        for (name, labels), v in e1.items():
            if name == "vigil_edge_stream_decoder" and v == 1:
                k = dict(labels)["decoder"]
                decoders[k] = decoders.get(k, 0) + 1
        def delta(name, **want):
            return total(e1, name, **want) - total(e0, name, **want)
        stages = {st: round(1e3 * delta("vigil_edge_stage_seconds_sum", stage=st) /
                            max(delta("vigil_edge_stage_seconds_count", stage=st), 1), 3)
                  for st in ("decode", "queue", "preprocess", "inference", "postprocess", "rules")}
        result.update({
            "mean_batch": round(delta("vigil_edge_batch_frames_sum") / max(delta("vigil_edge_batch_frames_count"), 1), 2),
            "stage_mean_ms": stages,
            "engine_busy": round(delta("vigil_edge_engine_busy_seconds_total") / secs, 3),
            "seconds": round(secs, 2),
            "frames_per_s": round(frames / secs, 1),
            "fps_per_stream": {"min": round(min(per_stream) / secs, 2), "mean": round(frames / n / secs, 2)},
            "dropped": int(dropped), "dropped_share": round(dropped / max(frames + dropped, 1), 5),
            "frame_to_detection_ms": {"p50": quantile(det0, det1, 0.5), "p99": quantile(det0, det1, 0.99)},
            "frame_to_stored_ms": {"p50": quantile(st0, st1, 0.5), "p99": quantile(st0, st1, 0.99)},
            "edge_cpu_ms_per_frame": round(1e3 * (c1 - c0) / max(frames, 1), 3),
            "aggregator_cpu_ms_per_frame": round(1e3 * (ca1 - ca0) / max(frames, 1), 3),
            "decoders": decoders,
            "link_messages": {link: delta("vigil_edge_link_messages_total", link=link) for link in ("cuda_ipc", "tcp")},
            # Event pictures (--edge-yaml "snapshots: {...}"): per outcome over the window, all streams together.
            "snapshots_per_s": {r: round(delta("vigil_edge_snapshots_total", result=r) / secs, 1)
                                for r in ("sent", "queue_full", "encode_error", "refused")},
            "events_per_s": round(delta("vigil_edge_events_total") / secs, 1),
        })
        p99d = result["frame_to_detection_ms"]["p99"]
        p99s = result["frame_to_stored_ms"]["p99"]
        result["holds"] = (result["fps_per_stream"]["min"] >= args.min_fps and result["dropped_share"] <= 0.001
                           and p99s is not None and p99s <= args.budget_ms)
        result["p99_ms"] = [p99d, p99s]
    except Exception as e:  # noqa: BLE001 - reported per N, the sweep goes on
        result["error"] = str(e)
        result["holds"] = False
    finally:
        edge.send_signal(signal.SIGTERM)
        try:
            edge.wait(timeout=60)
        except subprocess.TimeoutExpired:
            edge.kill()
        agg.send_signal(signal.SIGTERM)
        try:
            agg.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agg.kill()
        result["edge_log_tail"] = edge_log.read_text(errors="replace").splitlines()[-3:]
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vigil", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--clip", required=True)
    p.add_argument("--streams", default="8,32,64,128,192,256")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--hwaccel", default="cuda")
    p.add_argument("--link", default="tcp", choices=["tcp", "cuda_ipc"],
                   help="the edge's preferred link (cuda_ipc: the aggregator offers a ring on --device)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-wait-ms", type=int, default=2)
    p.add_argument("--progress-flush-ms", type=int, default=10)
    p.add_argument("--warmup-s", type=float, default=5)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--start-timeout-s", type=float, default=180)
    p.add_argument("--budget-ms", type=float, default=50, help="p99 frame->stored a count must hold")
    p.add_argument("--min-fps", type=float, default=29.5)
    p.add_argument("--work", default="/tmp/edge-sweep")
    p.add_argument("--keep-going", action="store_true", help="run every N even after one does not hold")
    p.add_argument("--dump", default="", help="folder: the edge's last scrape and `top -H` per N")
    p.add_argument("--edge-yaml", default="", help="top-level lines added to edge.yaml, e.g. 'snapshots: {max_width: 640}'")
    args = p.parse_args()
    out = {"model": args.model, "clip": args.clip, "device": args.device, "precision": args.precision,
           "hwaccel": args.hwaccel, "workers": args.workers, "batch": args.batch, "max_wait_ms": args.max_wait_ms,
           "progress_flush_ms": args.progress_flush_ms, "warmup_s": args.warmup_s, "trials": []}
    for n in (int(x) for x in args.streams.split(",")):
        r = run(args, n, Path(args.work))
        out["trials"].append(r)
        print(json.dumps({k: r.get(k) for k in ("streams", "fps_per_stream", "dropped_share", "p99_ms", "holds",
                                                 "mean_batch", "stage_mean_ms", "engine_busy", "edge_cpu_ms_per_frame",
                                                 "error")}), file=sys.stderr, flush=True)
        if not r["holds"] and not args.keep_going:
            break
    out["max_streams_holding"] = max([t["streams"] for t in out["trials"] if t["holds"]], default=0)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
