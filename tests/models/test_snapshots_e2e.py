"""Snapshots end to end (issue 19): `vigil edge` with `snapshots: {crops: true, ...}` on the first 200 frames of
vtest.avi sends each event's pictures (the frame downscaled, a crop per box) beside its report; `vigil aggregator`
stores them (SQLite and PostgreSQL) and serves them.

- Accounting: every event the aggregator stored has its pictures — the frame and one crop per detection — or the
  edge counted why not (vigil_edge_snapshots_total{result}); the aggregator stored exactly the pictures the
  edge sent (vigil_aggregator_snapshots_total{result="stored"} = the edge's "sent").
- Content, on the real frames: the edge saves each processed frame as decoded (save_frames); a stored frame
  picture decodes to the frame downscaled (mean absolute difference of an area-downscaled source small), and
  each crop shows its box's region (the box grown by the margin, clipped to the frame).
- The API: /api/events/{id}/snapshots lists them; snapshot.jpg?boxes=1 differs from the picture as stored only
  around the boxes; /api/streams/snapshot.jpg is the stream's newest frame picture.
Needs what test_edge_e2e needs, OpenCV's Python module (the test virtualenv: a hard import, never a skip) and, for
the PostgreSQL case, VIGIL_TEST_POSTGRES.
"""
from __future__ import annotations

import json
import signal
import urllib.request

import cv2  # Debian's python3-opencv, which scripts/test-venv.sh requires
import numpy as np

from edge_harness import Aggregator, engine, free_port, query, read_metrics  # noqa: F401 (fixture)
from test_edge_e2e import start_edge, vtest200, wait_edge, write_edge_config  # noqa: F401 (fixture)

MARGIN = 0.15


def get(port: int, path: str) -> tuple[int, bytes, dict]:
    try:
        r = urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
        return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def decode(jpeg: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None, "not a JPEG"
    return img


def test_every_event_has_its_pictures_and_they_show_the_frame_and_its_boxes(vtest200, tmp_path, engine):
    agg = Aggregator(tmp_path, free_port(), pg=engine)
    agg.start()
    try:
        cfg = write_edge_config(tmp_path, agg.port, vtest200, False, save_frames=True,
                                snapshots="{crops: true, max_width: 320, crop_max_side: 160, quality: 90}")
        edge = start_edge(cfg, tmp_path)
        wait_edge(edge, tmp_path)
        db = agg.db
        events = json.loads(get(agg.http_port, "/api/events?limit=10000")[1])["events"]
        assert len(events) > 20, f"only {len(events)} events"
        m = read_metrics(tmp_path / "edge.prom")
        outcome = {dict(k[1])["result"]: v for k, v in m.items() if k[0] == "vigil_edge_snapshots_total"}
        sent = outcome.get("sent", 0)
        assert outcome.get("encode_error", 0) == 0 and outcome.get("too_large", 0) == 0, outcome
        assert outcome.get("refused", 0) == 0, outcome
        # What the edge sent is what the aggregator stored (none duplicated, none lost on loopback).
        (stored,) = query(db, "SELECT COUNT(*) FROM snapshots")[0]
        assert stored == sent, f"aggregator stored {stored} pictures, the edge sent {sent}"
        agg_m = urllib.request.urlopen(f"http://127.0.0.1:{agg.http_port}/metrics", timeout=10).read().decode()
        assert f'vigil_aggregator_snapshots_total{{result="stored"}} {stored}' in agg_m
        # Every event: its frame and a crop per detection, or counted as skipped for a full queue.
        without = [e for e in events if e["snapshots"] == 0]
        assert len(without) == outcome.get("queue_full", 0), (len(without), outcome)
        with_pictures = [e for e in events if e["snapshots"] > 0]
        assert len(with_pictures) >= len(events) * 0.9, f"{len(without)} of {len(events)} events without pictures"
        for e in with_pictures:
            assert e["snapshots"] == 1 + len(e["detections"]), e

        frames_dir = tmp_path / "frames" / "vtest"
        for e in with_pictures[:: max(1, len(with_pictures) // 12)]:  # a dozen events over the run
            src = np.load(frames_dir / f"{e['seq']:06d}.npy")
            h, w = src.shape[:2]
            listing = json.loads(get(agg.http_port, f"/api/events/{e['id']}/snapshots")[1])["snapshots"]
            assert [p["box"] for p in listing] == list(range(-1, len(e["detections"])))
            frame = listing[0]
            assert frame["region"] == [0, 0, w, h] and frame["width"] == 320
            status, jpeg, headers = get(agg.http_port, frame["url"])
            assert status == 200 and headers["Content-Type"] == "image/jpeg"
            pic = decode(jpeg)
            assert pic.shape == (frame["height"], 320, 3) and frame["height"] == round(h * 320 / w)
            want = cv2.resize(src, (320, frame["height"]), interpolation=cv2.INTER_AREA)
            diff = np.abs(pic.astype(int) - want.astype(int)).mean()
            assert diff < 4, f"event {e['id']}: the frame picture differs from the frame by {diff:.1f} on average"
            # Boxes drawn on request: the picture changes, near the boxes only.
            status, drawn_jpeg, _ = get(agg.http_port, frame["url"] + "&boxes=1")
            assert status == 200
            drawn = decode(drawn_jpeg).astype(int)
            changed = np.abs(drawn - pic.astype(int)).max(axis=2) > 60
            assert changed.any(), "no box drawn"
            near = np.zeros(changed.shape, bool)
            s = 320 / w
            for d in e["detections"]:
                x1, y1, x2, y2 = (int(v * s) for v in d["box"])
                # The box, its label (above it, or inside at the top edge: ~8 px a character at this size) and the
                # JPEG blocks (16 px) around both, which re-encoding disturbs.
                label = 8 * len(f"{d['label']} 0.00")
                near[max(0, y1 - 32):y2 + 16, max(0, x1 - 16):max(x2, x1 + label) + 16] = True
            far = changed & ~near
            assert not far.any(), f"event {e['id']}: pixels changed away from every box at {np.argwhere(far)[:5]}"
            # Each crop shows its box's region: the box grown by the margin, clipped to the frame.
            for p, d in zip(listing[1:], e["detections"]):
                x1, y1, x2, y2 = d["box"]
                bw, bh = x2 - x1, y2 - y1
                rx0 = max(0, int(np.floor(x1 - MARGIN * bw)))
                ry0 = max(0, int(np.floor(y1 - MARGIN * bh)))
                rx1 = min(w, int(np.ceil(x2 + MARGIN * bw)))
                ry1 = min(h, int(np.ceil(y2 + MARGIN * bh)))
                assert p["region"] == [rx0, ry0, rx1 - rx0, ry1 - ry0], (p, d)
                crop = decode(get(agg.http_port, p["url"])[1])
                want = cv2.resize(src[ry0:ry1, rx0:rx1], (crop.shape[1], crop.shape[0]), interpolation=cv2.INTER_AREA)
                assert max(crop.shape[:2]) <= 160
                diff = np.abs(crop.astype(int) - want.astype(int)).mean()
                assert diff < 6, f"event {e['id']} box {p['box']}: crop differs by {diff:.1f}"

        # The stream's newest frame picture.
        status, jpeg, headers = get(agg.http_port, "/api/streams/snapshot.jpg?edge=e2e-edge&stream=vtest")
        assert status == 200
        newest = max(with_pictures, key=lambda e: e["seq"])
        assert headers["X-Vigil-Frame"] == f"{newest['run']}/{newest['seq']}"
        # With boxes: its event found by its frame, the boxes drawn (the picture changes).
        status, drawn, _ = get(agg.http_port, "/api/streams/snapshot.jpg?edge=e2e-edge&stream=vtest&boxes=1")
        assert status == 200
        assert (np.abs(decode(drawn).astype(int) - decode(jpeg).astype(int)).max(axis=2) > 60).any(), "no box drawn"
        status, body, _ = get(agg.http_port, "/api/streams/snapshot.jpg?edge=e2e-edge&stream=nothing")
        assert status == 404 and "no snapshot stored" in json.loads(body)["error"]
        # Errors name what is wrong, as JSON.
        for path, code, text in (("/api/events/abc/snapshots", 400, "'abc' is not an event id"),
                                 ("/api/events/-5/snapshot.jpg", 400, "'-5' is not an event id"),
                                 (f"/api/events/{newest['id']}/snapshot.jpg?box=99", 404, "no crop of box 99"),
                                 (f"/api/events/{newest['id']}/snapshot.jpg?boxes=2", 400, "boxes"),
                                 ("/api/events/999999/snapshots", 404, "no such event")):
            status, body, _ = get(agg.http_port, path)
            assert status == code and text in json.loads(body)["error"], (path, status, body)
    finally:
        agg.kill(signal.SIGTERM)
