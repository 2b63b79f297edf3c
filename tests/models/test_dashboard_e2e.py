"""The dashboard (issue 19) in headless Chromium: `vigil aggregator` with an API token serves it at `/`, `vigil
edge` runs the demo's video (the first 200 frames of vtest.avi, events for persons) after the page is open.

- Without the token the page shows only its sign-in form and says why; a wrong token is refused.
- With it: the stream's tile appears, and every event the aggregator stores reaches the page through the live
  channel (Server-Sent Events): counted by the page's own SSE reader (window.vigil.liveReceived), the page never
  reloaded (window.vigil.loadedAt unchanged), and the table's rows are exactly the stored events.
- The filters narrow the list through the API (class, severity); paging goes to older events.
- No JavaScript error or failed request in the browser's console; a screenshot is saved as a test artifact
  (VIGIL_TEST_ARTIFACTS, default <build>/test-artifacts).
Needs: Debian chromium, chromium-driver, python3-selenium (scripts/deps.sh test), and what test_edge_e2e needs.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from edge_harness import Aggregator, free_port
from test_edge_e2e import start_edge, vtest200, wait_edge, write_edge_config  # noqa: F401 (fixture)

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("chromium / chromium-driver not installed (scripts/deps.sh test)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def wait_until(what: str, cond, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def api(port: int, path: str, token: str):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def artifacts_dir() -> Path:
    d = Path(os.environ.get("VIGIL_TEST_ARTIFACTS", Path(os.environ.get("VIGIL_BIN", "build/src/vigil")).resolve()
                            .parent.parent / "test-artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_the_dashboard_needs_the_token_and_shows_every_event_live(vtest200, tmp_path):
    driver = browser()
    token = secrets.token_hex(20)
    (tmp_path / "api.token").write_text(token + "\n")
    port = free_port()
    agg = Aggregator(tmp_path, port, f"http_token_file: {tmp_path / 'api.token'}\n")
    agg.start()
    edge = None
    try:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select
        driver.get(f"http://127.0.0.1:{agg.http_port}/")
        js = driver.execute_script
        # No token: the sign-in form, nothing of the API.
        wait_until("the sign-in message", lambda: driver.find_element(By.ID, "login-error").text ==
                   "sign in with the API token")
        assert not driver.find_element(By.ID, "app").is_displayed()
        assert driver.find_elements(By.CSS_SELECTOR, ".tile") == []
        # A wrong token is refused.
        driver.find_element(By.ID, "token").send_keys("not-the-token-at-all")
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait_until("the refusal", lambda: driver.find_element(By.ID, "login-error").text == "the token was refused")
        assert not driver.find_element(By.ID, "app").is_displayed()
        # The token: the dashboard, its live channel open before any event exists.
        box = driver.find_element(By.ID, "token")
        box.clear()
        box.send_keys(token)
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait_until("the dashboard", lambda: driver.find_element(By.ID, "app").is_displayed())
        wait_until("the live channel", lambda: js("return window.vigil.liveConnected"))
        loaded_at = js("return window.vigil.loadedAt")

        edge = start_edge(write_edge_config(tmp_path, port, vtest200, False,
                                            snapshots="{crops: true, max_width: 480}"), tmp_path)
        wait_edge(edge, tmp_path)
        stored = api(agg.http_port, "/api/events?limit=10000", token)["events"]
        assert len(stored) > 20, f"only {len(stored)} events: the clip should have a person in most frames"
        wait_until(f"{len(stored)} events through the live channel",
                   lambda: js("return window.vigil.liveReceived") >= len(stored), 60)
        assert js("return window.vigil.liveReceived") == len(stored), "an event came twice"
        assert js("return window.vigil.loadedAt") == loaded_at, "the page was reloaded"
        rows = [int(r.get_attribute("data-id")) for r in driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")]
        assert sorted(rows) == sorted(e["id"] for e in stored), "the table's rows are not the stored events"
        assert rows == sorted(rows, reverse=True), "the newest event first"
        # The stream's tile (refreshed every 5 s).
        def tile_text():  # the tiles are redrawn on each refresh: find it again every time
            tiles = driver.find_elements(By.CSS_SELECTOR, '.tile[data-stream="e2e-edge/vtest"]')
            try:
                return tiles[0].text if tiles else ""
            except Exception:  # redrawn between the find and the read
                return ""
        text = wait_until("the vtest tile with its counts", lambda: (t := tile_text()) and "200 frames" in t and t, 20)
        assert f"{len(stored)} events" in text, text
        assert "person" in text, text

        # Its charts from /metrics: frames per second and the frame→stored p99 of the run (two scrapes at least).
        series = wait_until("the tile's charts", lambda: js(
            "const s = window.vigil.series['e2e-edge/vtest']; return s && s.fps.length >= 2 ? s : null"), 20)
        assert max(series["fps"]) > 0, series
        assert any(v is not None and v > 0 for v in series["p99_ms"]), series
        assert all(v == 0 for v in series["drops"]), series  # a file stream drops nothing
        wait_until("three sparklines", lambda: len(driver.find_elements(
            By.CSS_SELECTOR, '.tile[data-stream="e2e-edge/vtest"] canvas')) == 3, 10)

        # The tile's picture: the stream's newest event with pictures, boxes drawn, loaded (decoded) in the page.
        def tile_picture():
            return js("const i = document.querySelector('.tile[data-stream=\"e2e-edge/vtest\"] img.snap');"
                      "return i && i.complete && i.naturalWidth > 0 ? [i.naturalWidth, i.naturalHeight] : null")
        assert wait_until("the tile's picture", tile_picture, 20) == [480, 360]
        # The edge finished its file and left: the tile says so.
        assert wait_until("the tile's state", lambda: js(
            "const t = document.querySelector('.tile[data-stream=\"e2e-edge/vtest\"]');"
            "return t && t.dataset.state === 'offline' && t.textContent.includes('edge offline') &&"
            "t.textContent.includes('edge epoch 1 · no session')"), 20)
        # The viewer: the first row's event, its frame and a crop per detection.
        first = max(stored, key=lambda e: e["id"])
        n_pictures = len(api(agg.http_port, f"/api/events/{first['id']}/snapshots", token)["snapshots"])
        assert n_pictures == 1 + len(first["detections"]), (n_pictures, first)
        driver.find_element(By.CSS_SELECTOR, f'#events tbody tr[data-id="{first["id"]}"] button.view').click()
        wait_until("the viewer's pictures", lambda: js(
            "const imgs = [...document.querySelectorAll('#viewer-body img')];"
            f"return imgs.length === {n_pictures} && imgs.every((i) => i.complete && i.naturalWidth > 0)"), 20)
        assert driver.find_element(By.ID, "viewer").is_displayed()
        assert driver.find_element(By.CSS_SELECTOR, "#viewer-body img.frame").get_property("naturalWidth") == 480
        shot = artifacts_dir() / "dashboard-viewer.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        driver.find_element(By.ID, "viewer-close").click()
        assert not driver.find_element(By.ID, "viewer").is_displayed()

        shot = artifacts_dir() / "dashboard.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000

        # Filters go through the API: a class no event has empties the list; "person" with paging of 50.
        cls = driver.find_element(By.CSS_SELECTOR, "#filters input[name=class]")
        cls.send_keys("giraffe")
        driver.find_element(By.CSS_SELECTOR, "#filters button").click()
        wait_until("an empty list", lambda: driver.find_elements(By.CSS_SELECTOR, "#events tbody tr") == [])
        assert driver.find_element(By.ID, "no-events").is_displayed()
        cls.clear()
        cls.send_keys("person")
        driver.find_element(By.CSS_SELECTOR, "#filters button").click()
        wait_until("the first page", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")) ==
                   min(50, len(stored)))
        # No confirm: section: every event is stored confirmed, and the state column says so.
        assert len(driver.find_elements(By.CSS_SELECTOR, "#events tbody tr td.state-confirmed")) == min(50, len(stored))
        state = Select(driver.find_element(By.CSS_SELECTOR, "#filters select[name=state]"))
        state.select_by_visible_text("rejected")
        driver.find_element(By.CSS_SELECTOR, "#filters button").click()
        wait_until("no rejected events", lambda: driver.find_elements(By.CSS_SELECTOR, "#events tbody tr") == [])
        state.select_by_visible_text("any state")
        driver.find_element(By.CSS_SELECTOR, "#filters button").click()
        wait_until("the first page again", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")) ==
                   min(50, len(stored)))
        if len(stored) > 50:
            driver.find_element(By.ID, "older").click()
            wait_until("the second page", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")) ==
                       min(100, len(stored)))
            ids = [int(r.get_attribute("data-id")) for r in driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")]
            assert ids == sorted((e["id"] for e in stored), reverse=True)[:len(ids)], "pages overlap or skip"

        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        # The 401s of the sign-in steps are expected network errors; nothing else may fail (the favicon is a 204).
        unexpected = [e for e in severe if "401" not in e["message"]]
        assert unexpected == [], f"console errors: {unexpected}"
    finally:
        driver.quit()
        if edge is not None and edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)


def test_the_openapi_document_describes_the_api_as_served(tmp_path):
    """/ui/openapi.json (served without the token, like the page) lists every route; each answers as documented:
    401 without the token (but /healthz), 200 with it and the documented top-level fields; the event query's
    documented parameters are accepted and a bad value is a 400 naming it."""
    import http.client
    token = secrets.token_hex(20)
    (tmp_path / "api.token").write_text(token + "\n")
    agg = Aggregator(tmp_path, free_port(), f"http_token_file: {tmp_path / 'api.token'}\n")
    agg.start()
    try:
        base = f"http://127.0.0.1:{agg.http_port}"
        spec = json.loads(urllib.request.urlopen(base + "/ui/openapi.json", timeout=10).read())
        assert spec["openapi"].startswith("3.")
        assert set(spec["paths"]) == {"/healthz", "/metrics", "/api/stats", "/api/events", "/api/events/live",
                                      "/api/dead_letters", "/api/dead_letters/replay", "/api/events/{id}/snapshots",
                                      "/api/events/{id}/snapshot.jpg", "/api/streams/snapshot.jpg"}

        def call(method, path, with_token=True, timeout=10):
            c = http.client.HTTPConnection("127.0.0.1", agg.http_port, timeout=timeout)
            c.request(method, path, headers={"Authorization": f"Bearer {token}"} if with_token else {})
            r = c.getresponse()
            return r, c
        for path, ops in spec["paths"].items():
            for method, op in ops.items():
                secured = op.get("security", spec["security"]) != []
                required = [p for p in op.get("parameters", []) if p.get("required")]
                path = path.replace("{id}", "1")  # no event yet: a documented 404 below
                r, c = call(method.upper(), path, with_token=False)
                assert r.status == (401 if secured else 200), f"{method} {path} without a token: {r.status}"
                c.close()
                if path == "/api/dead_letters/replay":
                    continue  # needs a sink: below
                if required:  # an empty store, or required query parameters left out: a documented error
                    r, c = call(method.upper(), path)
                    assert str(r.status) in op["responses"] and r.status in (400, 404), f"{path}: {r.status}"
                    assert json.loads(r.read())["error"], path
                    c.close()
                    continue
                r, c = call(method.upper(), path)
                assert str(r.status) in op["responses"] and r.status == 200, f"{method} {path}: {r.status}"
                ctype = r.getheader("Content-Type")
                documented = op["responses"]["200"]["content"]
                assert any(ctype.startswith(t) for t in documented), f"{path}: {ctype} not in {list(documented)}"
                if ctype.startswith("application/json"):
                    body = json.loads(r.read())
                    props = documented["application/json"]["schema"].get("properties", {})
                    missing = [k for k in props if k not in body and not k.startswith("next_") and k != "error"]
                    assert missing == [], f"{path}: documented fields missing: {missing}"
                c.close()
        r, c = call("POST", "/api/dead_letters/replay?sink=nope")
        assert r.status == 400 and "nope" in json.loads(r.read())["error"]
        c.close()
        params = {p["name"] for p in spec["paths"]["/api/events"]["get"]["parameters"]}
        r, c = call("GET", "/api/events?" + "&".join(f"{p}=1" for p in params - {"order", "severity", "state"}) +
                    "&order=desc&severity=info&state=confirmed")
        assert r.status == 200, r.read()
        c.close()
        for bad, name in (("order=sideways", "order"), ("severity=loud", "severity"), ("limit=0", "limit"),
                          ("before_seq=x", "before_seq"), ("state=maybe", "state")):
            r, c = call("GET", "/api/events?" + bad)
            assert r.status == 400 and name in json.loads(r.read())["error"], bad
            c.close()
    finally:
        agg.kill(signal.SIGTERM)


def test_the_stats_say_what_each_source_does(vtest200, tmp_path):
    """The edge tells the aggregator what its sources do (SourceStates): a file that ended says "ended" while its
    edge is still connected, a camera that cannot be reached says "reconnecting" (the dashboard's tile states)."""
    from test_edge_e2e import write_edge_config as edge_config
    agg = Aggregator(tmp_path, free_port())
    agg.start()
    edge = None
    try:
        cfg = edge_config(tmp_path, agg.port, vtest200, False)
        dead = free_port()  # nothing listens there: the camera's connections are refused
        cfg.write_text(cfg.read_text() + f"  - id: gate\n    source: rtsp://127.0.0.1:{dead}/stream\n")
        edge = start_edge(cfg, tmp_path)

        def sources():
            stats = api(agg.http_port, "/api/stats", "")
            return {s["stream"]: s["source"] for s in stats["streams"]}
        try:
            wait_until("vtest ended and gate reconnecting",
                       lambda: sources().get("vtest") == "ended" and sources().get("gate") == "reconnecting", 60)
        except AssertionError:
            raise AssertionError(f"sources: {sources()}")
        stats = api(agg.http_port, "/api/stats", "")
        assert next(e for e in stats["edges"] if e["edge"] == "e2e-edge")["connected"]
        gate = next(st for st in stats["streams"] if st["stream"] == "gate")
        assert gate["frames"] == 0 and gate["runs"] == [], gate  # listed though it stored nothing
        # The dashboard's tiles say the same (no token configured: the page opens at once).
        driver = browser()
        try:
            driver.get(f"http://127.0.0.1:{agg.http_port}/")
            js = driver.execute_script
            states = wait_until("both tiles", lambda: js(
                "const t = [...document.querySelectorAll('.tile')].map((x) => [x.dataset.stream, x.dataset.state,"
                " x.textContent]); return t.length === 2 ? t : null"), 30)
            by = {k: (state, text) for k, state, text in states}
            assert by["e2e-edge/vtest"][0] == "ended" and "ended (end of input)" in by["e2e-edge/vtest"][1], by
            assert by["e2e-edge/gate"][0] == "reconnecting" and "reconnecting" in by["e2e-edge/gate"][1], by
            severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert severe == [], severe
        finally:
            driver.quit()
        edge.send_signal(signal.SIGTERM)
        assert edge.wait(timeout=60) == 0, (tmp_path / "edge.log").read_text()[-3000:]
    finally:
        if edge is not None and edge.poll() is None:
            edge.kill()
        agg.kill(signal.SIGTERM)
