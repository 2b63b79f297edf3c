"""Hot standby end to end (issue 16): `vigil aggregator`, a primary `vigil edge` and its standby as separate
processes on loopback, the replication channel under mutual TLS (certificates made here with the openssl CLI).

- The primary is SIGKILLed mid-run: the standby (model loaded, paired, the primary's ledger mirrored into its own
  state_dir) sees the channel end, takes over, resumes the same run from the aggregator's cursor and finishes
  the file. The aggregator must then hold every frame exactly once, in one run, stored by two epochs (the
  primary's and the standby's), and the standby must say how long the takeover took.
- A standby whose rules differ from the primary's is refused, with the part that differs named, and exits 2.

- SIGSTOP of the primary for 2 s: the standby suspects it from the missing heartbeats and takes over; the old
  primary wakes up, is fenced by the aggregator, and rejoins as the standby; every frame once.
- Chaos: VIGIL_CHAOS_KILLS (20) SIGKILLs of whichever node is the primary, each at a random moment after the
  other has paired, the killed node restarted at once (it finds its peer primary and starts as its standby), on
  the whole of vtest.avi in real time and a live camera (mirrored pictures); the schedule's seed is printed
  (VIGIL_CHAOS_SEED replays it). Every frame must be stored exactly once in one run, no camera seq lost; the
  takeover times (the primary's last contact to the first report of the new primary stored) are printed.
- The replication channel cut by a proxy while both nodes reach the aggregator: exactly one publishes.
- The aggregator frozen for 2 s across a takeover: nothing lost.
- The standby killed and restarted: the primary never stalls; the standby pairs again and can take over.
- An inference stall injected into the primary (VIGIL_FAULT_INFERENCE): it steps down, the standby takes over;
  the same with batches that fail from some point on (a sticky CUDA error's pattern).
- A live camera (FFmpeg's test picture as MPEG-TS over TCP): the primary SIGKILLed, the standby continues the
  same run above every seq the primary numbered; what the primary numbered and never stored is reported as
  lost, the camera time nobody saw is measured apart.
Needs: VIGIL_BIN built with gRPC, the int8 YOLOv8n in VIGIL_SHARED_MODELS, ffmpeg/ffprobe, openssl, vtest.avi.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from common import THREADS, vigil_bin
from edge_harness import (Aggregator, Camera, FanOutCamera, ReportProxy, accept_each, free_port, loopback_listener,
                          metric, query, read_metrics, skip_without, stored_frames)
from test_edge_e2e import FRAMES, MODEL, assert_accounted_once, vtest200  # noqa: F401 (fixture)


@pytest.fixture(autouse=True)
def _needs():
    """Every test here runs `vigil edge` on the real int8 YOLOv8n (VIGIL_SHARED_MODELS): skipped, named, without it."""
    skip_without(MODEL)


def make_pair_certs(d: Path) -> dict[str, Path]:
    """A pair CA and one certificate per node (serverAuth + clientAuth, SAN 127.0.0.1 and localhost)."""
    if not shutil.which("openssl"):
        pytest.skip("openssl not available")
    d.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=60)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=vigil pair CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    ext = d / "node.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    out = {"ca": d / "ca.pem"}
    for node in ("node-a", "node-b"):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={node}",
            "-keyout", str(d / f"{node}.key"), "-out", str(d / f"{node}.csr"))
        run("x509", "-req", "-in", str(d / f"{node}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(d / f"{node}.pem"))
        out[node] = d / node
    return out


def write_config(tmp: Path, name: str, agg_port: int, video: Path, replication: str, rules: str) -> Path:
    """edge.yaml of one node; `replication` is the section's body ("" = a lone edge, no section). The int8 model runs
    with float activations: these tests time cameras at 10 fps on 2 shared cores with two edges, and the quantized
    activations (~30 % slower on the CPU) let the primary fall behind under CI's load — a replay instead of a
    re-publish, seen once (2 of 30 frames re-published)."""
    section = f"replication:\n{replication}" if replication else ""
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(f"""edge: e2e-edge
aggregator: 127.0.0.1:{agg_port}
model: {{path: {MODEL}, threads: {THREADS}, int8_activations: float}}
batching: {{max_batch: 2, max_wait_ms: 5}}
state_dir: {tmp / ('state-' + name)}
progress_flush_ms: 200
{section}streams:
  - id: vtest
    source: {video}
    realtime: true
    rules: {rules}
""")
    return cfg


def replication_yaml(role: str, node: str, certs: dict[str, Path], listen: int, peer: int) -> str:
    return (f"  role: {role}\n  listen: 127.0.0.1:{listen}\n  peer: 127.0.0.1:{peer}\n  node: {node}\n"
            f"  heartbeat_ms: 100\n"
            f"  tls: {{cert_file: {certs[node]}.pem, key_file: {certs[node]}.key, ca_file: {certs['ca']}}}\n")


def start(cfg: Path, tmp: Path, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(tmp / f"{name}.log", "ab")
    return subprocess.Popen([vigil_bin(), "--log-level", "info", "edge", "--config", str(cfg),
                             "--shutdown-timeout-ms", "60000", "--metrics-out", str(tmp / f"{name}.prom")],
                            stdout=log, stderr=log, env={**os.environ, **(env or {})})


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def agg_edge(agg) -> dict:
    """The aggregator's /api/stats entry of edge e2e-edge."""
    stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{agg.http_port}/api/stats", timeout=10).read())
    return next(e for e in stats["edges"] if e["edge"] == "e2e-edge")


def test_the_standby_takes_over_after_a_sigkill_and_every_frame_is_stored_once(vtest200, tmp_path):
    certs = make_pair_certs(tmp_path / "certs")
    port, a, b = free_port(), free_port(), free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    rules = "{classes: [person]}"
    primary_cfg = write_config(tmp_path, "primary", port, vtest200, replication_yaml("primary", "node-a", certs, a, b), rules)
    standby_cfg = write_config(tmp_path, "standby", port, vtest200, replication_yaml("standby", "node-b", certs, b, a), rules)
    http = free_port()  # the standby serves /healthz and /metrics while it waits
    standby_cfg.write_text(standby_cfg.read_text().replace("state_dir:", f"http_port: {http}\nstate_dir:", 1))
    primary = start(primary_cfg, tmp_path, "primary")
    standby = start(standby_cfg, tmp_path, "standby")
    try:
        # Paired: the standby's line that says where its heartbeats travel (the channel logs "paired with primary"
        # a moment before it: CI once read the log between the two).
        wait_for(lambda: "heartbeats every 100 ms on" in (tmp_path / "standby.log").read_text(), 120,
                 "the standby to pair")
        # Its heartbeats on a connection of their own: no mirrored ledger state or picture holds an answer back.
        assert "heartbeats every 100 ms on a connection of their own" in (tmp_path / "standby.log").read_text()
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=10).read())
        assert health["status"] == "standby" and health["node"] == "node-b", health
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read().decode()
        assert 'vigil_edge_replication_role{role="standby"} 1' in scraped, scraped[:2000]
        wait_for(lambda: stored_frames(agg.db, "vtest") >= 40 or primary.poll() is not None, 120, "40 stored frames")
        stored = stored_frames(agg.db, "vtest")
        assert primary.poll() is None and stored < FRAMES, f"{stored} frames stored: cannot test a kill mid-run"
        # The aggregator's view of the edge (the dashboard's tile line): one session over tcp, a new instance.
        edge = agg_edge(agg)
        assert edge["links"] == ["tcp"] and edge["last_grant"]["kind"] == "new" and edge["epoch"] == 1, edge
        primary.kill()
        primary.wait(timeout=30)
        wait_for(lambda: agg_edge(agg)["epoch"] == 2, 120, "the standby's grant")
        edge = agg_edge(agg)  # the standby took over: a new instance replaced epoch 1
        assert edge["last_grant"]["kind"] == "replaced" and edge["links"] == ["tcp"], edge
        rc = standby.wait(timeout=300)
        assert rc == 0, f"standby exited {rc}:\n{(tmp_path / 'standby.log').read_text()[-3000:]}"
    finally:
        for p in (primary, standby):
            if p.poll() is None:
                p.kill()
        agg.kill(signal.SIGTERM)
    run, _ = assert_accounted_once(agg.db, "vtest", FRAMES)  # one run, seqs 0..199, each once
    assert run == 1
    epochs = {r[0] for r in query(agg.db, "SELECT DISTINCT f.epoch FROM frames f")}
    assert epochs == {1, 2}, f"frames stored by epochs {epochs}; want the primary's and the standby's"
    log = (tmp_path / "standby.log").read_text()
    assert "takes over edge 'e2e-edge': the replication stream ended" in log, log[-3000:]
    assert "resuming run" in log, log[-3000:]
    # The standby read the file while it waited (warm_sources: files by default): it resumes where it was,
    # skipping at most the frames acknowledged after its last mirrored state, not decoding from the start.
    m = re.search(r"stream 'vtest': resumes at position (\d+) \(read up to (\d+) while standby; (\d+) to skip\)", log)
    assert m, log[-3000:]
    resume_at, read_to, to_skip = (int(g) for g in m.groups())
    assert resume_at >= 40 and read_to > 0 and to_skip == resume_at - read_to and to_skip < resume_at, m.group(0)
    m = re.search(r"first report stored (\d+) ms after the primary's last contact", log)
    assert m, log[-3000:]
    took_ms = int(m.group(1))
    metrics = read_metrics(tmp_path / "standby.prom")
    assert metric(metrics, "vigil_edge_takeovers_total") == 1
    assert metric(metrics, "vigil_edge_replication_role", role="primary") == 1
    assert abs(metric(metrics, "vigil_edge_takeover_seconds") * 1000 - took_ms) <= 1
    # The takeover step by step: every step reached, in the order the path takes them (the Welcome's state write
    # and the streams' resumption both follow the Welcome), the last one the time above.
    m = re.search(r"takeover timeline, ms after the old primary's last contact: (.*)", log)
    assert m, log[-3000:]
    steps = {k: (None if v == "-" else float(v)) for k, v in (p.rsplit(" ", 1) for p in m.group(1).split(", "))}
    assert list(steps) == ["decided", "drained", "serving", "ledger", "welcomed", "durable", "resumed", "fed",
                           "detected", "stored", "republished", "republished_stored"], m.group(0)
    # No results were mirrored here (a file stream): nothing re-published.
    assert steps.pop("republished") is None and steps.pop("republished_stored") is None, m.group(0)
    order = ["decided", "drained", "serving", "ledger", "welcomed", "resumed", "fed", "detected", "stored"]
    assert [steps[k] for k in order] == sorted(steps[k] for k in order), m.group(0)
    assert steps["durable"] >= steps["welcomed"] and steps["stored"] >= took_ms - 1, m.group(0)
    for k, v in steps.items():
        assert abs(metric(metrics, "vigil_edge_takeover_phase_seconds", phase=k) * 1000 - v) <= 0.1, k
    print(f"takeover: first report of the standby stored {took_ms} ms after the primary's last contact; {m.group(1)}")


def test_a_standby_with_other_rules_is_refused_and_says_what_differs(vtest200, tmp_path):
    certs = make_pair_certs(tmp_path / "certs")
    port, a, b = free_port(), free_port(), free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    primary = start(write_config(tmp_path, "primary", port, vtest200,
                                 replication_yaml("primary", "node-a", certs, a, b), "{classes: [person]}"),
                    tmp_path, "primary")
    standby = start(write_config(tmp_path, "standby", port, vtest200,
                                 replication_yaml("standby", "node-b", certs, b, a), "{classes: [car]}"),
                    tmp_path, "standby")
    try:
        rc = standby.wait(timeout=180)
    finally:
        for p in (primary, standby):
            if p.poll() is None:
                p.kill()
        agg.kill(signal.SIGTERM)
    log = (tmp_path / "standby.log").read_text()
    assert rc == 2, f"standby exited {rc}:\n{log[-3000:]}"
    assert re.search(r"refused to pair: the rules differ \(primary [0-9a-f]{8}, standby [0-9a-f]{8}\); "
                     r"stream 'vtest': its rules differ", log), log[-3000:]
    assert "the model differs" not in log and "the streams differ" not in log


@pytest.fixture(scope="module")
def vtest_full(tmp_path_factory) -> tuple[Path, int]:
    """All of vtest.avi (795 frames, 10 FPS): 80 s in real time, long enough for the kill schedule."""
    if not shutil.which("ffprobe"):
        pytest.skip("ffprobe not available")
    from test_edge_e2e import VTEST
    if not VTEST.is_file():
        pytest.skip(f"{VTEST} missing (apt install opencv-doc)")
    n = subprocess.run(["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                        "stream=nb_read_frames", "-of", "csv=p=0", str(VTEST)], check=True, capture_output=True,
                       text=True, timeout=120).stdout.strip()
    return VTEST, int(n)


class Pair:
    """Two nodes of edge 'e2e-edge' (node-a starts as primary, node-b as standby) against one aggregator.
    `b_dials` (optional): a callable taking node-a's channel port and returning the port node-b dials for it
    (a proxy in between); node-a always dials node-b directly."""

    def __init__(self, tmp: Path, video: Path, agg: Aggregator, b_dials=None):
        certs = make_pair_certs(tmp / "certs")
        a, b = free_port(), free_port()
        self.tmp = tmp
        self.channel_port = {"node-a": a, "node-b": b}
        b_peer = b_dials(a) if b_dials else a
        self.cfg = {
            "node-a": write_config(tmp, "node-a", agg.port, video, replication_yaml("primary", "node-a", certs, a, b),
                                   "{classes: [person]}"),
            "node-b": write_config(tmp, "node-b", agg.port, video,
                                   replication_yaml("standby", "node-b", certs, b, b_peer), "{classes: [person]}"),
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, node: str, env: dict[str, str] | None = None):
        self.procs[node] = start(self.cfg[node], self.tmp, node, env)

    def log(self, node: str) -> str:
        return (self.tmp / f"{node}.log").read_text(errors="replace")

    def paired(self, node: str) -> int:
        return self.log(node).count("of edge 'e2e-edge' paired with primary")

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def takeover_times(*logs: str) -> list[int]:
    return [int(m) for log in logs for m in re.findall(r"first report stored (\d+) ms after the primary's last contact", log)]


def test_sigstop_of_the_primary_the_standby_takes_over_and_the_old_primary_rejoins_as_standby(vtest200, tmp_path):
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    pair = Pair(tmp_path, vtest200, agg)
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        wait_for(lambda: stored_frames(agg.db, "vtest") >= 40, 120, "40 stored frames")
        a = pair.procs["node-a"]
        a.send_signal(signal.SIGSTOP)  # alive, silent: only the heartbeats tell (100 ms x 3)
        wait_for(lambda: "takes over edge 'e2e-edge': no heartbeat answer" in pair.log("node-b"), 30, "the takeover")
        time.sleep(max(0.0, 2.0 - 0.3))
        a.send_signal(signal.SIGCONT)  # wakes up believing it leads
        wait_for(lambda: "rejoining edge 'e2e-edge' as the standby" in pair.log("node-a"), 60, "node-a to rejoin")
        wait_for(lambda: pair.paired("node-a") == 1, 60, "node-a to pair with node-b")
        for node in ("node-b", "node-a"):  # node-b finishes the file; node-a takes over the finished run and ends
            rc = pair.procs[node].wait(timeout=300)
            assert rc == 0, f"{node} exited {rc}:\n{pair.log(node)[-3000:]}"
    finally:
        if pair.procs["node-a"].poll() is None:
            pair.procs["node-a"].send_signal(signal.SIGCONT)
        pair.kill_all()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)  # 0 lost, 0 duplicated, one run
    metrics_a = read_metrics(tmp_path / "node-a.prom")
    assert metric(metrics_a, "vigil_edge_rejoins_total") == 1
    assert "was fenced" in pair.log("node-a")
    # node-b finished the file and said so: node-a did not take over a finished run.
    assert "finished every stream: standby 'node-a' has nothing to take over" in pair.log("node-a")
    assert query(agg.db, "SELECT MAX(epoch) FROM frames") == [(2,)]


def test_chaos_sigkills_of_the_current_primary_lose_and_repeat_nothing(vtest_full, tmp_path):
    """Two streams: all of vtest.avi in real time and a live loopback camera that serves several clients (its
    pictures mirrored to the standby, the default; warm_sources: all, so each standby has its own connection). VIGIL_CHAOS_KILLS SIGKILLs of whichever node leads; then the
    file must be stored whole, and the camera's run must hold every seq from 0 up exactly once, none lost (the
    pictures a killed primary never got stored are processed again by the new one)."""
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg not available")
    video, frames = vtest_full
    kills = int(os.environ.get("VIGIL_CHAOS_KILLS", "20"))
    seed = int(os.environ.get("VIGIL_CHAOS_SEED", str(random.randrange(1 << 30))))
    print(f"\nchaos: {kills} SIGKILLs, seed {seed} (VIGIL_CHAOS_SEED={seed} replays the schedule)")
    rng = random.Random(seed)
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    camera = FanOutCamera(tmp_path).start()
    pair = Pair(tmp_path, video, agg)
    for cfg in pair.cfg.values():  # the standby keeps its own camera connection (the camera serves several)
        text = cfg.read_text().replace("  role: ", "  warm_sources: all\n  role: ", 1)
        cfg.write_text(text + f"  - id: cam\n    source: {camera.url}\n    rules: {{classes: [person]}}\n")
    pair.start("node-a")
    pair.start("node-b")
    primary, done = "node-a", 0
    paired = {"node-a": 0, "node-b": 0}
    try:
        for k in range(kills):
            standby = "node-b" if primary == "node-a" else "node-a"
            wait_for(lambda: pair.paired(standby) > paired[standby], 120, f"{standby} to pair before kill {k + 1}")
            paired[standby] = pair.paired(standby)
            time.sleep(rng.uniform(0.2, 1.2))
            assert pair.procs[primary].poll() is None, f"{primary} ended before kill {k + 1}"
            pair.procs[primary].kill()
            pair.procs[primary].wait(timeout=30)
            done += 1
            pair.start(primary)  # restarted: finds the peer primary and starts as its standby
            primary = standby
        standby = "node-b" if primary == "node-a" else "node-a"
        wait_for(lambda: stored_frames(agg.db, "vtest") >= frames, 600, "the whole file stored")
        wait_for(lambda: pair.paired(standby) > paired[standby], 120, f"{standby} to pair at the end")
        for node in (standby, primary):  # the standby first: a primary stopped alone would be taken over
            pair.procs[node].send_signal(signal.SIGTERM)
            rc = pair.procs[node].wait(timeout=120)
            assert rc == 0, f"{node} exited {rc}:\n{pair.log(node)[-3000:]}"
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
    run, _ = assert_accounted_once(agg.db, "vtest", frames)  # 0 lost, 0 duplicated, one run, in seq order
    cam = query(agg.db, "SELECT f.run, f.seq, f.kind FROM frames f JOIN streams s ON s.id = f.stream_id "
                        "WHERE s.stream = 'cam' ORDER BY f.run, f.seq")
    assert {r[0] for r in cam} == {run}, "the camera's run changed"
    seqs = [r[1] for r in cam]
    assert seqs == list(range(len(seqs))), "every camera seq stored exactly once, with no gap"
    lost = [r[1] for r in cam if r[2] == 4]
    assert lost == [], f"camera seqs reported lost though their pictures were mirrored: {lost}"
    replayed = sum(int(m) for log in (pair.log("node-a"), pair.log("node-b"))
                   for m in re.findall(r"stream 'cam': processing (\d+) mirrored picture", log))
    times = sorted(takeover_times(pair.log("node-a"), pair.log("node-b")))
    assert len(times) >= done, f"{done} kills but {len(times)} completed takeovers logged: {times}"
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    print(f"chaos: {done} kills, seed {seed}; takeover (last contact -> first report stored) ms: "
          f"p50 {p(0.5)}, p99 {p(0.99)}, max {times[-1]}; all: {times}; camera: {len(seqs)} seqs stored once, "
          f"{replayed} pictures processed again by new primaries, 0 lost")


class Proxy:
    """A TCP forwarder 127.0.0.1:port -> 127.0.0.1:target (test tooling): cut() resets every connection through
    it and refuses new ones, as a broken network between the two nodes would."""

    def __init__(self, target: int):
        self.target = target
        self.listener = loopback_listener()
        self.port = self.listener.getsockname()[1]
        self.cut_ = threading.Event()
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        accept_each(self.listener, self._forward)

    def _forward(self, c: socket.socket):
        if self.cut_.is_set():
            c.close()
            return
        try:
            u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            c.close()
            return
        with self.lock:
            self.conns += [c, u]
        for a, b in ((c, u), (u, c)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s_ in (src, dst):
            try:
                s_.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        self.cut_.set()
        with self.lock:
            for c in self.conns:
                try:
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
                    c.close()
                except OSError:
                    pass
            self.conns.clear()

    def close(self):
        self.cut()
        self.listener.close()


def epochs_by_seq(db: Path) -> dict[int, tuple[int, int]]:
    """epoch -> (lowest, highest) seq it stored."""
    return {e: (lo, hi) for e, lo, hi in query(db, "SELECT epoch, MIN(seq), MAX(seq) FROM frames GROUP BY epoch")}


def test_the_replication_channel_cut_while_both_reach_the_aggregator_exactly_one_publishes(vtest200, tmp_path):
    """The network between the nodes breaks (a proxy resets the channel and refuses it from then on) while both
    still reach the aggregator: the standby takes over, the aggregator's newer epoch fences the old primary, which
    stops publishing and rejoins as the standby. Exactly one node publishes at any time: every frame is stored
    once, and every frame of the first epoch comes before every frame of the second."""
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    proxies: list[Proxy] = []

    def through_proxy(a: int) -> int:
        proxies.append(Proxy(a))
        return proxies[0].port

    pair = Pair(tmp_path, vtest200, agg, b_dials=through_proxy)
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair through the proxy")
        wait_for(lambda: stored_frames(agg.db, "vtest") >= 40, 120, "40 stored frames")
        assert pair.procs["node-a"].poll() is None and stored_frames(agg.db, "vtest") < FRAMES
        proxies[0].cut()
        wait_for(lambda: "takes over edge 'e2e-edge': the replication stream ended" in pair.log("node-b"), 30,
                 "node-b to take over")
        wait_for(lambda: "rejoining edge 'e2e-edge' as the standby" in pair.log("node-a"), 60, "node-a fenced")
        for node in ("node-b", "node-a"):
            rc = pair.procs[node].wait(timeout=300)
            assert rc == 0, f"{node} exited {rc}:\n{pair.log(node)[-3000:]}"
    finally:
        for p in proxies:
            p.close()
        pair.kill_all()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)  # 0 lost, 0 duplicated, one run
    spans = epochs_by_seq(agg.db)
    assert set(spans) == {1, 2}, spans
    assert spans[1][1] < spans[2][0], f"the two epochs' frames interleave: {spans}"
    assert "was fenced" in pair.log("node-a")
    assert metric(read_metrics(tmp_path / "node-a.prom"), "vigil_edge_rejoins_total") == 1


def test_the_aggregator_unreachable_during_a_takeover_loses_nothing(vtest200, tmp_path):
    """The aggregator is frozen (SIGSTOP) just before the primary is SIGKILLed and wakes 2 s later: the standby's
    promotion waits for it and nothing is lost or stored twice."""
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    pair = Pair(tmp_path, vtest200, agg)
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        wait_for(lambda: stored_frames(agg.db, "vtest") >= 40, 120, "40 stored frames")
        agg.proc.send_signal(signal.SIGSTOP)
        pair.procs["node-a"].kill()
        pair.procs["node-a"].wait(timeout=30)
        wait_for(lambda: "takes over edge 'e2e-edge'" in pair.log("node-b"), 30, "node-b to take over")
        time.sleep(2.0)
        agg.proc.send_signal(signal.SIGCONT)
        rc = pair.procs["node-b"].wait(timeout=300)
        assert rc == 0, f"node-b exited {rc}:\n{pair.log('node-b')[-3000:]}"
    finally:
        if agg.proc and agg.proc.poll() is None:
            agg.proc.send_signal(signal.SIGCONT)
        pair.kill_all()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", FRAMES)
    assert set(epochs_by_seq(agg.db)) == {1, 2}
    assert takeover_times(pair.log("node-b")), pair.log("node-b")[-3000:]


def test_the_standby_killed_and_restarted_the_primary_never_stalls_and_the_standby_resyncs(vtest_full, tmp_path):
    """The standby is SIGKILLed: the primary keeps publishing as if nothing happened (frames keep being stored
    while no standby is there). Restarted, the standby pairs again and mirrors the ledger anew; then the primary
    is SIGKILLed and the restarted standby takes over: every frame once."""
    video, frames = vtest_full
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    pair = Pair(tmp_path, video, agg)
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        wait_for(lambda: stored_frames(agg.db, "vtest") >= 40, 120, "40 stored frames")
        pair.procs["node-b"].kill()
        pair.procs["node-b"].wait(timeout=30)
        before = stored_frames(agg.db, "vtest")
        time.sleep(3.0)  # the clip plays at 10 FPS: ~30 frames if the primary goes on undisturbed
        during = stored_frames(agg.db, "vtest") - before
        assert during >= 20, f"only {during} frames stored in the 3 s without a standby: the primary stalled"
        pair.start("node-b")
        wait_for(lambda: pair.paired("node-b") == 2, 120, "node-b to pair again")
        time.sleep(1.0)  # a few ledger states mirrored after the re-sync
        assert stored_frames(agg.db, "vtest") < frames, "the clip ended before the second kill"
        pair.procs["node-a"].kill()
        pair.procs["node-a"].wait(timeout=30)
        rc = pair.procs["node-b"].wait(timeout=300)
        assert rc == 0, f"node-b exited {rc}:\n{pair.log('node-b')[-3000:]}"
    finally:
        pair.kill_all()
        agg.kill(signal.SIGTERM)
    assert_accounted_once(agg.db, "vtest", frames)
    assert set(epochs_by_seq(agg.db)) == {1, 2}
    assert "takes over edge 'e2e-edge': the replication stream ended" in pair.log("node-b")
    assert "no frame processed" not in pair.log("node-a")  # the stall watchdog never fired on the primary


def run_a_primary_that_steps_down(tmp: Path, video: Path, fault: str, started_marker: str, stall_ms: int | None = None):
    """The chaos suite's pair with VIGIL_FAULT_INFERENCE=`fault` on node-a (the primary) and, when given,
    step_down.stall_ms on both; waits for the standby to pair (the fault's log line `started_marker` must not
    be there yet), for the takeover and for both nodes to end (exit 0). Returns (aggregator db, node-a log,
    node-b log, node-a metrics)."""
    port = free_port()
    agg = Aggregator(tmp, port)
    agg.start()
    pair = Pair(tmp, video, agg)
    if stall_ms is not None:
        for node in ("node-a", "node-b"):
            cfg = pair.cfg[node]
            cfg.write_text(cfg.read_text().replace("  heartbeat_ms: 100\n",
                                                   f"  heartbeat_ms: 100\n  step_down: {{stall_ms: {stall_ms}}}\n"))
    pair.start("node-a", env={"VIGIL_FAULT_INFERENCE": fault})
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        assert started_marker not in pair.log("node-a"), "the fault came before the standby paired: cannot test"
        wait_for(lambda: "takes over edge 'e2e-edge'" in pair.log("node-b"), 120, "the takeover")
        for node in ("node-b", "node-a"):
            rc = pair.procs[node].wait(timeout=300)
            assert rc == 0, f"{node} exited {rc}:\n{pair.log(node)[-3000:]}"
    finally:
        pair.kill_all()
        agg.kill(signal.SIGTERM)
    return agg.db, pair.log("node-a"), pair.log("node-b"), read_metrics(tmp / "node-a.prom")


def test_an_inference_stall_on_the_primary_makes_it_step_down_and_the_standby_takes_over(vtest200, tmp_path):
    """The primary's 70th batch stalls 4 s (VIGIL_FAULT_INFERENCE, the edge's fault injection for tests): with
    step_down.stall_ms 1000 it finds itself unhealthy while frames wait, tells its standby why and the standby
    takes over at once (no heartbeat is missed: the process is alive); the aggregator's newer epoch fences the
    old primary, which rejoins as the standby. Every frame once."""
    db, log_a, log_b, m = run_a_primary_that_steps_down(tmp_path, vtest200, "stall:70:4000", "stalls 4000 ms",
                                                        stall_ms=1000)
    assert_accounted_once(db, "vtest", FRAMES)
    spans = epochs_by_seq(db)
    assert set(spans) == {1, 2} and spans[1][1] < spans[2][0], spans
    assert re.search(r"steps down: no inference batch completed for \d+ ms with \d+ frame\(s\) waiting", log_a), log_a[-3000:]
    assert "takes over edge 'e2e-edge': the primary stepped down: no inference batch completed" in log_b, log_b[-3000:]
    assert "no heartbeat answer" not in log_b
    assert "was fenced" in log_a
    assert metric(m, "vigil_edge_step_downs_total") == 1
    assert metric(m, "vigil_edge_rejoins_total") == 1


def camera_pair(tmp: Path, agg: Aggregator, url: str, warm_sources: str | None = None,
                mirror_frames: str | None = None, mirror_via: str | None = None) -> Pair:
    """The pair of Pair on one live stream from `url` (not real-time paced: a camera paces itself)."""
    pair = Pair(tmp, Path("/nonexistent"), agg)
    for node in ("node-a", "node-b"):
        cfg = pair.cfg[node]
        text = cfg.read_text().replace("source: /nonexistent\n    realtime: true\n", f"source: {url}\n")
        if warm_sources:
            text = text.replace("  role: ", f"  warm_sources: {warm_sources}\n  role: ", 1)
        if mirror_frames:
            text = text.replace("  role: ", f"  mirror_frames: {mirror_frames}\n  role: ", 1)
        if mirror_via:
            text = text.replace("  role: ", f"  mirror_via: {mirror_via}\n  role: ", 1)
        cfg.write_text(text)
    return pair


def one_client_camera_pair(tmp: Path, mirror_frames: str | None = None,
                           mirror_via: str | None = None) -> tuple[Aggregator, Camera, Pair]:
    """A started aggregator, a started one-client Camera and the camera_pair on it (not started)."""
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg not available")
    agg = Aggregator(tmp, free_port())
    agg.start()
    camera = Camera(tmp)
    camera.start()
    return agg, camera, camera_pair(tmp, agg, camera.url, mirror_frames=mirror_frames, mirror_via=mirror_via)


def frame_rows(db: Path) -> list[tuple]:
    """(run, seq, kind, epoch) of every stored frame, in run and seq order."""
    return query(db, "SELECT f.run, f.seq, f.kind, f.epoch FROM frames f ORDER BY f.run, f.seq") if db.exists() else []


def stop_once_the_new_primary_stored(pair: Pair, db: Path, frames: int = 20):
    """After a kill of node-a: waits for node-b's takeover and `frames` frames of its epoch, then SIGTERMs it."""
    wait_for(lambda: "takes over edge 'e2e-edge'" in pair.log("node-b"), 30, "the takeover")
    wait_for(lambda: sum(1 for r in frame_rows(db) if r[3] == 2 and r[2] != 4) >= frames, 120,
             f"{frames} frames of the new primary")
    pair.procs["node-b"].send_signal(signal.SIGTERM)
    rc = pair.procs["node-b"].wait(timeout=120)
    assert rc == 0, f"node-b exited {rc}:\n{pair.log('node-b')[-3000:]}"


def kill_the_primary_of_a_one_client_camera(pair: Pair, camera: Camera, agg: Aggregator):
    """SIGKILLs node-a; the camera drops its dead client and takes the next one (restarted, as such cameras do);
    then node-b's takeover and 20 of its frames stored (stop_once_the_new_primary_stored)."""
    pair.procs["node-a"].kill()
    pair.procs["node-a"].wait(timeout=30)
    camera.stop()
    camera.start()
    stop_once_the_new_primary_stored(pair, agg.db)


def assert_replayed_none_lost(pair: Pair, m: dict, at_least: int, why: str) -> tuple[float, int, int]:
    """node-b's takeover processed again at least `at_least` mirrored pictures of stream vtest (its metric and its
    log line agree) and reported none lost. Returns (replayed, first seq, last seq)."""
    assert metric(m, "vigil_edge_frames_lost_on_restart_total", stream="vtest") == 0
    replayed = metric(m, "vigil_edge_takeover_replayed_frames_total", stream="vtest")
    assert replayed >= at_least, f"only {replayed} mirrored pictures processed again ({why})"
    log_b = pair.log("node-b")
    found = re.search(r"stream 'vtest': processing (\d+) mirrored picture\(s\) of the old primary again "
                      r"\(seqs (\d+)\.\.(\d+)\)", log_b)
    assert found, log_b[-3000:]
    assert int(found.group(1)) == replayed
    return replayed, int(found.group(2)), int(found.group(3))


def assert_one_run_without_gaps(db: Path) -> list[tuple]:
    rows = frame_rows(db)
    assert {r[0] for r in rows} == {1}, "the standby must continue the primary's run"
    seqs = [r[1] for r in rows]
    assert seqs == list(range(len(seqs))), "every seq of the run is accounted exactly once, with no gap"
    return rows


def test_a_live_camera_continues_the_same_run_on_the_standby_and_the_missed_time_is_reported(tmp_path):
    """A live source (a camera that serves a new client after the old one went away, as network cameras do),
    its pictures not mirrored (mirror_frames: none): the primary is SIGKILLed; the standby takes over and
    continues the run above every seq the primary numbered (its mirrored high-water mark): every seq of the run
    is stored once or reported lost (frames the primary numbered and never got stored), no gap; the camera time
    between the primary's last contact and the standby's first frame is reported on its own (log and
    vigil_edge_takeover_camera_gap_seconds)."""
    agg, camera, pair = one_client_camera_pair(tmp_path, mirror_frames="none")
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        wait_for(lambda: len(frame_rows(agg.db)) >= 30, 120, "30 frames of the camera stored")
        kill_the_primary_of_a_one_client_camera(pair, camera, agg)
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
    after = assert_one_run_without_gaps(agg.db)
    # The new primary's own frames (not its lost marks) all come after every frame of the old one.
    first_new = min(r[1] for r in after if r[3] == 2 and r[2] != 4)
    assert all(r[3] == 1 or r[2] == 4 for r in after if r[1] < first_new), "old epoch's frames after the new one's"
    # Lost: the seqs the old primary numbered above everything it got stored (one block up to the new primary's
    # first, counted in lost_on_restart), plus any hole below that the dead process still had a drop mark
    # pending for (under load: its queue-full drops), which the aggregator lacks and the takeover closes too.
    lost = [r[1] for r in after if r[2] == 4 and r[3] == 2]
    old_top = max(r[1] for r in after if r[3] == 1)
    above = [q for q in lost if q > old_top]
    assert above == list(range(old_top + 1, first_new)), f"lost above the old primary's last: {above}"
    m = read_metrics(tmp_path / "node-b.prom")
    assert metric(m, "vigil_edge_frames_lost_on_restart_total", stream="vtest") == len(above)
    gap = metric(m, "vigil_edge_takeover_camera_gap_seconds", stream="vtest")
    assert 0 < gap < 30, gap
    log_b = pair.log("node-b")
    assert re.search(r"stream 'vtest': \d+ ms of camera time missed in the takeover", log_b), log_b[-3000:]
    print(f"live takeover: {len(lost)} seqs the primary numbered and never stored (reported lost), "
          f"{gap * 1000:.0f} ms of camera time missed")


@pytest.mark.parametrize("via", ["channel", "shm"])
def test_the_standby_processes_again_the_camera_pictures_the_dead_primary_never_got_stored(tmp_path, via):
    """mirror_frames: live (the default): the primary sends every camera picture it numbers to the standby — as a
    JPEG over the channel (mirror_via: channel, the default), or raw into the standby's shared-memory ring on this
    host (mirror_via: shm, issue 17). Its inference stalls (VIGIL_FAULT_INFERENCE) and it is SIGKILLed 1.5 s into
    the stall, holding about 15 numbered pictures it never got stored (in its queues, or dropped for a full queue
    with the drop mark still pending). The standby processes those pictures again from its mirror window: nothing
    is reported lost, every seq of the run is stored exactly once, the old primary's pictures by the new epoch."""
    agg, camera, pair = one_client_camera_pair(tmp_path, mirror_via=via)
    pair.start("node-a", env={"VIGIL_FAULT_INFERENCE": "stall:60:2500"})  # < step_down.stall_ms (3000)
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        assert "stalls 2500 ms" not in pair.log("node-a"), "the stall came before the standby paired: cannot test"
        wait_for(lambda: "stalls 2500 ms" in pair.log("node-a"), 120, "the primary's inference stall")
        time.sleep(1.5)
        kill_the_primary_of_a_one_client_camera(pair, camera, agg)
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
    rows = assert_one_run_without_gaps(agg.db)
    assert [r for r in rows if r[2] == 4] == [], "a seq was reported lost though its picture was mirrored"
    m = read_metrics(tmp_path / "node-b.prom")
    ring = "gets the primary's pictures raw through its ring" in pair.log("node-b")
    assert ring == (via == "shm"), pair.log("node-b")[-3000:]
    replayed, first, last = assert_replayed_none_lost(pair, m, 10, "10 fps x 1.5 s of stall")
    if via == "shm":
        # The ring's pictures taken over came from copies the standby made; those stored before it read them were
        # released uncopied (the stall held every ack from its start: at least the replayed ones were copied).
        said = re.search(r"its picture ring: (\d+) picture\(s\) copied, (\d+) released uncopied \(stored before they "
                         r"were read\), 0 rejected", pair.log("node-b"))
        assert said, pair.log("node-b")[-3000:]
        assert int(said.group(1)) >= replayed, said.group(0)
    # The stalled batch's pictures and those queued behind it were processed by nobody else: the new primary
    # stored them. (Pictures the old primary dropped for its full queue may have had their drop marks stored
    # before the kill: then the aggregator kept those, once.)
    processed_again = [r for r in rows if first <= r[1] <= last and r[3] == 2 and r[2] in (1, 2)]
    assert len(processed_again) >= 3, [r for r in rows if first <= r[1] <= last]
    # As the primary now with no standby paired, node-b keeps its pictures (its own and the replayed ones) raw
    # until stored, for a standby that pairs — none is encoded for nobody (that starved a primary left alone on
    # the GPU machine), none mirrored, none evicted, none skipped.
    assert metric(m, "vigil_edge_mirror_frames_total", stream="vtest") == 0
    assert metric(m, "vigil_edge_mirror_frames_skipped_total", stream="vtest") == 0
    assert metric(m, "vigil_edge_mirror_unpaired_evicted_total", stream="vtest") == 0
    assert metric(m, "vigil_edge_mirror_frames_evicted_total") == 0
    assert ("vigil_edge_mirror_retained_frames", frozenset()) in m, "the kept pictures' gauge is exported"
    print(f"live takeover with mirrored pictures: {replayed} processed again (seqs {first}..{last}), "
          f"{len(processed_again)} stored by the new primary, 0 lost")


def test_the_standby_re_publishes_the_dead_primarys_own_results_instead_of_running_its_pictures_again(tmp_path):
    """replication.mirror_results (the default): the primary sends each processed camera picture's detections to
    the standby beside the picture. Its reports are held on their way to the aggregator (a proxy), so for 2 s it
    processes pictures that nobody stores; then it is SIGKILLed (the held reports die with its connection). The
    standby re-publishes the old primary's own detections for those pictures instead of running them again:
    nothing lost, every seq stored exactly once, all of them by the new epoch."""
    agg, camera, pair = one_client_camera_pair(tmp_path)
    proxy = ReportProxy(agg.port)
    cfg = pair.cfg["node-a"]
    cfg.write_text(cfg.read_text().replace(f"aggregator: 127.0.0.1:{agg.port}\n",
                                           f"aggregator: 127.0.0.1:{proxy.port}\n", 1))
    pair.start("node-a")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        wait_for(lambda: len(frame_rows(agg.db)) >= 20, 120, "20 frames of the camera stored")
        proxy.reports = "hold"
        time.sleep(2.0)  # 10 fps: about 20 pictures processed, their reports held
        kill_the_primary_of_a_one_client_camera(pair, camera, agg)
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
        proxy.close()
    assert proxy.held, "no report was held: the primary published nothing in the 2 s"
    rows = assert_one_run_without_gaps(agg.db)
    assert [r for r in rows if r[2] == 4] == [], "a seq was reported lost though its result was mirrored"
    m = read_metrics(tmp_path / "node-b.prom")
    replayed, first, last = assert_replayed_none_lost(pair, m, 10, "10 fps x 2 s of held reports")
    republished = metric(m, "vigil_edge_takeover_republished_results_total", stream="vtest")
    assert republished >= 10, f"only {republished} of {replayed} frames re-published from the old primary's results"
    found = re.search(r"stream 'vtest': processing \d+ mirrored picture\(s\) of the old primary again \(seqs \d+\.\.\d+\): "
                      r"(\d+) with the old primary's own results to re-publish, (\d+) to run again", pair.log("node-b"))
    assert found, pair.log("node-b")[-3000:]
    assert int(found.group(1)) == republished
    assert int(found.group(1)) + int(found.group(2)) == replayed
    assert f"re-published the old primary's own results for {int(republished)} frame(s)" in pair.log("node-b")
    # The takeover times the re-published results apart: handed over, then stored (said and exported on their own:
    # when the camera ended, the new primary may process no picture of its own and log no timeline line).
    said = re.search(r"takeover: the old primary's own results re-published at ([0-9.]+) ms and the first stored at "
                     r"([0-9.]+) ms", pair.log("node-b"))
    assert said, pair.log("node-b")[-3000:]
    at, stored_at = float(said.group(1)), float(said.group(2))
    assert 0 < at <= stored_at, said.group(0)
    assert abs(metric(m, "vigil_edge_takeover_phase_seconds", phase="republished") * 1000 - at) <= 0.1
    assert abs(metric(m, "vigil_edge_takeover_phase_seconds", phase="republished_stored") * 1000 - stored_at) <= 0.1
    # As the primary now, node-b mirrors its own results (for a standby that pairs) and evicted none of them.
    assert metric(m, "vigil_edge_mirror_results_total", stream="vtest") >= 20
    assert metric(m, "vigil_edge_mirror_results_evicted_total") == 0
    # Nothing the old primary sent after the hold reached the aggregator: every seq from the takeover's first on
    # was stored by the new epoch, the re-published ones included.
    assert {r[3] for r in rows if r[1] >= first} == {2}, [r for r in rows if r[1] >= first][:20]
    print(f"takeover with mirrored results: {replayed} frames taken over (seqs {first}..{last}), {republished:.0f} "
          f"re-published from the old primary's own results, 0 lost")


def test_pictures_kept_while_no_standby_was_paired_reach_the_standby_that_pairs(tmp_path):
    """A primary alone (its standby not started yet) keeps its camera pictures raw until the aggregator stored them
    — it encodes none for nobody. Its inference stalls (VIGIL_FAULT_INFERENCE) before the standby starts, so the
    pictures numbered since stay unstored; the standby pairs during the stall and gets them then (as JPEGs over
    the channel); the primary is SIGKILLed: the standby processes those pictures again, nothing is lost."""
    agg, camera, pair = one_client_camera_pair(tmp_path)
    pair.start("node-a", env={"VIGIL_FAULT_INFERENCE": "stall:40:9000"})
    try:
        wait_for(lambda: "stalls 9000 ms" in pair.log("node-a"), 120, "the primary's inference stall")
        stalled_at = time.monotonic()
        pair.start("node-b")
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        # The kept pictures go out within a metrics period (100 ms) of the pairing; a JPEG of 640x480 takes ~1 ms.
        time.sleep(1.0)
        assert "takes over" not in pair.log("node-b"), "the primary stepped down before the kill: cannot test"
        assert time.monotonic() - stalled_at < 8.5, "the standby paired after the stall: cannot test"
        kill_the_primary_of_a_one_client_camera(pair, camera, agg)
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
    rows = assert_one_run_without_gaps(agg.db)
    assert [r for r in rows if r[2] == 4] == [], "a seq was reported lost though the primary kept its picture"
    m = read_metrics(tmp_path / "node-b.prom")
    # The stall began before node-b started: the pictures it got were numbered while none was paired.
    assert_replayed_none_lost(pair, m, 10, "kept pictures: 10 fps for the seconds node-b took")


def test_a_warm_standby_keeps_its_camera_connection_through_the_takeover(tmp_path):
    """warm_sources: all, with a camera that serves two clients: the standby connects while it waits (every
    picture dropped), so at the takeover it needs no new connection: the camera sees no client after the kill,
    and the run continues with every seq stored once or reported lost."""
    if not shutil.which("ffmpeg"):
        pytest.skip("ffmpeg not available")
    port = free_port()
    agg = Aggregator(tmp_path, port)
    agg.start()
    camera = FanOutCamera(tmp_path).start()
    pair = camera_pair(tmp_path, agg, camera.url, warm_sources="all")
    pair.start("node-a")
    wait_for(lambda: len(camera.connected_at) >= 1, 120, "node-a to connect to the camera")
    pair.start("node-b")
    try:
        wait_for(lambda: pair.paired("node-b") == 1, 120, "node-b to pair")
        wait_for(lambda: len(camera.connected_at) >= 2, 60, "the standby's own connection to the camera")
        wait_for(lambda: len(frame_rows(agg.db)) >= 30, 120, "30 frames of the camera stored")
        killed_at = time.monotonic()
        pair.procs["node-a"].kill()
        pair.procs["node-a"].wait(timeout=30)
        stop_once_the_new_primary_stored(pair, agg.db)
    finally:
        pair.kill_all()
        camera.stop()
        agg.kill(signal.SIGTERM)
    log_b = pair.log("node-b")
    assert "reading 0 file stream(s) up to the primary's mirrored cursor and 1 camera(s)" in log_b, log_b[-3000:]
    assert len(camera.connected_at) == 2 and camera.connected_at[1] < killed_at, \
        f"the standby connected at {camera.connected_at} (kill at {killed_at}): not before the takeover"
    assert_one_run_without_gaps(agg.db)
    m = read_metrics(tmp_path / "node-b.prom")
    assert metric(m, "vigil_edge_reconnects_total", stream="vtest") == 0
    gap = metric(m, "vigil_edge_takeover_camera_gap_seconds", stream="vtest")
    assert 0 < gap < 30, gap
    print(f"warm camera takeover: {gap * 1000:.0f} ms of camera time missed")


def test_failing_inference_batches_make_the_primary_step_down(vtest200, tmp_path):
    """Every batch of the primary fails from its 70th on (VIGIL_FAULT_INFERENCE=error:70, as a sticky CUDA error
    would): after step_down.errors (3) in a row it hands over with the reason; the standby takes over; the frames
    the failed batches held are stored as drop marks (detect_error), every other frame with its report, each once."""
    db, log_a, log_b, m = run_a_primary_that_steps_down(tmp_path, vtest200, "error:70", "injected inference error")
    # Every seq once in one run: detections (1), progress (2), or a drop mark (3: the failed batches' frames).
    rows = query(db, "SELECT run, seq, kind, epoch FROM frames ORDER BY run, seq")
    assert {r[0] for r in rows} == {1} and [r[1] for r in rows] == list(range(FRAMES)), rows[:5]
    dropped = [r for r in rows if r[2] == 3]
    assert len(dropped) >= 3 and all(r[3] == 1 for r in dropped), dropped
    assert {r[2] for r in rows} <= {1, 2, 3}
    assert re.search(r"steps down: \d+ inference batches in a row failed \(the last: injected inference error", log_a), \
        log_a[-3000:]
    assert "takes over edge 'e2e-edge': the primary stepped down: " in log_b, log_b[-3000:]
    assert metric(m, "vigil_edge_step_downs_total") == 1
