"""`vigil bench transport` smoke test (issue 14): the tcp link at one size, with the JSON it writes.

The numbers themselves are measured in docs/benchmarks.md, never asserted; this checks that the command runs
its server process, measures every phase and reports positive values under the documented fields.
Needs: VIGIL_BIN.
"""
from __future__ import annotations

import json

import pytest

from common import describe, vigil


def test_tcp_one_size_reports_every_field(tmp_path):
    out = tmp_path / "out.json"
    p = vigil("bench", "transport", "--links", "tcp", "--sizes", "64", "--iters", "200", "--warmup", "20",
              "--stream-messages", "2000", "--opens", "20", "--json", out, timeout=120)
    assert p.returncode == 0, describe(p)
    assert "no storage" in p.stdout, "the table says the receiver only acks"
    j = json.loads(out.read_text())
    assert j["method"]["iters"] == 200 and j["method"]["window"] == 64
    assert len(j["links"]) == 1
    link = j["links"][0]
    assert link["link"] == "tcp" and "error" not in link, link
    assert len(link["sizes"]) == 1
    s = link["sizes"][0]
    # 64 B is below the smallest Report: sent as that one, 109 bytes, no detection, no padding.
    assert s["size"] == 64 and s["frame_bytes"] == 109 and s["detections"] == 0 and s["rule_bytes"] == 0, s
    lat = s["latency_us"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"], lat
    t = s["throughput"]
    assert t["messages"] == 2000 and t["seconds"] > 0 and t["messages_per_s"] > 0 and t["mib_per_s"] > 0, t
    cpu = s["cpu_us_per_message"]
    assert cpu["client"] > 0 and cpu["server"] > 0 and cpu["total"] == pytest.approx(cpu["client"] + cpu["server"]), cpu
    o = link["open_us"]
    assert o["opens"] == 20 and o["with_key"] > 0 and o["without_key"] > 0, o
    assert "tls_cost" not in j, "tls - tcp needs both links"


def test_sizes_are_exact_frames_and_bad_arguments_exit_2(tmp_path):
    out = tmp_path / "out.json"
    p = vigil("bench", "transport", "--links", "tcp", "--sizes", "1000", "--iters", "20", "--warmup", "0",
              "--stream-messages", "100", "--opens", "2", "--json", out, timeout=120)
    assert p.returncode == 0, describe(p)
    s = json.loads(out.read_text())["links"][0]["sizes"][0]
    # 109 bytes + 37 rows of 24 bytes + 3 bytes of rule = 1000.
    assert s["frame_bytes"] == 1000 and s["detections"] == 37 and s["rule_bytes"] == 3, s
    p = vigil("bench", "transport", "--links", "carrier-pigeon", timeout=60)
    assert p.returncode == 2 and "carrier-pigeon" in p.stderr, describe(p)
