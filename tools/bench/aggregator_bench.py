#!/usr/bin/env python3
"""What `vigil aggregator` as shipped stores and pushes (issue 18): reports/s stored, commit latency, the
aggregator's CPU per report, events pushed to MQTT per second — SQLite against PostgreSQL, side by side.

For each engine it starts `vigil aggregator` (its own agg.yaml: the engine's database, an MQTT push sink for
the events with a person on a mosquitto broker this script starts, edge keys for the load's edges), then runs
`vigil bench aggregator` against it (simulated edges speaking the product's protocol, one Report per frame;
the Ack of a Report comes after its commit), and reads:
  - stored/s and the ack latency p50/p99 (ms) from `vigil bench aggregator`;
  - commit p50/p99 (ms) from the aggregator's vigil_aggregator_commit_seconds histogram (the run's delta,
    bucket upper bounds: a p99 of "≤ 25 ms" means the bucket 10..25 ms);
  - the aggregator process's CPU (utime + stime from /proc) per acknowledged report, µs;
  - pushed/s: vigil_aggregator_push_total{result="delivered"} over the run, and how long the outbox took to
    drain after the load stopped.
PostgreSQL: --pg-url (a database this script may create schemas in; scripts/postgres.sh start DIR prints one);
the server runs on the same machine, so its CPU is part of the cost.
Confirmation (issue 20): --confirm off,on runs each case without and with a `confirm:` section (--confirm-yaml: its
body), and reads the tracking time per report from vigil_aggregator_confirm_seconds and the events' states from
vigil_aggregator_event_states_total; --event-every 1 --motion-px 4 makes every frame an event of moving boxes.
Where the trackers' association runs (confirm.association.device): --association cpu,cuda:0 runs each confirmed
case on each; --detections 3,30,300 sweeps the boxes per event (--layout grid tiles them over the frame), and the
frames the device associated are read from vigil_aggregator_association_frames_total.

  tools/bench/aggregator_bench.py --vigil build/src/vigil --pg-url postgresql://vigil@127.0.0.1:54329/vigil_test \
      --engines sqlite,postgresql --rates 0,4000 --seconds 10 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

KEY_HEX = "5a" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, list[tuple[dict, float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out


def value(metrics: dict, name: str, **labels) -> float:
    return sum(v for l, v in metrics.get(name, []) if all(l.get(k) == x for k, x in labels.items()))


def histogram_quantile(before: dict, after: dict, name: str, q: float) -> float:
    """The q-quantile's bucket upper bound (s) of the histogram's growth between two scrapes."""
    def buckets(m):
        return {float(l["le"]) if l["le"] != "+Inf" else float("inf"): v for l, v in m.get(name + "_bucket", [])}
    b0, b1 = buckets(before), buckets(after)
    total = b1.get(float("inf"), 0) - b0.get(float("inf"), 0)
    if total <= 0:
        return 0.0
    for le in sorted(b1):
        if b1[le] - b0.get(le, 0) >= q * total:
            return le
    return float("inf")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def psql(url: str, sql: str):
    subprocess.run(["psql", url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True, capture_output=True)


class Broker:
    def __init__(self, folder: Path):
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def run_case(a, engine: str, rate: float, work: Path, broker: Broker | None, confirm: bool = False,
             detections: int = 3, association: str = "") -> dict:
    case = work / f"{engine}-{int(rate)}{'-confirm' if confirm else ''}-{detections}-{association.replace(':', '')}"
    case.mkdir(parents=True)
    edge_ids = [f"bench-{i}" for i in range(a.edges)]
    keys = case / "keys.yaml"
    keys.write_text("".join(f"{e}: {KEY_HEX}\n" for e in edge_ids))
    keys.chmod(0o600)
    schema = None
    if engine == "sqlite":
        db = str(case / "agg.db")
    else:
        schema = f"bench_{os.getpid()}_{int(rate)}{'_c' if confirm else ''}_{detections}"
        psql(a.pg_url, f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
        db = f"'{a.pg_url}{'&' if '?' in a.pg_url else '?'}options=-csearch_path%3D{schema}'"
    port, http = free_port(), free_port()
    push = ""
    if broker:
        push = (f"push:\n  - name: plant\n    mqtt: {{broker: 127.0.0.1:{broker.port}, topic_prefix: plant}}\n"
                f"    route: {{classes: [person]}}\n")
    confirm_yaml = ""
    if confirm:
        confirm_yaml = "confirm:\n" + "".join(f"  {line}\n" for line in a.confirm_yaml.split("\n") if line)
        if association:
            confirm_yaml += f"  association: {{device: '{association}'}}\n"
    (case / "agg.yaml").write_text(f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\ndb: {db}\n"
                                   f"auth: {{keys_file: {keys}}}\nbatch_max: {a.batch_max}\n{push}{confirm_yaml}")
    log = open(case / "agg.log", "wb")
    agg = subprocess.Popen([a.vigil, "aggregator", "--config", str(case / "agg.yaml")], stdout=subprocess.PIPE,
                           stderr=log)
    line = agg.stdout.readline().decode()
    if not line.startswith("vigil aggregator:"):
        raise RuntimeError(f"aggregator did not start: {line!r}; see {case / 'agg.log'}")
    try:
        m0 = scrape(http)
        cpu0 = proc_cpu_s(agg.pid)
        out = case / "bench.json"
        cmd = [a.vigil, "bench", "aggregator", "--target", f"127.0.0.1:{port}", "--edges", str(a.edges),
               "--streams", str(a.streams), "--seconds", str(a.seconds), "--rate", str(rate), "--window",
               str(a.window), "--event-every", str(a.event_every), "--detections", str(detections),
               "--motion-px", str(a.motion_px), "--layout", a.layout,
               "--key-hex", KEY_HEX, "--json", str(out)]
        load_start = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.seconds + 120)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            raise RuntimeError(f"vigil bench aggregator failed: {r.stderr}")
        load_end = time.monotonic()
        cpu1 = proc_cpu_s(agg.pid)
        m1 = scrape(http)
        bench = json.loads(out.read_text())
        drain_s = 0.0
        if broker:
            while value(scrape(http), "vigil_aggregator_push_outbox_depth", sink="plant") > 0:
                if time.monotonic() - load_end > 120:
                    break
                time.sleep(0.05)
            drain_s = time.monotonic() - load_end
        m2 = scrape(http)
        # The bench's whole run: its warm-up second, its timed part and the wait for every ack (longer than the
        # offered seconds where the aggregator falls behind), the time the CPU seconds above were spent in.
        elapsed = load_end - load_start
        pushed = value(m2, "vigil_aggregator_push_total", sink="plant", result="delivered") - \
            value(m0, "vigil_aggregator_push_total", sink="plant", result="delivered")
        def delta(name, **labels):
            return value(m1, name, **labels) - value(m0, name, **labels)
        states = {f"{at}_{st}": delta("vigil_aggregator_event_states_total", state=st, at=at)
                  for at, st in (("stored", "pending"), ("stored", "confirmed"), ("stored", "rejected"),
                                 ("decided", "confirmed"), ("decided", "rejected"))}
        associated = {l.get("at", ""): v - value(m0, "vigil_aggregator_association_frames_total", at=l.get("at", ""))
                      for l, v in m1.get("vigil_aggregator_association_frames_total", [])}
        return {
            "engine": engine, "confirm": confirm, "offered_per_s": rate, "detections": detections,
            "association": association or "default", "association_frames": associated,
            "association_failures": delta("vigil_aggregator_association_failures_total"),
            "confirm_us_per_report": 1e6 * delta("vigil_aggregator_confirm_seconds_sum") / max(1, bench["acked"]),
            "confirm_batch_ms_p99_le": 1e3 * histogram_quantile(m0, m1, "vigil_aggregator_confirm_seconds", 0.99),
            "event_states": states, "events_pending_at_end": value(m1, "vigil_aggregator_events_pending"), "edges": a.edges, "streams": a.edges * a.streams,
            "stored_per_s": bench["stored_per_s"], "acked": bench["acked"],
            "ack_ms_p50": bench["ack_ms_p50"], "ack_ms_p99": bench["ack_ms_p99"],
            "commit_ms_p50_le": 1e3 * histogram_quantile(m0, m1, "vigil_aggregator_commit_seconds", 0.5),
            "commit_ms_p99_le": 1e3 * histogram_quantile(m0, m1, "vigil_aggregator_commit_seconds", 0.99),
            "commits": value(m1, "vigil_aggregator_commit_seconds_count") - value(m0, "vigil_aggregator_commit_seconds_count"),
            "aggregator_cpu_us_per_report": 1e6 * (cpu1 - cpu0) / max(1, bench["acked"]),
            "aggregator_cpu_cores": (cpu1 - cpu0) / elapsed,
            "pushed": pushed, "pushed_per_s": pushed / (elapsed + drain_s) if broker else 0.0,
            "push_drain_s_after_load": drain_s,
        }
    finally:
        agg.terminate()
        agg.wait(timeout=30)
        if schema:
            psql(a.pg_url, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vigil", default="build/src/vigil")
    p.add_argument("--engines", default="sqlite,postgresql")
    p.add_argument("--pg-url", default=os.environ.get("VIGIL_TEST_POSTGRES", ""))
    p.add_argument("--rates", default="0", help="offered reports/s of all edges together, comma-separated; 0: max")
    p.add_argument("--edges", type=int, default=4)
    p.add_argument("--streams", type=int, default=32, help="per edge")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--event-every", type=int, default=4)
    p.add_argument("--detections", default="3", help="rows per event, comma-separated: one case each")
    p.add_argument("--layout", default="row", help="row or grid (vigil bench aggregator --layout)")
    p.add_argument("--association", default="",
                   help="confirm.association.device per confirmed case, comma-separated (cpu,cuda:0); default: none set")
    p.add_argument("--motion-px", type=float, default=0)
    p.add_argument("--confirm", default="off", help="off, on or off,on (each case both ways)")
    p.add_argument("--confirm-yaml", default="rules: {k: 3, m: 5}",
                   help="the confirm: section's body (YAML, one key per line)")
    p.add_argument("--batch-max", type=int, default=512)
    p.add_argument("--no-mqtt", action="store_true")
    p.add_argument("--json")
    p.add_argument("--work", help="keep each case's agg.yaml, logs and database here (default: a temporary folder)")
    a = p.parse_args()
    engines = a.engines.split(",")
    if "postgresql" in engines and not a.pg_url:
        p.error("postgresql needs --pg-url (or VIGIL_TEST_POSTGRES)")
    broker = None
    rows, failed = [], []
    with tempfile.TemporaryDirectory(prefix="vigil-aggbench-") as scratch:
        tmp = a.work or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        if not a.no_mqtt:
            if not shutil.which("mosquitto"):
                p.error("mosquitto not installed (or --no-mqtt)")
            broker = Broker(Path(tmp) / "broker")
        try:
            for rate in (float(r) for r in a.rates.split(",")):
                for engine in engines:
                    for dets in (int(d) for d in a.detections.split(",")):
                        for confirm in a.confirm.split(","):
                            for assoc in (a.association.split(",") if confirm == "on" and a.association else [""]):
                                try:
                                    row = run_case(a, engine, rate, Path(tmp), broker, confirm == "on", dets, assoc)
                                except (RuntimeError, subprocess.TimeoutExpired) as e:  # a case that cannot keep up
                                    print(f"case {engine} {dets} boxes confirm {confirm} {assoc}: {e}", file=sys.stderr)
                                    failed.append({"engine": engine, "detections": dets, "confirm": confirm == "on",
                                                   "association": assoc, "error": str(e)[:2000]})
                                    continue
                                rows.append(row)
                                print(json.dumps(rows[-1]), flush=True)
        finally:
            if broker:
                broker.stop()
    print(f"\n{'engine':<11}{'boxes':>6}{'assoc':>8}{'confirm':>8}{'offered/s':>10}{'stored/s':>10}{'ack p50':>9}{'ack p99':>9}{'commit p99≤':>12}"
          f"{'cpu µs/rep':>11}{'cores':>7}{'pushed/s':>10}{'drain s':>8}{'track µs/rep':>13}")
    for r in rows:
        offered = "max" if r["offered_per_s"] == 0 else f"{r['offered_per_s']:.0f}"
        print(f"{r['engine']:<11}{r['detections']:>6}{r['association'] if r['confirm'] else '-':>8}{'on' if r['confirm'] else 'off':>8}{offered:>10}{r['stored_per_s']:>10.0f}{r['ack_ms_p50']:>9.1f}{r['ack_ms_p99']:>9.1f}"
              f"{r['commit_ms_p99_le']:>12.1f}{r['aggregator_cpu_us_per_report']:>11.1f}"
              f"{r['aggregator_cpu_cores']:>7.2f}{r['pushed_per_s']:>10.0f}{r['push_drain_s_after_load']:>8.1f}"
              f"{r['confirm_us_per_report']:>13.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows, "failed": failed}, indent=1) + "\n")
    for f in failed:
        print(f"FAILED: {f['engine']} {f['detections']} boxes confirm {f['confirm']} {f['association']}: "
              f"{f['error'][:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
