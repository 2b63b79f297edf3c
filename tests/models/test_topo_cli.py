"""`vigil topo --plan edge.yaml` on the recorded topologies and this machine, and `vigil topo --check`
against a running `vigil edge` (issue 5).

Expected values are worked out by hand from the XML files (../shared/topologies/SOURCES.md describes
them) and from the stream settings: load = streams × fps × GFLOP/frame, staging = width × height × 3 bytes
× 2 frames per stream.

Needs: VIGIL_BIN; ../shared/topologies; for the live parts the shared models, vtest.avi (opencv-doc) and
`taskset` (util-linux) — skipped otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from common import REPO, SHARED_DIR, describe, vigil
from edge_harness import Aggregator, free_port

TOPOLOGIES = Path(os.environ.get("VIGIL_SHARED_TOPOLOGIES") or REPO.parent / "shared" / "topologies")
VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")


def topology(name: str) -> Path:
    p = TOPOLOGIES / name
    if not p.is_file():
        pytest.skip(f"{p} absent")
    return p


def edge_yaml(tmp: Path, streams: list[str], extra: str = "", model: str = "/nonexistent.onnx",
              aggregator_port: int = 7400) -> Path:
    text = f"edge: e1\naggregator: 127.0.0.1:{aggregator_port}\nmodel: {{path: {model}}}\n{extra}\nstreams:\n"
    text += "".join(f"  - {s}\n" for s in streams)
    path = tmp / "edge.yaml"
    path.write_text(text)
    return path


def cameras(n: int, fps: int = 30) -> list[str]:
    return [f"{{id: cam{i}, source: 'rtsp://10.0.0.{i}/s', placement: {{width: 1920, height: 1080, fps: {fps}}}}}"
            for i in range(n)]


def plan_json(*args) -> dict:
    p = vigil("topo", "--json", *args)
    assert p.returncode == 0, describe(p)
    return json.loads(p.stdout)


def test_dgx2_32_streams_over_16_gpus(tmp_path):
    cfg = edge_yaml(tmp_path, cameras(32), "placement: {gflop_per_frame: 8.7}")
    j = plan_json("--plan", cfg, "--topology", topology("nvidiaDGX2.xml"), "--gpus")
    devices = j["plan"]["devices"]
    assert len(devices) == 16
    for d in devices:
        assert len(d["streams"]) == 2
        assert d["load_gflops"] == pytest.approx(2 * 30 * 8.7)
        assert d["staging_bytes"] == 1920 * 1080 * 3 * 2 * 2
        socket_cpus = {0, 1} if d["gpu"] < 8 else {24, 25}  # socket 0 holds PUs 0-1, socket 1 PUs 24-25
        assert d["numa_node"] == (0 if d["gpu"] < 8 else 1)
        assert set(d["worker_cpus"]) <= socket_cpus and set(d["decode_cpus"]) <= socket_cpus, d
    assert j["plan"]["notes"][0].startswith("cannot give each GPU its own cores: 16 of 16 GPUs share cores")

    # As the edge plans while inference runs on the CPU: one worker group per socket, 16 streams each.
    j = plan_json("--plan", cfg, "--topology", topology("nvidiaDGX2.xml"))
    groups = {d["numa_node"]: d for d in j["plan"]["devices"]}
    assert sorted(groups) == [0, 1]
    assert groups[0]["worker_cpus"] == [0, 1] and groups[1]["worker_cpus"] == [24, 25]
    assert len(groups[0]["streams"]) == len(groups[1]["streams"]) == 16


def test_cuda_gpu_and_infiniband_share_node_1(tmp_path):
    cfg = edge_yaml(tmp_path, cameras(3), "placement: {gflop_per_frame: 8.7}")
    j = plan_json("--plan", cfg, "--topology", topology("32em64t-2n8c2t-pci-normalio.xml"), "--gpus")
    by_bus = {g["bus_id"]: g for g in j["topology"]["gpus"]}
    assert sorted(by_bus) == ["0000:03:00.0", "0000:83:00.0", "0000:84:00.0"]
    assert by_bus["0000:84:00.0"]["cuda_ordinal"] == 0  # the GPU with the cuda0 OS device
    d = j["plan"]["devices"][by_bus["0000:84:00.0"]["index"]]
    node1 = set(range(8, 16)) | set(range(24, 32))
    assert d["numa_node"] == 1
    assert d["nic"] == "mlx5_0"
    assert set(d["worker_cpus"]) <= node1 and set(d["decode_cpus"]) <= node1
    assert [len(x["streams"]) for x in j["plan"]["devices"]] == [1, 1, 1]
    p = vigil("topo", "--plan", cfg, "--topology", topology("32em64t-2n8c2t-pci-normalio.xml"))
    assert p.returncode == 0, describe(p)
    assert "plan: 3 streams on 2 CPU worker groups" in p.stdout
    assert "the 3 GPU(s) are left out of the plan (--gpus plans them)" in p.stdout


def test_model_on_one_cuda_device_plans_on_that_gpu_only(tmp_path):
    # The edge with model.device cuda:0 runs one Detector there: the plan keeps the GPU that carries
    # cuda0 (84:00.0, node 1) and puts every stream's threads on its node, as `vigil edge` does.
    cfg = edge_yaml(tmp_path, cameras(3), "placement: {gflop_per_frame: 8.7}",
                    model="/nonexistent.onnx, device: 'cuda:0'")
    j = plan_json("--plan", cfg, "--topology", topology("32em64t-2n8c2t-pci-normalio.xml"))
    assert [g["bus_id"] for g in j["topology"]["gpus"]] == ["0000:84:00.0"]
    (d,) = j["plan"]["devices"]
    node1 = set(range(8, 16)) | set(range(24, 32))
    assert d["numa_node"] == 1 and len(d["streams"]) == 3 and d["nic"] == "mlx5_0"
    assert set(d["worker_cpus"]) <= node1 and set(d["decode_cpus"]) <= node1
    p = vigil("topo", "--plan", cfg, "--topology", topology("32em64t-2n8c2t-pci-normalio.xml"))
    assert "planning on CUDA device 0 only (GPU 2, 0000:84:00.0, is GPU 0 of the plan)" in p.stdout, describe(p)


def test_gpus_seen_only_on_pci_are_planned(tmp_path):
    cfg = edge_yaml(tmp_path, cameras(3), "placement: {gflop_per_frame: 8.7}")
    j = plan_json("--plan", cfg, "--topology", topology("24em64t-2n6c2t-pci.xml"), "--gpus")
    assert [(d["device"], d["numa_node"], len(d["streams"])) for d in j["plan"]["devices"]] == \
        [("gpu0", 0, 1), ("gpu1", 1, 1), ("gpu2", 1, 1)]
    evens, odds = set(range(0, 24, 2)), set(range(1, 24, 2))  # node 0 has the even PUs, node 1 the odd ones
    for d in j["plan"]["devices"]:
        local = evens if d["numa_node"] == 0 else odds
        assert set(d["worker_cpus"]) <= local and set(d["decode_cpus"]) <= local, d


def test_restricted_cpusets_place_nothing_on_cpu_less_nodes(tmp_path):
    cfg = edge_yaml(tmp_path, cameras(4), "placement: {gflop_per_frame: 8.7}")
    j = plan_json("--plan", cfg, "--topology", topology("16amd64-8n2c-cpusets.xml"))
    allowed = set(j["topology"]["allowed_cpus"])
    cpu_less = {n["os_index"] for n in j["topology"]["numa_nodes"] if not n["cpus"]}
    assert cpu_less == {4, 5}
    placed = 0
    for d in j["plan"]["devices"]:
        assert set(d["worker_cpus"]) <= allowed and set(d["decode_cpus"]) <= allowed, d
        assert d["numa_node"] not in cpu_less
        placed += len(d["streams"])
    assert placed == 4


def test_plan_probes_a_file_and_counts_the_model(tmp_path):
    if not VTEST.is_file():
        pytest.skip(f"{VTEST} missing (opencv-doc)")
    model = SHARED_DIR / "yolov8n_coco_640_int8dyn.onnx"
    if not model.is_file():
        pytest.skip(f"{model} missing")
    cfg = edge_yaml(tmp_path, [f"{{id: vt, source: {VTEST}}}"], model=str(model))
    p = vigil("topo", "--plan", cfg)
    assert p.returncode == 0, describe(p)
    assert "model cost 8.74 GFLOP per frame" in p.stdout
    j = plan_json("--plan", cfg)
    (d,) = [d for d in j["plan"]["devices"] if d["streams"]]
    assert d["staging_bytes"] == 768 * 576 * 3 * 2  # vtest.avi: 768x576 at 10 fps, probed
    assert d["load_gflops"] == pytest.approx(10 * 8.744, rel=1e-3)
    bad = vigil("topo", "--plan", edge_yaml(tmp_path, [f"{{id: vt, source: {VTEST}}}"]))
    assert bad.returncode == 2 and "placement.gflop_per_frame" in bad.stderr, describe(bad)


class Edge:
    """`vigil edge` on vtest.avi (realtime, looped) with its HTTP endpoint, until stopped."""

    def __init__(self, tmp: Path, env_extra: dict[str, str]):
        model = SHARED_DIR / "yolox_nano_coco_416_fp32.onnx"
        if not model.is_file() or not VTEST.is_file():
            pytest.skip("needs the shared YOLOX-Nano model and vtest.avi")
        self.port = free_port()
        self.state = tmp / "state"
        # The edge reads no stream before an aggregator admits it.
        self.aggregator = Aggregator(tmp, free_port())
        self.aggregator.start()
        cfg = edge_yaml(tmp, [f"{{id: vt, source: {VTEST}, realtime: true, loop: true}}"],
                        f"http_port: {self.port}\nstate_dir: {self.state}\nplacement: {{bind_single_numa: true}}",
                        model=f"{model}, threads: 2", aggregator_port=self.aggregator.port)
        env = dict(os.environ, **env_extra)
        self.log = open(tmp / "edge.log", "wb")
        self.proc = subprocess.Popen([os.environ["VIGIL_BIN"], "edge", "--config", str(cfg)], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        self.report = self.wait_for_threads(3)

    def wait_for_threads(self, n: int) -> dict:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, (self.state.parent / "edge.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/placement", timeout=2) as r:
                    report = json.load(r)
                if len(report["threads"]) >= n:
                    return report
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("the edge did not place its threads in time")

    def stop(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()
        self.aggregator.kill(signal.SIGTERM)


@pytest.fixture
def edge_factory(tmp_path):
    edges = []

    def make(**env):
        e = Edge(tmp_path / f"edge{len(edges)}", env)
        edges.append(e)
        return e

    (tmp_path / "edge0").mkdir()
    (tmp_path / "edge1").mkdir()
    yield make
    for e in edges:
        e.stop()


def test_check_a_running_edge(edge_factory):
    if len(os.sched_getaffinity(0)) < 2 or not shutil.which("taskset"):
        pytest.skip("needs 2 PUs and taskset")
    edge = edge_factory(DISABLE_NUMA_BIND="")
    assert edge.report["binding"]["active"], edge.report
    url = f"http://127.0.0.1:{edge.port}"
    p = vigil("topo", "--check", url)
    assert p.returncode == 0, describe(p)
    assert "verdict: match" in p.stdout
    for t in edge.report["threads"]:
        assert t["name"] in p.stdout
        assert sorted(os.sched_getaffinity(t["tid"])) == t["cpus"], t
    assert vigil("topo", "--check", edge.state).returncode == 0  # the state dir's placement.json

    # Someone moves the decode thread: the check says so and fails.
    dec = next(t for t in edge.report["threads"] if t["role"] == "decode")
    subprocess.run(["taskset", "-p", "-c", str(dec["cpus"][0]), str(dec["tid"])], check=True, capture_output=True)
    p = vigil("topo", "--check", url)
    assert p.returncode == 1, describe(p)
    assert "MISMATCH" in p.stdout and "verdict: MISMATCH: 1 of" in p.stdout


def test_check_with_binding_disabled(edge_factory):
    edge = edge_factory(DISABLE_NUMA_BIND="1")
    assert not edge.report["binding"]["active"]
    p = vigil("topo", "--check", f"http://127.0.0.1:{edge.port}")
    assert p.returncode == 0, describe(p)
    assert "binding is off (disabled by DISABLE_NUMA_BIND=1)" in p.stdout
    assert "unbound" in p.stdout and "MISMATCH" not in p.stdout


def test_check_of_nothing_is_an_error(tmp_path):
    p = vigil("topo", "--check", f"http://127.0.0.1:{free_port()}")
    assert p.returncode == 2 and "/api/placement" in p.stderr, describe(p)
    p = vigil("topo", "--check", tmp_path)
    assert p.returncode == 2 and "placement.json" in p.stderr, describe(p)


def test_bench_placement_runs_and_says_what_it_skips():
    p = vigil("bench", "placement", "--frames", "1", "--size", "640x480", "--iters", "3", "--warmup", "1", "--json")
    assert p.returncode == 0, describe(p)
    j = json.loads(p.stdout)
    assert j["bytes"] == 640 * 480 * 3
    measured = [r for r in j["host_memcpy"] if "gbps" in r]
    assert measured[0]["source"].startswith("pageable") and all(r["gbps"] > 0 for r in measured)
    assert any(r["node"] == j["home_node"] for r in measured), "a buffer bound to the thread's own node"
    if len(j["numa_nodes"]) == 1:
        assert any(r.get("not_measured") == "this machine has one NUMA node" for r in j["host_memcpy"])
    d = j["host_to_device"]
    assert d["rows"] or d["note"], "the device part either measured or said why not"
