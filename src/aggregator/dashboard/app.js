// vigil's dashboard: the aggregator's API (bearer token) and its live channel (/api/events/live, Server-Sent
// Events read with fetch so the token travels in a header). No framework, no build step.
"use strict";

const vigil = {
  token: sessionStorage.getItem("vigil-token") || "",
  liveReceived: 0,      // events that came through the live channel (tests read it)
  decisionsReceived: 0, // decisions on pending events that came through it (confirm:)
  liveConnected: false,
  loadedAt: Date.now(), // a reload would change it
  newest: 0,            // the newest event id shown
  oldest: null,         // the oldest shown: the next page is before it
  filters: {},
  abort: null,
  pictures: {},         // "edge/stream" → {id, url}: the tile's picture (an object URL) and its event id
  progress: {},         // "edge/stream" → {frames, at}: when the stream's stored frames last grew (ms)
  picturesLoaded: 0,    // pictures decoded into tiles and the viewer (tests read it)
};
window.vigil = vigil;

const $ = (sel) => document.querySelector(sel);
const SIGN_IN = "sign in with the API token";
const MAX_ROWS = 500;  // the live list keeps the newest rows; older ones are a page away

async function api(path) {
  const res = await fetch(path, { headers: { Authorization: "Bearer " + vigil.token } });
  if (res.status === 401) throw Object.assign(new Error("the token was refused"), { status: 401 });
  if (!res.ok) throw new Error(path + ": HTTP " + res.status);
  return res.json();
}

// A picture of the API (the token travels in a header, so an <img> gets it as an object URL).
async function picture(path) {
  const res = await fetch(path, { headers: { Authorization: "Bearer " + vigil.token } });
  if (!res.ok) throw new Error(path + ": HTTP " + res.status);
  return URL.createObjectURL(await res.blob());
}

function image(url, alt, cls) {
  const img = document.createElement("img");
  img.alt = alt;
  if (cls) img.className = cls;
  img.addEventListener("load", () => vigil.picturesLoaded++);
  img.src = url;
  return img;
}

function showLogin(message) {
  vigil.token = "";
  sessionStorage.removeItem("vigil-token");
  if (vigil.abort) vigil.abort.abort();
  $("#app").hidden = true;
  $("#logout").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  $("#login-error").className = message && message !== SIGN_IN ? "error" : "";
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

// ---- Per-stream charts from /metrics (Prometheus text): FPS, frame→stored p99, drops ----

vigil.series = {};   // "edge/stream" → {fps: [], p99_ms: [], drops: []}, one sample per refresh, the last 60
vigil.lastScrape = null;

function parseMetrics(textBody) {
  const out = {};
  for (const line of textBody.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    (out[m[1]] ||= []).push({ labels, value: Number(m[3]) });
  }
  return out;
}

function perStream(metrics, name) {
  const out = {};
  for (const { labels, value } of metrics[name] || []) {
    if (labels.edge === undefined) continue;
    const k = labels.edge + "/" + labels.stream;
    if (name.endsWith("_bucket")) (out[k] ||= {})[labels.le] = value;
    else out[k] = value;
  }
  return out;
}

async function scrapeCharts() {
  const res = await fetch("/metrics", { headers: { Authorization: "Bearer " + vigil.token } });
  if (!res.ok) return;
  const m = parseMetrics(await res.text());
  const now = { t: performance.now() / 1000, frames: perStream(m, "vigil_aggregator_frames_total"),
                dropped: perStream(m, "vigil_aggregator_dropped_frames_total"),
                buckets: perStream(m, "vigil_aggregator_frame_to_stored_seconds_bucket") };
  const last = vigil.lastScrape;
  vigil.lastScrape = now;
  if (!last) return;
  const dt = now.t - last.t;
  for (const k of Object.keys(now.frames)) {
    const s = (vigil.series[k] ||= { fps: [], p99_ms: [], drops: [] });
    const push = (arr, v) => { arr.push(v); if (arr.length > 60) arr.shift(); };
    push(s.fps, ((now.frames[k] || 0) - (last.frames[k] || 0)) / dt);
    push(s.drops, ((now.dropped[k] || 0) - (last.dropped[k] || 0)) / dt);
    push(s.p99_ms, p99(now.buckets[k] || {}, last.buckets[k] || {}));
  }
}

// The 0.99 quantile's bucket bound (ms) of the frames stored between two scrapes; null without any.
function p99(now, before) {
  const bounds = Object.keys(now).map((le) => (le === "+Inf" ? Infinity : Number(le))).sort((a, b) => a - b);
  const at = (b) => { const k = b === Infinity ? "+Inf" : Object.keys(now).find((le) => Number(le) === b); return (now[k] || 0) - (before[k] || 0); };
  const total = at(Infinity);
  if (!(total > 0)) return null;
  for (const b of bounds) if (at(b) >= 0.99 * total) return b === Infinity ? null : b * 1000;
  return null;
}

function sparkline(label, values, unit) {
  const wrap = document.createElement("div");
  wrap.className = "chart";
  const shown = values.filter((v) => v !== null);
  const last = shown.length ? shown[shown.length - 1] : null;
  wrap.append(text("span", label + " " + (last === null ? "–" : (last < 10 ? last.toFixed(1) : Math.round(last)) + unit)));
  const c = document.createElement("canvas");
  c.width = 120;
  c.height = 24;
  const g = c.getContext("2d");
  const max = Math.max(1e-9, ...shown);
  g.strokeStyle = "#3b82f6";
  g.beginPath();
  values.forEach((v, i) => {
    const x = (i / Math.max(1, values.length - 1)) * (c.width - 2) + 1;
    const y = c.height - 2 - ((v === null ? 0 : v) / max) * (c.height - 4);
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.stroke();
  wrap.append(c);
  return wrap;
}

// ---- Stream tiles ----

async function refreshTiles() {
  const stats = await api("/api/stats");
  await scrapeCharts().catch(() => {});
  const connected = new Set(stats.edges.filter((e) => e.connected).map((e) => e.edge));
  const edges = Object.fromEntries(stats.edges.map((e) => [e.edge, e]));
  const latest = await api("/api/events?order=desc&limit=200");
  const lastOf = {};
  for (const e of latest.events) {
    const k = e.edge + "/" + e.stream;
    if (!lastOf[k]) lastOf[k] = e;
  }
  // Each tile's picture: the newest event of the stream that has one, with its boxes drawn (fetched once).
  for (const e of latest.events) {
    const k = e.edge + "/" + e.stream;
    if (e.snapshots > 0 && (!vigil.pictures[k] || vigil.pictures[k].id < e.id) && !vigil.pictures[k]?.pending) {
      const had = vigil.pictures[k];
      vigil.pictures[k] = { id: e.id, url: had ? had.url : null, pending: true };
      try {
        const url = await picture("/api/events/" + e.id + "/snapshot.jpg?boxes=1");
        if (had && had.url) URL.revokeObjectURL(had.url);
        vigil.pictures[k] = { id: e.id, url };
      } catch (err) {
        vigil.pictures[k] = had || null;
      }
    }
  }
  const now = Date.now();
  const tiles = $("#tiles");
  tiles.replaceChildren();
  for (const s of stats.streams) {
    const key = s.edge + "/" + s.stream;
    const seen = vigil.progress[key];
    if (!seen || seen.frames !== s.frames) vigil.progress[key] = { frames: s.frames, at: now };
    const quiet = (now - vigil.progress[key].at) / 1000;
    const up = connected.has(s.edge);
    // offline: its edge is not connected; else what the edge says its source does (reconnecting, ended, failed,
    // connecting), or live while frames arrive; stalled: streaming, yet no frame stored for 15 s.
    const source = s.source;
    const state = !up ? "offline"
      : ["reconnecting", "ended", "failed", "connecting", "stopped"].includes(source) ? source
      : seen && quiet >= 15 ? "stalled" : "live";
    const tile = document.createElement("div");
    tile.className = "tile " + state;
    tile.dataset.stream = key;
    tile.dataset.state = state;
    tile.append(text("div", key, "name"));
    const pic = vigil.pictures[key];
    if (pic && pic.url) {
      const img = image(pic.url, "latest snapshot of " + key, "snap");
      img.title = "event " + pic.id + " (click for its pictures)";
      img.addEventListener("click", () => openViewer(pic.id));
      tile.append(img);
    }
    const what = state === "stalled" ? "no frames for " + Math.round(quiet) + " s"
      : state === "offline" ? "edge offline" : state === "ended" ? "ended (end of input)" : state;
    tile.append(text("div", what + " · " + s.frames + " frames · " + s.events + " events", "meta state-" + state));
    tile.append(text("div", "dropped " + s.dropped + " · lost " + s.lost + " · missing " + s.missing, "meta"));
    const edge = edges[s.edge];
    if (edge) {  // its edge's session: epoch, link(s), and whether a standby took over (a promoted grant)
      const how = edge.links.length ? "over " + edge.links.join(", ") : "no session";
      const grant = edge.last_grant;
      const role = grant && (grant.kind === "replaced" || grant.kind === "promote")
        ? " · new instance (restart or standby takeover) " + fmtTime(grant.at_ns) : "";
      tile.append(text("div", "edge epoch " + edge.epoch + " · " + how + role, "meta edge-state"));
    }
    const last = lastOf[key];
    tile.append(text("div", last ? "latest: " + labels(last) + " at " + fmtTime(last.capture_ns) : "no event yet",
                     "latest"));
    const series = vigil.series[key];
    if (series) {
      const charts = document.createElement("div");
      charts.className = "charts";
      charts.append(sparkline("fps", series.fps, ""), sparkline("p99", series.p99_ms, " ms"),
                    sparkline("drops/s", series.drops, ""));
      tile.append(charts);
    }
    tiles.append(tile);
  }
}

// ---- The picture viewer: an event's frame (boxes drawn) and its crops ----

async function openViewer(id) {
  const list = await api("/api/events/" + id + "/snapshots");
  const body = $("#viewer-body");
  body.replaceChildren();
  $("#viewer-title").textContent = "event " + id;
  $("#viewer").hidden = false;
  if (!list.snapshots.length) {
    body.append(text("p", "No picture stored for this event (snapshots off for its stream, or not arrived yet).", "dim"));
    return;
  }
  for (const p of list.snapshots) {
    const url = await picture(p.url + (p.box < 0 ? "&boxes=1" : ""));
    const fig = document.createElement("figure");
    fig.append(image(url, p.box < 0 ? "frame" : "box " + p.box, p.box < 0 ? "frame" : "crop"),
               text("figcaption", p.box < 0 ? "frame " + p.width + "×" + p.height : "box " + p.box));
    body.append(fig);
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
  tr.dataset.key = e.key;
  if (fresh) tr.className = "new";
  tr.append(text("td", e.id), text("td", fmtTime(e.capture_ns)), text("td", e.edge + " / " + e.stream),
            text("td", e.seq), text("td", e.severity, "sev-" + e.severity), stateCell(e), text("td", e.rule),
            text("td", labels(e)));
  const td = document.createElement("td");
  const view = text("button", e.snapshots > 0 ? "view (" + e.snapshots + ")" : "view", "view");
  view.title = "the event's pictures";
  view.addEventListener("click", () => openViewer(e.id).catch((err) => console.warn(err)));
  td.append(view);
  tr.append(td);
  return tr;
}

// The event's state (confirm:), its reason on hover. Events of an aggregator older than confirmation have none.
function stateCell(e) {
  const td = text("td", e.state || "—", "state-" + (e.state || "none"));
  if (e.state_reason) td.title = e.state_reason;
  return td;
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
  if (f.state && e.state !== f.state) return false;
  if (f.class && !e.detections.some((d) => d.label === f.class)) return false;
  if (f.since_time && e.capture_ns / 1e9 < Number(f.since_time)) return false;
  return true;
}

async function loadEvents() {
  const page = await api(query({}));
  const body = $("#events tbody");
  body.replaceChildren(...page.events.map((e) => eventRow(e, false)));
  $("#no-events").hidden = page.events.length > 0;
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
  if (type === "state" && data) return onDecided(JSON.parse(data));
  if (type !== "event" || !data) return;
  const e = JSON.parse(data);
  vigil.liveReceived++;
  vigil.newest = Math.max(vigil.newest, e.id);
  if (!matches(e)) return;
  const body = $("#events tbody");
  body.prepend(eventRow(e, true));
  $("#no-events").hidden = true;
  if (body.rows.length > MAX_ROWS) {  // trimmed: the rest is a page away
    while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
    vigil.oldest = Number(body.rows[body.rows.length - 1].dataset.id);
    $("#older").hidden = false;
  }
}

// A pending event was decided (confirm:): its row's state changes where it is shown.
function onDecided(d) {
  vigil.decisionsReceived++;
  for (const tr of $("#events tbody").rows) {
    if (tr.dataset.key !== d.key) continue;
    const cell = tr.querySelector("td[class^='state-']");
    if (cell) cell.replaceWith(stateCell(d));
    tr.classList.add("decided");
  }
}

// ---- Start ----

async function start() {
  try {
    await refreshTiles();
  } catch (err) {
    if (err.status === 401) return showLogin(vigil.token ? "the token was refused" : SIGN_IN);
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
    state: f.get("state"),
    since_time: since ? String(new Date(since).getTime() / 1000) : "",
  };
  loadEvents().catch((err) => console.warn(err));
});
$("#older").addEventListener("click", () => loadOlder().catch((err) => console.warn(err)));
$("#viewer-close").addEventListener("click", () => {
  $("#viewer").hidden = true;
  for (const img of $("#viewer-body").querySelectorAll("img")) URL.revokeObjectURL(img.src);
  $("#viewer-body").replaceChildren();
});

// Without a token the API answers 401: the page asks for one (an aggregator without a token opens at once).
start();
