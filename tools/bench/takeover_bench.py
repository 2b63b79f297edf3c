"""Takeover benchmark (issue 16): how long an edge id is without a publishing process after its primary is
SIGKILLed, with a hot standby (`replication:`) and, side by side, without one (a supervisor restarting the same
edge at once on its state_dir: what a user has today).

Method: `vigil aggregator` and the edge process(es) on loopback, the int8 YOLOv8n on the CPU, one stream: all of
opencv-doc's vtest.avi (795 frames, 10 FPS) in real time, rules {classes: [person]} (an event, sent at once,
for nearly every frame). --kills times, at a moment drawn uniformly from 0.2..1.2 s after the standby paired
(standby modes) or after the edge was admitted again (restart mode), the publishing process is SIGKILLed and:
- standby: the other node takes over; the killed one is restarted at once and becomes the standby (the standby
  reads the file up to the mirrored cursor while it waits: warm_sources files, the default);
- standby-cold: the same with warm_sources none (the standby opens the file at the takeover and decodes it
  from the start to the cursor);
- restart: the same edge is started again at once (same config and state_dir).
Takeover time = the first frame stored by the new epoch (frames.stored_ns at the aggregator, system clock)
minus the kill (time.time_ns() just before SIGKILL). The aggregator's database must then hold every frame once
(one run). The seed is printed; --seed replays the schedule.
Usage: VIGIL_BIN=build/src/vigil build/venv/bin/python tools/bench/takeover_bench.py --kills 10 --out /tmp/tk
Prints Markdown for docs/benchmarks.md and writes <out>/result.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "models"))

from edge_harness import Aggregator, free_port, query as q  # noqa: E402
from test_standby_e2e import Pair, start, wait_for, write_config  # noqa: E402
from test_edge_e2e import VTEST, assert_accounted_once  # noqa: E402


def max_epoch(db: Path) -> int:
    try:
        return q(db, "SELECT COALESCE(MAX(epoch), 0) FROM frames")[0][0]
    except sqlite3.Error:
        return 0


def first_stored_after(db: Path, epoch: int) -> int | None:
    """The first frame stored by an epoch newer than `epoch` (the new primary's)."""
    r = q(db, "SELECT MIN(stored_ns) FROM frames WHERE epoch > ?", epoch)
    return r[0][0] if r and r[0][0] is not None else None


def lone_config(tmp: Path, port: int) -> Path:
    return write_config(tmp, "lone", port, VTEST, "", "{classes: [person]}")  # no replication section


def run_mode(mode: str, kills: int, rng: random.Random, out: Path, frames: int, restart_after_ms: int = 0) -> dict:
    tmp = out / mode
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    agg = Aggregator(tmp, port)
    agg.start()
    times: list[float] = []
    try:
        if mode.startswith("standby"):
            pair = Pair(tmp, VTEST, agg)
            if mode == "standby-cold":  # the standby opens its file at the takeover and decodes up to the cursor
                for c in pair.cfg.values():
                    c.write_text(c.read_text().replace("  role: ", "  warm_sources: none\n  role: ", 1))
            pair.start("node-a")
            pair.start("node-b")
            primary, paired = "node-a", {"node-a": 0, "node-b": 0}
            procs = pair.procs
        else:
            cfg = lone_config(tmp, port)
            procs = {"lone": start(cfg, tmp, "lone")}
            primary = "lone"
        for k in range(kills):
            epoch = max_epoch(agg.db)
            if mode.startswith("standby"):
                standby = "node-b" if primary == "node-a" else "node-a"
                wait_for(lambda: pair.paired(standby) > paired[standby], 120, f"{standby} to pair")
                paired[standby] = pair.paired(standby)
            wait_for(lambda: max_epoch(agg.db) >= max(epoch, 1), 120, "frames stored by the current epoch")
            epoch = max_epoch(agg.db)
            time.sleep(rng.uniform(0.2, 1.2))
            if procs[primary].poll() is not None:
                raise RuntimeError(f"{primary} ended before kill {k + 1}: the clip is too short for {kills} kills")
            killed_ns = time.time_ns()
            procs[primary].send_signal(signal.SIGKILL)
            procs[primary].wait(timeout=30)
            if mode.startswith("standby"):
                if restart_after_ms > 0:  # the killed node's model load and warm-up off the takeover's cores
                    wait_for(lambda: first_stored_after(agg.db, epoch) is not None, 120, "the new epoch's first frame")
                    time.sleep(restart_after_ms / 1000)
                pair.start(primary)
                primary = standby
            else:
                procs["lone"] = start(cfg, tmp, "lone")
            wait_for(lambda: first_stored_after(agg.db, epoch) is not None, 120, "the new epoch's first frame")
            times.append((first_stored_after(agg.db, epoch) - killed_ns) / 1e6)
            print(f"{mode} kill {k + 1}: {times[-1]:.0f} ms", flush=True)
        for p in procs.values():
            if p.poll() is None:
                p.wait(timeout=600)
        assert_accounted_once(agg.db, "vtest", frames)
    finally:
        for p in (pair.procs.values() if mode.startswith("standby") else procs.values()):
            if p.poll() is None:
                p.kill()
        agg.kill(signal.SIGTERM)
    s = sorted(times)
    pct = lambda x: s[min(len(s) - 1, int(x * len(s)))]
    return {"mode": mode, "kills": len(times), "ms": times, "p50": pct(0.5), "p99": pct(0.99), "max": s[-1],
            "mean": sum(s) / len(s)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--modes", default="standby,standby-cold,restart")
    ap.add_argument("--out", type=Path, default=Path("/tmp/vigil-takeover"))
    ap.add_argument("--restart-after-ms", type=int, default=0,
                    help="standby modes: restart the killed node only this long after the new primary's first "
                         "stored frame (default 0: at once, competing for the cores with the takeover)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    frames = 795
    results = [run_mode(m, a.kills, random.Random(seed), a.out, frames, a.restart_after_ms) for m in a.modes.split(",")]
    (a.out / "result.json").write_text(json.dumps({"seed": seed, "results": results}, indent=1))
    print("\n| edge without a publisher after SIGKILL | kills | p50 ms | p99 ms | max ms | mean ms |")
    print("|---|---|---|---|---|---|")
    for r in results:
        what = {"standby": "hot standby takes over (warm_sources: files, the default)",
                "standby-cold": "hot standby, warm_sources: none (opens the file at the takeover)",
                "restart": "same edge restarted at once (no standby)"}[r["mode"]]
        print(f"| {what} | {r['kills']} | {r['p50']:.0f} | {r['p99']:.0f} | {r['max']:.0f} | {r['mean']:.0f} |")


if __name__ == "__main__":
    main()
