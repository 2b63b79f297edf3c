// aggregator/http_api.h — the aggregator's HTTP API and dashboard (internal to src/aggregator): every route of
// aggregator/aggregator.h's "HTTP" list (/healthz, /metrics, /api/events, /api/events/live, the snapshot routes,
// /api/stats, /api/dead_letters and its replay) and the dashboard's files, over three narrow seams:
//  - the Store (events, snapshots, stats, dead letters, push outbox depths): read through its reader side;
//  - IngestView: what the sessions part knows now (connected edges, their links and latest grants, source states,
//    queue depth, the last storage error), read under that part's own lock;
//  - LiveFeed (aggregator/live_feed.h): what the storage thread committed, for the live channel.
// The JSON bodies are byte for byte what aggregator.h documents (invalid UTF-8 replaced, never thrown on).
//
// Ownership: the aggregator owns the HttpApi and must keep it, and everything its options point to, alive until the
// httplib::Server it registered on has stopped. It owns no thread: its handlers run on the server's worker threads
// (a live channel holds one worker for as long as it is open; at most max_live_streams at once, 503 beyond).
// Thread-safety: every handler may run on any number of threads at once (the seams are thread-safe).
// Errors: a handler answers 400 {"error": "<the parameter and why>"} for a malformed request, 404 for an unknown
// event or picture, 500 {"error": "<the store's message>"} when the store fails, 503 from /healthz while storage is
// failing (and from the live channel when too many are open); nothing is thrown.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "aggregator/live_feed.h"
#include "vigil/aggregator/store.h"
#include "vigil/common/clock.h"
#include "vigil/metrics/registry.h"
#include "vigil/transport/protocol.h"

namespace vigil::aggregator {

// What the sessions part knows now (its view, copied under its lock).
struct IngestHealth {
  std::string storage_error;  // the last failed transaction's message; "" while storage is healthy
  size_t edges_connected = 0;  // sessions past their Hello
  size_t queue_depth = 0;      // Hellos and reports waiting for the storage thread
};
struct IngestEdges {
  std::set<std::string> connected;                              // edge ids with a session past its Hello
  std::map<std::string, std::set<std::string>> links;           // edge → links of its admitted, current sessions
  std::map<std::string, std::pair<std::string, int64_t>> last_grant;  // edge → (kind, wall ns) of its latest grant
  std::map<std::pair<std::string, std::string>, transport::SourceState> sources;  // (edge, stream) → its source
};
class IngestView {
 public:
  virtual ~IngestView() = default;
  virtual IngestHealth Health() const = 0;
  virtual IngestEdges Edges() const = 0;
};

struct HttpApiOptions {
  Store* store = nullptr;              // required; not owned
  const IngestView* ingest = nullptr;  // required; not owned
  LiveFeed* live = nullptr;            // required; not owned
  metrics::Registry* registry = nullptr;  // required (/metrics); not owned
  std::vector<std::string> push_sinks;    // the push sinks' names (outbox depth gauges, dead-letter replay)
  std::function<void(const std::string& sink)> wake_push;  // after a replay: the sink's pusher looks again
  const Clock* clock = SystemClock();  // replay's timestamp, the live channel's keep-alive wait
  int max_live_streams = 8;             // live channels open at once (each holds an HTTP worker)
  int64_t keepalive_ns = 15'000'000'000;  // an idle live channel says ": keepalive" this often
};

class HttpApi {
 public:
  explicit HttpApi(HttpApiOptions options);

  // Registers every route and the dashboard's files on `http` (not started). Handlers keep `this`.
  void Register(httplib::Server& http);

  // The handlers, as Register routes them (public for the unit tests).
  void Healthz(const httplib::Request& req, httplib::Response& res) const;
  void Metrics(const httplib::Request& req, httplib::Response& res) const;
  void DeadLetters(const httplib::Request& req, httplib::Response& res) const;
  void ReplayDeadLetters(const httplib::Request& req, httplib::Response& res) const;
  void Events(const httplib::Request& req, httplib::Response& res) const;
  void LiveEvents(const httplib::Request& req, httplib::Response& res);
  // req.matches[1]: the event id of the route (/api/events/{id}/...).
  void EventSnapshotList(const httplib::Request& req, httplib::Response& res) const;
  void EventSnapshot(const httplib::Request& req, httplib::Response& res) const;
  void LatestStreamSnapshot(const httplib::Request& req, httplib::Response& res) const;
  void Stats(const httplib::Request& req, httplib::Response& res) const;
  // The dashboard file served at `path` ("/" is index.html, "/ui/<name>" the others): false when there is none.
  static bool DashboardFile(const std::string& path, httplib::Response& res);

  // Live channels open now.
  int live_streams() const { return live_streams_.load(); }

 private:
  std::optional<StoredEvent> EventOf(const httplib::Request& req, httplib::Response& res) const;

  const HttpApiOptions o_;
  std::atomic<int> live_streams_{0};
};

}  // namespace vigil::aggregator
