#include "aggregator/http_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "aggregator/dashboard_assets.h"
#include "aggregator/picture_boxes.h"
#include "vigil/aggregator/push.h"

namespace vigil::aggregator {
namespace {

using nlohmann::json;

// Client-supplied text (edge ids, labels) may be invalid UTF-8: replace, never throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Parses an optional query parameter; *error names it when malformed.
bool ParamInt(const httplib::Request& req, const char* name, int64_t min, int64_t max, int64_t* out,
              std::string* error) {
  if (!req.has_param(name)) return true;
  const std::string v = req.get_param_value(name);
  int64_t x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < min || x > max) {
    *error = StrCat(name, ": '", v, "' is not an integer in [", min, ", ", max, "]");
    return false;
  }
  *out = x;
  return true;
}

void Error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(Dump({{"error", message}}), "application/json");
}

void SendPicture(httplib::Response& res, const StoredSnapshot& p, const StoredEvent* ev) {
  if (ev == nullptr) return res.set_content(p.jpeg, "image/jpeg");
  StatusOr<std::string> drawn = DrawEventBoxes(p, *ev);
  if (absl::IsUnimplemented(drawn.status())) return Error(res, 501, StrCat("boxes=1: ", drawn.status().message()));
  if (!drawn.ok()) return Error(res, 500, StrCat("drawing the boxes: ", drawn.status().message()));
  res.set_content(*drawn, "image/jpeg");
}

}  // namespace

HttpApi::HttpApi(HttpApiOptions options) : o_(std::move(options)) {}

void HttpApi::Register(httplib::Server& http) {
  http.Get("/healthz", [this](const httplib::Request& req, httplib::Response& res) { Healthz(req, res); });
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) { Metrics(req, res); });
  http.Get("/api/dead_letters", [this](const httplib::Request& req, httplib::Response& res) { DeadLetters(req, res); });
  // POST /api/dead_letters/replay?sink=NAME: the sink's dead letters go back into its outbox (after it was fixed).
  http.Post("/api/dead_letters/replay",
            [this](const httplib::Request& req, httplib::Response& res) { ReplayDeadLetters(req, res); });
  http.Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) { Events(req, res); });
  http.Get("/api/events/live", [this](const httplib::Request& req, httplib::Response& res) { LiveEvents(req, res); });
  http.Get(R"(/api/events/([^/]+)/snapshots)",
           [this](const httplib::Request& req, httplib::Response& res) { EventSnapshotList(req, res); });
  http.Get(R"(/api/events/([^/]+)/snapshot\.jpg)",
           [this](const httplib::Request& req, httplib::Response& res) { EventSnapshot(req, res); });
  http.Get("/api/streams/snapshot.jpg",
           [this](const httplib::Request& req, httplib::Response& res) { LatestStreamSnapshot(req, res); });
  // The dashboard's files (src/aggregator/dashboard/, compiled in: no build step, nothing fetched).
  // Browsers ask for a favicon on every page: an empty answer, not a refusal in the log.
  http.Get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
  for (size_t i = 0; i < kDashboardAssetCount; ++i) {
    const DashboardAsset& a = kDashboardAssets[i];
    const std::string path = std::string(a.path) == "/index.html" ? "/" : StrCat("/ui", a.path);
    http.Get(path, [path](const httplib::Request&, httplib::Response& res) { DashboardFile(path, res); });
  }
  http.Get("/api/stats", [this](const httplib::Request& req, httplib::Response& res) { Stats(req, res); });
}

bool HttpApi::DashboardFile(const std::string& path, httplib::Response& res) {
  for (size_t i = 0; i < kDashboardAssetCount; ++i) {
    const DashboardAsset& a = kDashboardAssets[i];
    if (path != (std::string(a.path) == "/index.html" ? "/" : StrCat("/ui", a.path))) continue;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'");
    res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.mime);
    return true;
  }
  return false;
}

void HttpApi::Healthz(const httplib::Request&, httplib::Response& res) const {
  const IngestHealth h = o_.ingest->Health();
  json j = {{"status", h.storage_error.empty() ? "ok" : "degraded"},
            {"db", o_.store->path()},
            {"db_engine", o_.store->engine()},
            {"schema_version", o_.store->schema_version()},
            {"edges_connected", h.edges_connected},
            {"queue_depth", h.queue_depth}};
  if (!h.storage_error.empty()) j["error"] = h.storage_error;
  res.status = j["status"] == "ok" ? 200 : 503;
  res.set_content(Dump(j), "application/json");
}

void HttpApi::Metrics(const httplib::Request&, httplib::Response& res) const {
  for (const std::string& sink : o_.push_sinks) {  // the outbox depth, read at the scrape
    if (StatusOr<uint64_t> depth = o_.store->PushDepth(sink); depth.ok()) {
      o_.registry->GetGauge("vigil_aggregator_push_outbox_depth", "Stored events waiting for a push sink",
                            {{"sink", sink}})
          .Set(static_cast<double>(*depth));
    }
  }
  res.set_content(o_.registry->Render(), metrics::Registry::kContentType);
}

void HttpApi::ReplayDeadLetters(const httplib::Request& req, httplib::Response& res) const {
  const std::string sink = req.get_param_value("sink");
  if (std::find(o_.push_sinks.begin(), o_.push_sinks.end(), sink) == o_.push_sinks.end()) {
    return Error(res, 400, StrCat("sink: '", sink, "' is not a push sink of this aggregator"));
  }
  StatusOr<uint64_t> n = o_.store->ReplayDeadLetters(sink, o_.clock->WallNs());
  if (!n.ok()) return Error(res, 500, std::string(n.status().message()));
  spdlog::info("aggregator: push sink '{}': {} dead letter(s) queued again", sink, *n);
  if (o_.wake_push) o_.wake_push(sink);
  res.set_content(Dump({{"sink", sink}, {"replayed", *n}}), "application/json");
}


void HttpApi::DeadLetters(const httplib::Request& req, httplib::Response& res) const {
  int64_t limit = 100;
  std::string error;
  if (!ParamInt(req, "limit", 1, 10000, &limit, &error)) return Error(res, 400, error);
  StatusOr<std::vector<DeadLetter>> letters = o_.store->DeadLetters(req.get_param_value("sink"), static_cast<int>(limit));
  if (!letters.ok()) return Error(res, 500, std::string(letters.status().message()));
  json list = json::array();
  for (const DeadLetter& l : *letters) {
    list.push_back({{"sink", l.sink},
                    {"attempts", l.attempts},
                    {"last_error", l.last_error},
                    {"dead_ns", l.dead_ns},
                    {"event", json::parse(EventJson(l.event))}});
  }
  res.set_content(Dump({{"dead_letters", std::move(list)}}), "application/json");
}

void HttpApi::Events(const httplib::Request& req, httplib::Response& res) const {
  EventQuery q;
  int64_t limit = 100;
  std::string error;
  if (!ParamInt(req, "since_seq", 0, INT64_MAX, &q.since_id, &error) ||
      !ParamInt(req, "before_seq", 1, INT64_MAX, &q.before_id, &error) ||
      !ParamInt(req, "limit", 1, 10000, &limit, &error)) {
    return Error(res, 400, error);
  }
  const std::string order = req.get_param_value("order");
  if (order != "" && order != "asc" && order != "desc") {
    return Error(res, 400, StrCat("order: '", order, "' is not asc or desc"));
  }
  q.newest_first = order == "desc";
  q.label = req.get_param_value("class");
  q.severity = req.get_param_value("severity");
  if (!q.severity.empty() && q.severity != "none" && q.severity != "info" && q.severity != "warning" &&
      q.severity != "critical") {
    return Error(res, 400, StrCat("severity: '", q.severity, "' is not none, info, warning or critical"));
  }
  q.limit = static_cast<int>(limit);
  if (req.has_param("since_time")) {
    const std::string v = req.get_param_value("since_time");
    double seconds = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
    if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(seconds) || std::abs(seconds) > 9e9) {
      return Error(res, 400, StrCat("since_time: '", v, "' is not a Unix time in seconds (e.g. 1700000000.5)"));
    }
    q.since_ns = static_cast<int64_t>(std::llround(seconds * 1e9));
  }
  q.edge = req.get_param_value("edge");
  q.stream = req.get_param_value("stream");
  q.state = req.get_param_value("state");
  if (EventState ignored; !q.state.empty() && !ParseEventState(q.state, &ignored)) {
    return Error(res, 400, StrCat("state: '", q.state, "' is not pending, confirmed or rejected"));
  }
  StatusOr<std::vector<StoredEvent>> events = o_.store->Events(q);
  if (!events.ok()) return Error(res, 500, std::string(events.status().message()));
  json list = json::array();
  for (const StoredEvent& e : *events) {
    json j = json::parse(EventJson(e));  // as a push sink gets it, and how many pictures it has
    j["snapshots"] = e.snapshots;
    list.push_back(std::move(j));
  }
  json body = {{"events", std::move(list)}};
  if (q.newest_first) {  // the next (older) page: before_seq = the oldest id of this one
    body["next_before_seq"] = events->empty() ? q.before_id : events->back().id;
  } else {
    body["next_since_seq"] = events->empty() ? q.since_id : events->back().id;
  }
  res.set_content(Dump(body), "application/json");
}


std::optional<StoredEvent> HttpApi::EventOf(const httplib::Request& req, httplib::Response& res) const {
  int64_t id = 0;
  const std::string id_text = req.matches[1].str();
  auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
  if (ec != std::errc() || end != id_text.data() + id_text.size() || id < 1) {
    Error(res, 400, StrCat("event id '", id_text.substr(0, 40), "' is not an event id (1, 2, ...)"));
    return std::nullopt;
  }
  EventQuery q;
  q.since_id = id - 1;
  q.before_id = id + 1;
  q.limit = 1;
  StatusOr<std::vector<StoredEvent>> events = o_.store->Events(q);
  if (!events.ok()) {
    Error(res, 500, std::string(events.status().message()));
    return std::nullopt;
  }
  if (events->empty()) {
    Error(res, 404, StrCat("event ", id, ": no such event"));
    return std::nullopt;
  }
  return std::move(events->front());
}


void HttpApi::EventSnapshotList(const httplib::Request& req, httplib::Response& res) const {
  std::optional<StoredEvent> ev = EventOf(req, res);
  if (!ev) return;
  StatusOr<std::vector<StoredSnapshot>> pics = o_.store->Snapshots(ev->edge, ev->stream, ev->run, ev->seq, false);
  if (!pics.ok()) return Error(res, 500, std::string(pics.status().message()));
  json list = json::array();
  for (const StoredSnapshot& p : *pics) {
    list.push_back({{"box", p.box},
                    {"region", {p.x, p.y, p.width, p.height}},
                    {"width", p.out_width},
                    {"height", p.out_height},
                    {"stored_ns", p.stored_ns},
                    {"url", StrCat("/api/events/", ev->id, "/snapshot.jpg?box=", p.box)}});
  }
  res.set_content(Dump({{"event", ev->id}, {"snapshots", std::move(list)}}), "application/json");
}

// GET /api/events/{id}/snapshot.jpg?box=-1&boxes=0: one stored picture of the event (box -1: the frame; N: the

void HttpApi::EventSnapshot(const httplib::Request& req, httplib::Response& res) const {
  int64_t box = -1, boxes = 0;
  std::string error;
  if (!ParamInt(req, "box", -1, static_cast<int64_t>(transport::kMaxDetections) - 1, &box, &error) ||
      !ParamInt(req, "boxes", 0, 1, &boxes, &error)) {
    return Error(res, 400, error);
  }
  std::optional<StoredEvent> found = EventOf(req, res);
  if (!found) return;
  const StoredEvent& ev = *found;
  StatusOr<std::vector<StoredSnapshot>> pics = o_.store->Snapshots(ev.edge, ev.stream, ev.run, ev.seq, true);
  if (!pics.ok()) return Error(res, 500, std::string(pics.status().message()));
  auto it = std::find_if(pics->begin(), pics->end(), [&](const StoredSnapshot& p) { return p.box == box; });
  if (it == pics->end()) {
    return Error(res, 404, StrCat("event ", ev.id, ": no ", box < 0 ? std::string("frame picture") : StrCat("crop of box ", box),
                                  " stored (", pics->size(), " pictures)"));
  }
  SendPicture(res, *it, boxes != 0 ? &ev : nullptr);
}


void HttpApi::LatestStreamSnapshot(const httplib::Request& req, httplib::Response& res) const {
  const std::string edge = req.get_param_value("edge"), stream = req.get_param_value("stream");
  int64_t boxes = 0;
  std::string error;
  if (edge.empty() || stream.empty()) return Error(res, 400, "edge and stream are required");
  if (!ParamInt(req, "boxes", 0, 1, &boxes, &error)) return Error(res, 400, error);
  StatusOr<std::optional<StoredSnapshot>> pic = o_.store->LatestSnapshot(edge, stream);
  if (!pic.ok()) return Error(res, 500, std::string(pic.status().message()));
  if (!pic->has_value()) {
    return Error(res, 404, StrCat(edge, "/", stream, ": no snapshot stored (an unknown stream, snapshots off for it, "
                                  "or no event yet)"));
  }
  const StoredSnapshot& p = **pic;
  std::optional<StoredEvent> ev;
  if (boxes != 0) {  // its event, by its frame (none yet: a picture may arrive before its event)
    EventQuery q;
    q.edge = edge;
    q.stream = stream;
    q.by_frame = true;
    q.run = p.run;
    q.seq = p.seq;
    q.limit = 1;
    StatusOr<std::vector<StoredEvent>> events = o_.store->Events(q);
    if (!events.ok()) return Error(res, 500, std::string(events.status().message()));
    if (!events->empty()) ev = std::move(events->front());
  }
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Vigil-Frame", StrCat(p.run, "/", p.seq));
  SendPicture(res, p, ev ? &*ev : nullptr);
}


void HttpApi::Stats(const httplib::Request&, httplib::Response& res) const {
  StatusOr<StoreStats> s = o_.store->Stats();
  if (!s.ok()) return Error(res, 500, std::string(s.status().message()));
  IngestEdges now = o_.ingest->Edges();
  const std::set<std::string>& live = now.connected;
  std::map<std::string, std::set<std::string>>& links = now.links;  // edge → the links of its admitted sessions
  std::map<std::string, std::pair<std::string, int64_t>>& grants = now.last_grant;
  std::map<std::pair<std::string, std::string>, transport::SourceState>& sources = now.sources;
  json edges = json::array(), streams = json::array();
  for (const EdgeStats& e : s->edges) {
    edges.push_back({{"edge", e.edge},
                     {"epoch", e.epoch},
                     {"connected", live.count(e.edge) > 0},
                     {"links", links.count(e.edge) ? json(links[e.edge]) : json::array()},
                     {"last_grant", grants.count(e.edge) ? json{{"kind", grants[e.edge].first},
                                                                {"at_ns", grants[e.edge].second}}
                                                         : json(nullptr)},
                     {"first_seen_ns", e.first_seen_ns},
                     {"last_seen_ns", e.last_seen_ns},
                     {"granted_ns", e.granted_ns},
                     {"streams", e.streams},
                     {"frames", e.frames},
                     {"events", e.events},
                     {"dropped", e.dropped},
                     {"lost", e.lost},
                     {"missing", e.missing},
                     {"duplicates", e.duplicates},
                     {"stale_rejected", e.stale_rejected}});
  }
  for (const StreamStats& st : s->streams) {
    json runs = json::array();
    for (const RunStats& r : st.runs) {
      json gaps = json::array();
      for (const SeqRange& g : r.gaps) gaps.push_back({g.first, g.last});
      runs.push_back({{"run", r.run},
                      {"frames", r.frames},
                      {"events", r.events},
                      {"dropped", r.dropped},
                      {"lost", r.lost},
                      {"contiguous_through", r.contiguous_through},
                      {"last_seq", r.last_seq},
                      {"missing", r.missing},
                      {"gaps", std::move(gaps)}});
    }
    auto src = sources.find({st.edge, st.stream});
    streams.push_back({{"edge", st.edge},
                       {"stream", st.stream},
                       {"source", src == sources.end() ? json(nullptr) : json(std::string(ToString(src->second)))},
                       {"epoch", st.epoch},
                       {"frames", st.frames},
                       {"events", st.events},
                       {"dropped", st.dropped},
                       {"lost", st.lost},
                       {"missing", st.missing},
                       {"duplicates", st.duplicates},
                       {"stale_rejected", st.stale_rejected},
                       {"runs", std::move(runs)}});
    sources.erase({st.edge, st.stream});
  }
  // Streams an edge runs that have stored nothing yet (a camera that never connected): listed with their source.
  for (const auto& [key, state] : sources) {
    streams.push_back({{"edge", key.first}, {"stream", key.second}, {"source", std::string(ToString(state))},
                       {"epoch", 0}, {"frames", 0}, {"events", 0}, {"dropped", 0}, {"lost", 0}, {"missing", 0},
                       {"duplicates", 0}, {"stale_rejected", 0}, {"runs", json::array()}});
  }
  res.set_content(Dump({{"edges", std::move(edges)}, {"streams", std::move(streams)}}), "application/json");
}

void HttpApi::LiveEvents(const httplib::Request& req, httplib::Response& res) {
  int64_t since = -1;
  std::string error;
  if (!ParamInt(req, "since_seq", 0, INT64_MAX, &since, &error)) return Error(res, 400, error);
  if (since < 0) {  // from now on: after the newest stored event
    EventQuery newest;
    newest.newest_first = true;
    newest.limit = 1;
    StatusOr<std::vector<StoredEvent>> last = o_.store->Events(newest);
    if (!last.ok()) return Error(res, 500, std::string(last.status().message()));
    since = last->empty() ? 0 : last->front().id;
  }
  if (live_streams_.fetch_add(1) >= o_.max_live_streams) {
    live_streams_.fetch_sub(1);
    return Error(res, 503, StrCat("already ", o_.max_live_streams, " live channels open: close one"));
  }
  res.set_header("Cache-Control", "no-cache");
  auto cursor = std::make_shared<int64_t>(since);
  auto decided_cursor = std::make_shared<uint64_t>(o_.live->decided_seq());  // decisions from the connection on
  auto opened = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, cursor, decided_cursor, opened](size_t, httplib::DataSink& sink) {
        if (!*opened) {  // says the channel is open: what is stored or decided from now on comes here
          *opened = true;
          static constexpr char kOpen[] = ": open\n\n";
          if (!sink.write(kOpen, sizeof kOpen - 1)) return false;
        }
        const std::optional<uint64_t> version = o_.live->Version();
        if (!version) return false;  // closing
        EventQuery q;
        q.since_id = *cursor;
        q.limit = 200;
        StatusOr<std::vector<StoredEvent>> events = o_.store->Events(q);
        if (!events.ok()) return false;
        std::string out;
        for (const StoredEvent& e : *events) {
          out += StrCat("id: ", e.id, "\nevent: event\ndata: ", EventJson(e), "\n\n");
          *cursor = e.id;
        }
        // Decisions on pending events (confirm.h): after the events, so a row exists before its update.
        o_.live->AppendDecisions(decided_cursor.get(), &out);
        if (out.empty()) {
          const LiveFeed::Wake w = o_.live->WaitForChange(*version, o_.keepalive_ns);
          if (w == LiveFeed::Wake::kClosed) return false;
          if (w == LiveFeed::Wake::kTimeout) out = ": keepalive\n\n";  // idle: proves the channel is alive
        }
        return out.empty() || sink.write(out.data(), out.size());
      },
      [this](bool) { live_streams_.fetch_sub(1); });
}


}  // namespace vigil::aggregator
