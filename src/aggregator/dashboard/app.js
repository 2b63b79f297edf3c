// vigil's dashboard: the aggregator's API (bearer token) and its live channel (/api/events/live, Server-Sent
// Events read with fetch so the token travels in a header). No framework, no build step.
"use strict";

const vigil = {
  token: sessionStorage.getItem("vigil-token") || "",
  liveReceived: 0,      // events that came through the live channel (tests read it)
  liveConnected: false,
  loadedAt: Date.now(), // a reload would change it
  newest: 0,            // the newest event id shown
  oldest: null,         // the oldest shown: the next page is before it
  filters: {},
  abort: null,
};
window.vigil = vigil;

const $ = (sel) => document.querySelector(sel);

async function api(path) {
  const res = await fetch(path, { headers: { Authorization: "Bearer " + vigil.token } });
  if (res.status === 401) throw Object.assign(new Error("the token was refused"), { status: 401 });
  if (!res.ok) throw new Error(path + ": HTTP " + res.status);
  return res.json();
}

function showLogin(message) {
  vigil.token = "";
  sessionStorage.removeItem("vigil-token");
  if (vigil.abort) vigil.abort.abort();
  $("#app").hidden = true;
  $("#logout").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  setLive(false);
}

function setLive(on) {
  vigil.liveConnected = on;
  const s = $("#live-state");
  s.textContent = on ? "live" : "offline";
  s.className = "state " + (on ? "on" : "off");
}

function fmtTime(ns) {
  return ns ? new Date(ns / 1e6).toLocaleString() : "";
}

function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
}

// ---- Stream tiles ----

async function refreshTiles() {
  const stats = await api("/api/stats");
  const connected = new Set(stats.edges.filter((e) => e.connected).map((e) => e.edge));
  const latest = await api("/api/events?order=desc&limit=200");
  const lastOf = {};
  for (const e of latest.events) {
    const k = e.edge + "/" + e.stream;
    if (!lastOf[k]) lastOf[k] = e;
  }
  const tiles = $("#tiles");
  tiles.replaceChildren();
  for (const s of stats.streams) {
    const key = s.edge + "/" + s.stream;
    const tile = document.createElement("div");
    tile.className = "tile " + (connected.has(s.edge) ? "live" : "idle");
    tile.dataset.stream = key;
    tile.append(text("div", key, "name"));
    tile.append(text("div", (connected.has(s.edge) ? "live" : "not connected") + " · " + s.frames + " frames · " +
                            s.events + " events", "meta"));
    tile.append(text("div", "dropped " + s.dropped + " · lost " + s.lost + " · missing " + s.missing, "meta"));
    const last = lastOf[key];
    tile.append(text("div", last ? "latest: " + labels(last) + " at " + fmtTime(last.capture_ns) : "no event yet",
                     "latest"));
    tiles.append(tile);
  }
}

function labels(e) {
  const n = {};
  for (const d of e.detections) n[d.label] = (n[d.label] || 0) + 1;
  return Object.entries(n).map(([l, c]) => (c > 1 ? c + "× " : "") + l).join(", ") || "—";
}

// ---- Events ----

function eventRow(e, fresh) {
  const tr = document.createElement("tr");
  tr.dataset.id = e.id;
  if (fresh) tr.className = "new";
  tr.append(text("td", e.id), text("td", fmtTime(e.capture_ns)), text("td", e.edge + " / " + e.stream),
            text("td", e.seq), text("td", e.severity, "sev-" + e.severity), text("td", e.rule),
            text("td", labels(e)));
  return tr;
}

function query(extra) {
  const p = new URLSearchParams({ order: "desc", limit: "50", ...extra });
  for (const [k, v] of Object.entries(vigil.filters)) if (v) p.set(k, v);
  return "/api/events?" + p.toString();
}

function matches(e) {
  const f = vigil.filters;
  if (f.edge && e.edge !== f.edge) return false;
  if (f.stream && e.stream !== f.stream) return false;
  if (f.severity && e.severity !== f.severity) return false;
  if (f.class && !e.detections.some((d) => d.label === f.class)) return false;
  if (f.since_time && e.capture_ns / 1e9 < Number(f.since_time)) return false;
  return true;
}

async function loadEvents() {
  const page = await api(query({}));
  const body = $("#events tbody");
  body.replaceChildren(...page.events.map((e) => eventRow(e, false)));
  vigil.newest = Math.max(vigil.newest, ...page.events.map((e) => e.id), 0);
  vigil.oldest = page.events.length ? page.next_before_seq : null;
  $("#older").hidden = page.events.length < 50;
}

async function loadOlder() {
  if (vigil.oldest === null) return;
  const page = await api(query({ before_seq: String(vigil.oldest) }));
  $("#events tbody").append(...page.events.map((e) => eventRow(e, false)));
  vigil.oldest = page.events.length ? page.next_before_seq : vigil.oldest;
  $("#older").hidden = page.events.length < 50;
}

// ---- The live channel ----

async function live() {
  vigil.abort = new AbortController();
  for (;;) {
    try {
      const res = await fetch("/api/events/live?since_seq=" + vigil.newest, {
        headers: { Authorization: "Bearer " + vigil.token, Accept: "text/event-stream" },
        signal: vigil.abort.signal,
      });
      if (res.status === 401) return showLogin("the token was refused");
      if (!res.ok) throw new Error("live channel: HTTP " + res.status);
      setLive(true);
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          onMessage(buf.slice(0, cut));
          buf = buf.slice(cut + 2);
        }
      }
    } catch (err) {
      if (vigil.abort.signal.aborted) return;
    }
    setLive(false);
    await new Promise((r) => setTimeout(r, 2000));  // reconnect, from the newest event seen
  }
}

function onMessage(block) {
  let type = "message", data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) type = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (type !== "event" || !data) return;
  const e = JSON.parse(data);
  vigil.liveReceived++;
  vigil.newest = Math.max(vigil.newest, e.id);
  if (matches(e)) $("#events tbody").prepend(eventRow(e, true));
}

// ---- Start ----

async function start() {
  try {
    await refreshTiles();
  } catch (err) {
    if (err.status === 401) return showLogin(vigil.token ? "the token was refused" : "sign in with the API token");
    return showLogin(String(err.message));
  }
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#logout").hidden = false;
  await loadEvents();
  live();
  setInterval(() => refreshTiles().catch(() => {}), 5000);
}

$("#login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  vigil.token = $("#token").value.trim();
  sessionStorage.setItem("vigil-token", vigil.token);
  start();
});
$("#logout").addEventListener("click", () => showLogin(""));
$("#filters").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const since = f.get("since");
  vigil.filters = {
    edge: f.get("edge"), stream: f.get("stream"), class: f.get("class"), severity: f.get("severity"),
    since_time: since ? String(new Date(since).getTime() / 1000) : "",
  };
  loadEvents().catch((err) => console.warn(err));
});
$("#older").addEventListener("click", () => loadOlder().catch((err) => console.warn(err)));

// Without a token the API answers 401: the page asks for one (an aggregator without a token opens at once).
start();
