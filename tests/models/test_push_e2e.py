"""Events pushed to the plant's systems (issue 18), end to end: `vigil aggregator` with a webhook push sink,
`vigil edge` on the first 200 frames of vtest.avi (an event for every frame with a person), and an HTTP endpoint in
this test standing in for the MES.

- The endpoint answers 500 to its first requests, then 2xx; the aggregator is SIGKILLed mid-run and restarted:
  every stored event's key reaches the endpoint with a 2xx (at least once; each accepted exactly once here, the
  endpoint de-duplicating by Idempotency-Key as a receiver should), the retries are counted, and nothing is left
  in the outbox.
- An endpoint that always answers 500, max_attempts 2: every event ends in the dead letters, listed by
  /api/dead_letters and counted by vigil_aggregator_push_total{result="dead"}; once it is fixed, POST
  /api/dead_letters/replay sends them all again.
- MQTT: a mosquitto broker started here (persistence on) is stopped and restarted mid-run, then the aggregator is
  SIGKILLed and restarted: a consumer with a persistent session gets every stored event's key.
Needs: VIGIL_BIN, the int8 YOLOv8n in VIGIL_SHARED_MODELS, vtest.avi (test_edge_e2e's fixture).
"""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edge_harness import Aggregator, engine, free_port, metric, parse_metrics, query  # noqa: F401 (fixture)
from test_standby_e2e import wait_for
from test_edge_e2e import (FRAMES, assert_accounted_once, kill_aggregator_mid_run, start_edge, vtest200,  # noqa: F401
                           wait_edge, write_edge_config)


class Endpoint:
    """An HTTP endpoint on 127.0.0.1: answers `fail_first` POSTs with 500 (all of them when fail_first < 0), then
    200; records every request's Idempotency-Key and what it answered."""

    def __init__(self, fail_first: int):
        self.lock = threading.Lock()
        self.requests: list[tuple[str, int, dict]] = []  # (key, status, body)
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    failing = outer.fail_first < 0 or len(outer.requests) < outer.fail_first
                    status = 500 if failing else 200
                    outer.requests.append((self.headers["Idempotency-Key"], status, body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted(self) -> list[str]:
        with self.lock:
            return [k for k, status, _ in self.requests if status == 200]

    def close(self):
        self.server.shutdown()


def push_config(url: str, max_attempts: int = 20, initial_ms: int = 50, max_ms: int = 400) -> str:
    return (f"push:\n  - name: mes\n    webhook: {{url: '{url}', timeout_ms: 2000}}\n"
            f"    route: {{classes: [person]}}\n"
            f"    retry: {{initial_ms: {initial_ms}, max_ms: {max_ms}, max_attempts: {max_attempts}}}\n")


def event_keys(db: Path) -> set[str]:
    return {f"{e}/{s}/{r}/{q}" for e, s, r, q in query(
        db, "SELECT s.edge, s.stream, e.run, e.seq FROM events e JOIN streams s ON s.id = e.stream_id")}


def scrape(port: int) -> dict:
    return parse_metrics(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())


def test_a_webhook_that_fails_then_recovers_gets_every_event_across_an_aggregator_kill(vtest200, tmp_path, engine):
    endpoint = Endpoint(fail_first=8)
    port = free_port()
    agg = Aggregator(tmp_path, port, push_config(f"http://127.0.0.1:{endpoint.port}/vigil/events"), pg=engine)
    agg.start()
    edge = start_edge(write_edge_config(tmp_path, port, vtest200, False), tmp_path)
    try:
        kill_aggregator_mid_run(agg, edge)  # SIGKILL once 40 frames are stored, restart a second later
        wait_edge(edge, tmp_path)
        keys = event_keys(agg.db)
        assert len(keys) > 20, f"only {len(keys)} events: the clip should have a person in most frames"
        wait_for(lambda: keys <= set(endpoint.accepted()), 60, "every event accepted by the endpoint")
        m = scrape(agg.http_port)
        wait_for(lambda: metric(scrape(agg.http_port), "vigil_aggregator_push_outbox_depth", sink="mes") == 0, 30,
                 "an empty outbox")
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
        endpoint.close()
    assert_accounted_once(agg.db, "vtest", FRAMES)
    accepted = endpoint.accepted()
    assert set(accepted) == keys, "an event the aggregator never stored was pushed"
    repeats = len(accepted) - len(set(accepted))  # a delivery the SIGKILL cut before its row was deleted
    assert repeats <= 2, f"{repeats} events accepted twice: more than the kill can explain"
    with endpoint.lock:
        failed = [k for k, status, _ in endpoint.requests if status == 500]
        bodies = {k: b for k, status, b in endpoint.requests if status == 200}
    assert len(failed) == 8
    # After the restart the counters start again: the retries before the kill are in the log, not the metric.
    assert metric(m, "vigil_aggregator_push_total", sink="mes", result="delivered") >= 1
    some = next(iter(keys))
    assert bodies[some]["key"] == some
    assert bodies[some]["detections"] and all(d["label"] == "person" for d in bodies[some]["detections"])
    assert query(agg.db, "SELECT COUNT(*) FROM push_outbox")[0][0] == 0
    assert query(agg.db, "SELECT COUNT(*) FROM push_dead_letters")[0][0] == 0
    print(f"push: {len(keys)} events, {len(accepted)} accepted ({repeats} again after the kill), {len(failed)} "
          f"answered 500 first")


def test_with_confirmation_the_pager_gets_only_confirmed_events_across_an_aggregator_kill(vtest200, tmp_path, engine):
    """Confirmation (issue 20) on the real pipeline: people walking in vtest are tracked at the aggregator; a sink
    `on: confirmed` (the pager) gets exactly the events confirmed, a sink `on: stored` (the MES) every event; the
    aggregator is SIGKILLed mid-run (its pending events resumed from the store) and nothing stays pending once the
    stream is silent for idle_s."""
    mes, pager, once = Endpoint(fail_first=0), Endpoint(fail_first=0), Endpoint(fail_first=0)
    port = free_port()
    extra = (f"push:\n  - name: mes\n    webhook: {{url: 'http://127.0.0.1:{mes.port}/mes'}}\n"
             f"  - name: pager\n    webhook: {{url: 'http://127.0.0.1:{pager.port}/page'}}\n"
             f"    route: {{classes: [person]}}\n    on: confirmed\n"
             f"  - name: once\n    webhook: {{url: 'http://127.0.0.1:{once.port}/once'}}\n"
             f"    on: confirmed\n    once_per_track: true\n"
             f"confirm:\n  rules: {{k: 3, m: 5, min_duration_s: 0.2}}\n  idle_s: 1\n")
    agg = Aggregator(tmp_path, port, extra, pg=engine)
    agg.start()
    edge = start_edge(write_edge_config(tmp_path, port, vtest200, False), tmp_path)
    try:
        kill_aggregator_mid_run(agg, edge)
        wait_edge(edge, tmp_path)
        wait_for(lambda: query(agg.db, "SELECT COUNT(*) FROM events WHERE state = 'pending'")[0][0] == 0, 30,
                 "every pending event decided once the stream went silent")
        states = dict(query(agg.db, "SELECT state, COUNT(*) FROM events GROUP BY state"))
        keys = event_keys(agg.db)
        confirmed = {f"{e}/{s}/{r}/{q}" for e, s, r, q in query(
            agg.db, "SELECT s.edge, s.stream, e.run, e.seq FROM events e JOIN streams s ON s.id = e.stream_id "
                    "WHERE e.state = 'confirmed'")}
        wait_for(lambda: keys <= set(mes.accepted()) and confirmed <= set(pager.accepted()), 60,
                 "every event at the MES, every confirmed one at the pager")
        time.sleep(0.5)  # nothing more may arrive
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
        mes.close()
        pager.close()
        once.close()
    assert_accounted_once(agg.db, "vtest", FRAMES)
    assert len(keys) > 20, f"only {len(keys)} events"
    assert states.get("confirmed", 0) > len(keys) // 2, f"people walk through most of the clip: {states}"
    assert set(pager.accepted()) == confirmed, "the pager got an event that was not confirmed (or missed one)"
    assert set(mes.accepted()) == keys
    # once_per_track: one alert per object followed — as many as the tracks that confirmed an event (each at most
    # once; the aggregator's kill may have rebuilt a track under a new id, which alerts once more).
    with once.lock:
        bodies = [b for _, status, b in once.requests if status == 200]
    first_tracks = [{d["track_id"] for d in b["detections"] if d["track_id"] > 0} for b in bodies]
    assert all(first_tracks), "an alert without a track"
    confirmed_tracks = {t for (t,) in query(
        agg.db, "SELECT DISTINCT d.track_id FROM detections d JOIN events e ON e.id = d.event_id "
                "WHERE e.state = 'confirmed' AND d.track_id > 0")}
    assert 0 < len(bodies) <= len(confirmed_tracks), (len(bodies), len(confirmed_tracks))
    # Each alert is the first event its confirming track (named first in the reason) confirmed: never one twice.
    confirming = [int(b["state_reason"].split(" ")[1]) for b in bodies]
    assert len(set(confirming)) == len(confirming), f"a track alerted twice: {sorted(confirming)}"
    assert len(bodies) < len(confirmed) // 3, f"{len(bodies)} alerts for {len(confirmed)} confirmed frames"
    tracked = query(agg.db, "SELECT COUNT(DISTINCT d.event_id) FROM detections d JOIN events e ON e.id = d.event_id "
                            "WHERE e.state = 'confirmed' AND d.track_id > 0")[0][0]
    assert tracked >= len(confirmed) - 5, f"{tracked} of {len(confirmed)} confirmed events carry a track id"
    with pager.lock:
        body = next(b for _, status, b in pager.requests if status == 200)
    assert body["state"] == "confirmed" and body["state_reason"].startswith("track "), body["state_reason"]
    print(f"confirmation: {len(keys)} events, states {states}, {len(confirmed)} paged, {len(bodies)} alerts once per "
          f"track ({len(confirmed_tracks)} tracks confirmed)")


def test_a_webhook_that_never_recovers_fills_the_dead_letters_and_a_replay_sends_them(vtest200, tmp_path):
    endpoint = Endpoint(fail_first=-1)
    port = free_port()
    # A sink that fails pauses (one probe per backoff step): short steps, so 2 attempts of 200 events take seconds.
    agg = Aggregator(tmp_path, port, push_config(f"http://127.0.0.1:{endpoint.port}/hook", max_attempts=2,
                                                 initial_ms=5, max_ms=10))
    agg.start()
    edge = start_edge(write_edge_config(tmp_path, port, vtest200, False), tmp_path)
    try:
        wait_edge(edge, tmp_path)
        keys = event_keys(agg.db)
        assert keys
        wait_for(lambda: query(agg.db, "SELECT COUNT(*) FROM push_dead_letters")[0][0] == len(keys), 60,
                 "every event in the dead letters")
        m = scrape(agg.http_port)
        letters = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{agg.http_port}/api/dead_letters?sink=mes&limit=10000", timeout=10).read())
        # The endpoint fixed: the dead letters are replayed and every event goes through.
        with endpoint.lock:
            endpoint.fail_first = 0
        replay = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{agg.http_port}/api/dead_letters/replay?sink=mes", method="POST"), timeout=10).read())
        assert replay == {"sink": "mes", "replayed": len(keys)}
        wait_for(lambda: keys <= set(endpoint.accepted()), 60, "every replayed event accepted")
        assert query(agg.db, "SELECT COUNT(*) FROM push_dead_letters")[0][0] == 0
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
        endpoint.close()
    assert metric(m, "vigil_aggregator_push_total", sink="mes", result="dead") == len(keys)
    assert metric(m, "vigil_aggregator_push_total", sink="mes", result="retried") == len(keys)  # attempt 1 of 2
    assert metric(m, "vigil_aggregator_push_total", sink="mes", result="delivered") == 0
    assert metric(m, "vigil_aggregator_push_outbox_depth", sink="mes") == 0
    got = {l["event"]["key"] for l in letters["dead_letters"]}
    assert got == keys
    assert all(l["attempts"] == 2 and l["last_error"] == "HTTP 500" and l["sink"] == "mes"
               for l in letters["dead_letters"])
    with endpoint.lock:
        assert len(endpoint.requests) == 3 * len(keys), "each event tried max_attempts times, then once replayed"


class Mosquitto:
    """A mosquitto broker on 127.0.0.1:`port` with persistence in `dir` (sessions and queued messages survive a
    restart), started and stopped by this test."""

    def __init__(self, d: Path, port: int):
        self.port = port
        d.mkdir(parents=True, exist_ok=True)
        self.conf = d / "mosquitto.conf"
        self.conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                             f"persistence_location {d}/\nautosave_interval 1\n")
        self.log = open(d / "mosquitto.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["mosquitto", "-c", str(self.conf)], stdout=self.log, stderr=self.log)
        wait_for(self._listening, 20, "mosquitto to listen")

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


def test_mqtt_consumers_get_every_event_across_a_broker_restart_and_an_aggregator_kill(vtest200, tmp_path, engine):
    """QoS 1 to a broker that is stopped (SIGTERM, persistence on) and restarted mid-run, and an aggregator SIGKILLed
    and restarted later: a consumer with a persistent session (mosquitto_sub -c) gets every stored event's key at
    least once on <prefix>/<edge>/<stream>/person, none missing."""
    if not shutil.which("mosquitto") or not shutil.which("mosquitto_sub"):
        pytest.skip("mosquitto / mosquitto_sub not installed (Debian mosquitto, mosquitto-clients)")
    broker = Mosquitto(tmp_path / "broker", free_port())
    broker.start()
    received = tmp_path / "received.txt"

    def subscribe():
        return subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-c", "-i",
                                 "plant-consumer", "-t", "plant/+/+/person", "-v"],
                                stdout=open(received, "ab"), stderr=subprocess.DEVNULL)
    sub = subscribe()
    time.sleep(0.5)
    port = free_port()
    agg = Aggregator(tmp_path, port, f"push:\n  - name: plant\n    mqtt: {{broker: 127.0.0.1:{broker.port}, "
                                     f"topic_prefix: plant, timeout_ms: 1000}}\n"
                                     f"    retry: {{initial_ms: 100, max_ms: 500, max_attempts: 1000}}\n", pg=engine)
    agg.start()
    edge = start_edge(write_edge_config(tmp_path, port, vtest200, False), tmp_path)
    try:
        wait_for(lambda: stored(agg.db) >= 40, 120, "40 frames stored")
        broker.stop()  # persistence on: the consumer's session and its queued messages survive
        time.sleep(1.5)
        broker.start()
        if sub.poll() is not None:  # mosquitto_sub ends when its broker goes; the consumer comes back
            sub = subscribe()
        wait_for(lambda: stored(agg.db) >= 100, 120, "100 frames stored")
        agg.kill()  # SIGKILL: what the outbox holds goes out after the restart
        time.sleep(1.0)
        agg.start()
        wait_edge(edge, tmp_path)
        keys = event_keys(agg.db)
        wait_for(lambda: keys <= keys_received(received), 120, "every event key at the consumer")
    finally:
        if edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
        sub.kill()
        broker.stop()
    assert_accounted_once(agg.db, "vtest", FRAMES)
    got = keys_received(received)
    assert got == keys, f"keys the aggregator never stored: {sorted(got - keys)[:5]}"
    assert query(agg.db, "SELECT COUNT(*) FROM push_dead_letters")[0][0] == 0
    print(f"mqtt: {len(keys)} events, every key at the consumer across a broker restart and an aggregator kill")


def stored(db: Path) -> int:
    from edge_harness import stored_frames
    return stored_frames(db, "vtest")


def keys_received(path: Path) -> set[str]:
    out = set()
    for line in path.read_text(errors="replace").splitlines():
        topic, _, payload = line.partition(" ")
        try:
            out.add(json.loads(payload)["key"])
        except (ValueError, KeyError):
            pass  # a line cut by a kill
    return out


def test_an_unreachable_database_and_an_unknown_key_are_named_at_start(tmp_path):
    """`vigil aggregator` refuses to start: exit 1 naming the database it cannot reach (its password hidden), exit 2
    naming a misspelt key with its line."""
    from common import vigil_bin
    from edge_harness import write_keys
    keys = write_keys(tmp_path / "keys.yaml")
    dead = free_port()
    cfg = tmp_path / "agg.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{free_port()}\nhttp: 127.0.0.1:{free_port()}\nauth: {{keys_file: {keys}}}\n"
                   f"db: 'postgresql://vigil:s3cret@127.0.0.1:{dead}/plant'\n")
    r = subprocess.run([vigil_bin(), "aggregator", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"postgresql postgresql://vigil:***@127.0.0.1:{dead}/plant: cannot connect (writer connection)" in r.stderr
    assert "s3cret" not in r.stderr + r.stdout
    cfg.write_text(f"auth: {{keys_file: {keys}}}\ndb: agg.db\nretention: {{max_age_hour: 5}}\n")
    r = subprocess.run([vigil_bin(), "aggregator", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "retention.max_age_hour" in r.stderr and ":3:" in r.stderr, r.stderr
