"""No-false-takeover soak (issue 16): a primary and its hot standby run for --duration seconds with both busy
on this machine, and nothing must make the standby take over — no missed heartbeats, no suspicion, no
step-down, no fencing.

Method: `vigil aggregator` and two `vigil edge` nodes of one edge id on loopback (the chaos suite's pair:
mutual TLS, certificates made with the openssl CLI), the int8 YOLOv8n on the CPU, one stream: opencv-doc's
vtest.avi looped in real time (10 FPS), rules {classes: [person]}; the replication settings as shipped
(heartbeat_ms 500, detector fixed 3 misses, step_down stall 3000 ms) unless --heartbeat-ms / --misses say
otherwise. --burn N processes spin on the CPU meanwhile (the machine busy beyond the edge's own inference).
Counted from the nodes' logs and metrics: takeovers, suspicions, step-downs, rejoins, fencings, stall warnings;
from the aggregator: frames stored (the primary kept publishing).
Usage: VIGIL_BIN=build/src/vigil build/venv/bin/python tools/bench/soak_no_false_takeover.py --duration 600
Prints a Markdown line for docs/benchmarks.md and writes <out>/result.json; exits 1 on any false takeover.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "models"))

from edge_harness import Aggregator, free_port, stored_frames  # noqa: E402
from test_standby_e2e import Pair, wait_for  # noqa: E402
from test_edge_e2e import VTEST  # noqa: E402


def burn():
    while True:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--heartbeat-ms", type=int, default=500)
    ap.add_argument("--misses", type=int, default=3)
    ap.add_argument("--burn", type=int, default=1, help="CPU-spinning processes beside the pair")
    ap.add_argument("--out", type=Path, default=Path("/tmp/vigil-soak"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    agg = Aggregator(a.out, port)
    agg.start()
    pair = Pair(a.out, VTEST, agg)
    for node in ("node-a", "node-b"):
        cfg = pair.cfg[node]
        cfg.write_text(cfg.read_text()
                       .replace("  heartbeat_ms: 100\n",
                                f"  heartbeat_ms: {a.heartbeat_ms}\n  detector: {{kind: fixed, misses: {a.misses}}}\n")
                       .replace("    realtime: true\n", "    realtime: true\n    loop: true\n"))
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(a.burn)]
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 180, "node-b to pair")
        for b in burners:
            b.start()
        start_frames = stored_frames(agg.db, "vtest")
        t0 = time.monotonic()
        while time.monotonic() - t0 < a.duration:
            time.sleep(5)
            for node, p in pair.procs.items():
                if p.poll() is not None:
                    raise SystemExit(f"{node} exited {p.returncode} during the soak:\n{pair.log(node)[-3000:]}")
        stored = stored_frames(agg.db, "vtest") - start_frames
        elapsed = time.monotonic() - t0
    finally:
        for b in burners:
            b.kill()
        for p in pair.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in pair.procs.values():
            try:
                p.wait(timeout=60)
            except Exception:
                p.kill()
        agg.kill(signal.SIGTERM)
    log_a, log_b = pair.log("node-a"), pair.log("node-b")
    counts = {
        "takeovers": log_a.count("takes over edge") + log_b.count("takes over edge"),
        "suspicions": log_a.count("no heartbeat answer") + log_b.count("no heartbeat answer"),
        "step_downs": log_a.count(" steps down: ") + log_b.count(" steps down: "),
        "fenced": log_a.count("was fenced") + log_b.count("was fenced"),
        "stall_warnings": log_a.count("no frame processed") + log_b.count("no frame processed"),
        "unhealthy": log_a.count("unhealthy:") + log_b.count("unhealthy:"),
    }
    # The SIGTERM at the end is a switchover: the standby takes over then, on purpose. Count only before it.
    switchover = "the primary was stopped (a switchover)" in log_b
    counts["takeovers"] -= int(switchover)
    result = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
        "duration_s": round(elapsed, 1), "heartbeat_ms": a.heartbeat_ms, "misses": a.misses, "burners": a.burn,
        "frames_stored_during": stored, "fps": round(stored / elapsed, 2), **counts,
    }
    (a.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    false = counts["takeovers"] + counts["suspicions"] + counts["step_downs"] + counts["fenced"]
    print(f"| {result['date']} | {a.duration:.0f} s | heartbeat {a.heartbeat_ms} ms × {a.misses} | {a.burn} burner(s) "
          f"| {stored} frames ({result['fps']} FPS) | takeovers {counts['takeovers']}, suspicions "
          f"{counts['suspicions']}, step-downs {counts['step_downs']}, fencings {counts['fenced']} |")
    sys.exit(1 if false else 0)


if __name__ == "__main__":
    main()
