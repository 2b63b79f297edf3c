// The HTTP API's handlers called directly (no server, no sockets) against a SQLite store in a temporary folder,
// a fake view of the sessions and a LiveFeed under a FakeClock.
#include "aggregator/http_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "testing/test_database.h"

namespace vigil::aggregator {
namespace {

using nlohmann::json;
using transport::Report;
using transport::ReportKind;

class FakeIngest final : public IngestView {
 public:
  IngestHealth Health() const override { return health; }
  IngestEdges Edges() const override { return edges; }
  IngestHealth health;
  IngestEdges edges;
};

class HttpApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(db_.Create(testing::Engine::kSqlite));
    StoreOptions so;
    PushRoute route;
    route.sink = "alarms";
    so.routes.push_back(route);
    StatusOr<std::unique_ptr<Store>> s = Store::Open(db_.target(), so);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    HttpApiOptions o;
    o.store = store_.get();
    o.ingest = &ingest_;
    o.live = &live_;
    o.registry = &registry_;
    o.push_sinks = {"alarms"};
    o.wake_push = [this](const std::string& sink) { woken_.push_back(sink); };
    o.clock = &clock_;
    o.max_live_streams = 1;
    api_ = std::make_unique<HttpApi>(std::move(o));
  }

  static Report Event(uint64_t seq, int64_t capture_ns, const std::string& stream = "cam0") {
    Report r;
    r.edge = "edge-1";
    r.stream = stream;
    r.run = 1;
    r.seq_first = r.seq_last = seq;
    r.epoch = 1;
    r.kind = ReportKind::kEvent;
    r.severity = transport::Severity::kCritical;
    r.rule = "person";
    r.capture_ns = capture_ns;
    r.width = 768;
    r.height = 576;
    r.detections = {{10.5f, 20, 110, 220, 0.91f, 0}};
    return r;
  }
  // Admits edge-1 and stores `reports` in one transaction.
  void Put(const std::vector<Report>& reports) {
    ASSERT_TRUE(store_->Admit("edge-1", 0, false, {}, 500).ok());
    std::vector<PendingReport> batch;
    for (const Report& r : reports) batch.push_back({&r, &kNames});
    StatusOr<std::vector<ApplyResult>> res = store_->Apply(batch, 1000);
    ASSERT_TRUE(res.ok()) << res.status();
  }
  static transport::Snapshot Picture(uint64_t seq, int32_t box) {
    std::string jpeg("\xFF\xD8\xFF", 3);
    jpeg += "picture-" + std::to_string(seq) + "-" + std::to_string(box);
    return transport::Snapshot{"cam0", 1, seq, box, 0, 0, 768, 576, 640, 480, jpeg};
  }

  static httplib::Request Get(const std::string& path, const httplib::Params& params = {}) {
    httplib::Request req;
    req.method = "GET";
    req.path = path;
    req.params = params;
    return req;
  }
  // A request on a route with the event id in it (/api/events/{id}/...): req.matches as the server sets them.
  static httplib::Request OnEvent(const std::string& path, const std::string& route,
                                  const httplib::Params& params = {}) {
    httplib::Request req = Get(path, params);
    EXPECT_TRUE(std::regex_match(req.path, req.matches, std::regex(route)));
    return req;
  }
  static json Body(const httplib::Response& res) { return json::parse(res.body); }

  const std::vector<std::string> kNames = {"person"};
  testing::TestDatabase db_;
  std::unique_ptr<Store> store_;
  FakeIngest ingest_;
  FakeClock clock_;
  LiveFeed live_{&clock_};
  metrics::Registry registry_;
  std::vector<std::string> woken_;
  std::unique_ptr<HttpApi> api_;
};

TEST_F(HttpApiTest, HealthzSaysOkOrDegradedWithTheStorageError) {
  ingest_.health = {"", 2, 5};
  httplib::Response res;
  api_->Healthz(Get("/healthz"), res);
  EXPECT_EQ(res.status, 200);
  json j = Body(res);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["db"], db_.target());
  EXPECT_EQ(j["db_engine"], "sqlite");
  EXPECT_EQ(j["schema_version"], store_->schema_version());
  EXPECT_EQ(j["edges_connected"], 2);
  EXPECT_EQ(j["queue_depth"], 5);
  EXPECT_FALSE(j.contains("error"));

  ingest_.health.storage_error = "disk I/O error";
  httplib::Response bad;
  api_->Healthz(Get("/healthz"), bad);
  EXPECT_EQ(bad.status, 503);
  j = Body(bad);
  EXPECT_EQ(j["status"], "degraded");
  EXPECT_EQ(j["error"], "disk I/O error");
}

TEST_F(HttpApiTest, EventsArePagedBothWaysAndBadParametersAreNamed) {
  Put({Event(1, 100), Event(2, 200), Event(3, 300)});
  httplib::Response res;
  api_->Events(Get("/api/events", {{"limit", "2"}}), res);
  json j = Body(res);
  ASSERT_EQ(j["events"].size(), 2u);
  EXPECT_EQ(j["events"][0]["key"], "edge-1/cam0/1/1");
  EXPECT_EQ(j["events"][0]["snapshots"], 0);
  EXPECT_EQ(j["events"][0]["detections"][0]["label"], "person");
  EXPECT_EQ(j["next_since_seq"], j["events"][1]["id"]);

  httplib::Response desc;
  api_->Events(Get("/api/events", {{"order", "desc"}, {"limit", "1"}}), desc);
  j = Body(desc);
  ASSERT_EQ(j["events"].size(), 1u);
  EXPECT_EQ(j["events"][0]["seq"], 3);
  EXPECT_EQ(j["next_before_seq"], j["events"][0]["id"]);
  EXPECT_FALSE(j.contains("next_since_seq"));

  const std::vector<std::pair<httplib::Params, std::string>> bad = {
      {{{"limit", "0"}}, "limit: '0' is not an integer in [1, 10000]"},
      {{{"order", "up"}}, "order: 'up' is not asc or desc"},
      {{{"severity", "loud"}}, "severity: 'loud' is not none, info, warning or critical"},
      {{{"state", "maybe"}}, "state: 'maybe' is not pending, confirmed or rejected"},
      {{{"since_time", "soon"}}, "since_time: 'soon' is not a Unix time in seconds (e.g. 1700000000.5)"},
  };
  for (const auto& [params, message] : bad) {
    httplib::Response r;
    api_->Events(Get("/api/events", params), r);
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(Body(r)["error"], message);
  }
}

TEST_F(HttpApiTest, AnEventsPicturesAreListedAndServedAndTheNewestFrameOfAStream) {
  Put({Event(3, 100)});
  const std::string edge = "edge-1";
  const transport::Snapshot frame = Picture(3, -1), crop = Picture(3, 0);
  std::vector<PendingSnapshot> batch = {{&edge, &frame}, {&edge, &crop}};
  ASSERT_TRUE(store_->PutSnapshots(batch, 2000).ok());
  const std::string list_route = R"(/api/events/([^/]+)/snapshots)";
  const std::string pic_route = R"(/api/events/([^/]+)/snapshot\.jpg)";

  httplib::Response list;
  api_->EventSnapshotList(OnEvent("/api/events/1/snapshots", list_route), list);
  json j = Body(list);
  EXPECT_EQ(j["event"], 1);
  ASSERT_EQ(j["snapshots"].size(), 2u);
  EXPECT_EQ(j["snapshots"][0]["box"], -1);
  EXPECT_EQ(j["snapshots"][0]["width"], 640);
  EXPECT_EQ(j["snapshots"][0]["stored_ns"], 2000);
  EXPECT_EQ(j["snapshots"][1]["url"], "/api/events/1/snapshot.jpg?box=0");

  httplib::Response pic;
  api_->EventSnapshot(OnEvent("/api/events/1/snapshot.jpg", pic_route, {{"box", "0"}}), pic);
  EXPECT_EQ(pic.status, -1);  // not set: the server answers 200
  EXPECT_EQ(pic.body, crop.jpeg);
  EXPECT_EQ(pic.get_header_value("Content-Type"), "image/jpeg");

  httplib::Response missing;
  api_->EventSnapshot(OnEvent("/api/events/1/snapshot.jpg", pic_route, {{"box", "5"}}), missing);
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(Body(missing)["error"], "event 1: no crop of box 5 stored (2 pictures)");
  httplib::Response unknown;
  api_->EventSnapshotList(OnEvent("/api/events/9/snapshots", list_route), unknown);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(Body(unknown)["error"], "event 9: no such event");
  httplib::Response bad_id;
  api_->EventSnapshotList(OnEvent("/api/events/x/snapshots", list_route), bad_id);
  EXPECT_EQ(bad_id.status, 400);
  EXPECT_EQ(Body(bad_id)["error"], "event id 'x' is not an event id (1, 2, ...)");

  httplib::Response latest;
  api_->LatestStreamSnapshot(Get("/api/streams/snapshot.jpg", {{"edge", "edge-1"}, {"stream", "cam0"}}), latest);
  EXPECT_EQ(latest.body, frame.jpeg);
  EXPECT_EQ(latest.get_header_value("X-Vigil-Frame"), "1/3");
  EXPECT_EQ(latest.get_header_value("Cache-Control"), "no-store");
  httplib::Response none;
  api_->LatestStreamSnapshot(Get("/api/streams/snapshot.jpg", {{"edge", "edge-1"}, {"stream", "cam9"}}), none);
  EXPECT_EQ(none.status, 404);
  httplib::Response no_stream;
  api_->LatestStreamSnapshot(Get("/api/streams/snapshot.jpg", {{"edge", "edge-1"}}), no_stream);
  EXPECT_EQ(no_stream.status, 400);
  EXPECT_EQ(Body(no_stream)["error"], "edge and stream are required");
}

TEST_F(HttpApiTest, StatsJoinTheStoreWithWhatTheSessionsKnow) {
  Put({Event(1, 100), Event(2, 200)});
  ingest_.edges.connected = {"edge-1"};
  ingest_.edges.links["edge-1"] = {"tcp"};
  ingest_.edges.last_grant["edge-1"] = {"new", 4242};
  ingest_.edges.sources[{"edge-1", "cam0"}] = transport::SourceState::kStreaming;
  ingest_.edges.sources[{"edge-1", "cam1"}] = transport::SourceState::kReconnecting;  // nothing stored yet
  httplib::Response res;
  api_->Stats(Get("/api/stats"), res);
  json j = Body(res);
  ASSERT_EQ(j["edges"].size(), 1u);
  const json& e = j["edges"][0];
  EXPECT_EQ(e["edge"], "edge-1");
  EXPECT_EQ(e["epoch"], 1);
  EXPECT_EQ(e["connected"], true);
  EXPECT_EQ(e["links"], json::array({"tcp"}));
  EXPECT_EQ(e["last_grant"], json({{"kind", "new"}, {"at_ns", 4242}}));
  EXPECT_EQ(e["events"], 2);
  ASSERT_EQ(j["streams"].size(), 2u);
  EXPECT_EQ(j["streams"][0]["stream"], "cam0");
  EXPECT_EQ(j["streams"][0]["source"], "streaming");
  EXPECT_EQ(j["streams"][0]["events"], 2);
  EXPECT_EQ(j["streams"][1]["stream"], "cam1");
  EXPECT_EQ(j["streams"][1]["source"], "reconnecting");
  EXPECT_EQ(j["streams"][1]["frames"], 0);

  ingest_.edges = {};  // disconnected: still listed from the store
  httplib::Response later;
  api_->Stats(Get("/api/stats"), later);
  j = Body(later);
  EXPECT_EQ(j["edges"][0]["connected"], false);
  EXPECT_EQ(j["edges"][0]["last_grant"], nullptr);
  EXPECT_EQ(j["streams"].size(), 1u);
  EXPECT_EQ(j["streams"][0]["source"], nullptr);
}

TEST_F(HttpApiTest, DeadLettersAreListedAndReplayedOnlyForAKnownSink) {
  httplib::Response list;
  api_->DeadLetters(Get("/api/dead_letters"), list);
  EXPECT_EQ(Body(list), json({{"dead_letters", json::array()}}));

  httplib::Response unknown;
  api_->ReplayDeadLetters(Get("/api/dead_letters/replay", {{"sink", "nope"}}), unknown);
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(Body(unknown)["error"], "sink: 'nope' is not a push sink of this aggregator");
  EXPECT_TRUE(woken_.empty());

  httplib::Response replay;
  api_->ReplayDeadLetters(Get("/api/dead_letters/replay", {{"sink", "alarms"}}), replay);
  EXPECT_EQ(Body(replay), json({{"sink", "alarms"}, {"replayed", 0}}));
  EXPECT_EQ(woken_, std::vector<std::string>{"alarms"});
}

TEST_F(HttpApiTest, MetricsRenderTheRegistryWithEachSinksOutboxDepth) {
  Put({Event(1, 100)});
  httplib::Response res;
  api_->Metrics(Get("/metrics"), res);
  EXPECT_EQ(res.get_header_value("Content-Type"), metrics::Registry::kContentType);
  EXPECT_NE(res.body.find("vigil_aggregator_push_outbox_depth{sink=\"alarms\"} 1"), std::string::npos) << res.body;
}

// Runs one step of a live channel's chunked provider; what it wrote goes to *out.
bool Step(httplib::Response& res, std::string* out) {
  httplib::DataSink sink;
  sink.write = [out](const char* d, size_t n) {
    out->append(d, n);
    return true;
  };
  return res.content_provider_(0, 0, sink);
}

TEST_F(HttpApiTest, TheLiveChannelSendsEventsThenDecisionsThenKeepsAlive) {
  Put({Event(1, 100)});
  {
    httplib::Response res;
    api_->LiveEvents(Get("/api/events/live", {{"since_seq", "0"}}), res);
    ASSERT_TRUE(res.content_provider_);
    EXPECT_EQ(res.get_header_value("Cache-Control"), "no-cache");
    EXPECT_EQ(api_->live_streams(), 1);

    // One channel at most here: the next is refused.
    httplib::Response second;
    api_->LiveEvents(Get("/api/events/live"), second);
    EXPECT_EQ(second.status, 503);
    EXPECT_EQ(Body(second)["error"], "already 1 live channels open: close one");

    std::string out;
    ASSERT_TRUE(Step(res, &out));
    ASSERT_EQ(out.rfind(": open\n\nid: 1\nevent: event\ndata: {", 0), 0u) << out;
    EXPECT_NE(out.find("\"key\":\"edge-1/cam0/1/1\""), std::string::npos);

    // A decision: sent as `event: state`.
    EventDecision d;
    d.edge = "edge-1";
    d.stream = "cam0";
    d.run = 1;
    d.seq = 1;
    d.state = EventState::kRejected;
    d.reason = "too short";
    DecisionResult decided;
    decided.applied = {1};
    live_.PublishDecisions({d}, decided, 5000);
    out.clear();
    ASSERT_TRUE(Step(res, &out));
    ASSERT_EQ(out.rfind("event: state\ndata: {", 0), 0u) << out;
    EXPECT_NE(out.find("\"state\":\"rejected\""), std::string::npos);

    // Nothing new: the wait (a fake clock: at once) ends in a keep-alive.
    out.clear();
    ASSERT_TRUE(Step(res, &out));
    EXPECT_EQ(out, ": keepalive\n\n");

    live_.Close();
    EXPECT_FALSE(Step(res, &out));
  }
  EXPECT_EQ(api_->live_streams(), 0);  // released with the response
}

TEST_F(HttpApiTest, TheLiveChannelStartsAfterTheNewestEventAndRefusesABadCursor) {
  Put({Event(1, 100), Event(2, 200)});
  httplib::Response res;
  api_->LiveEvents(Get("/api/events/live"), res);
  std::string out;
  ASSERT_TRUE(Step(res, &out));
  EXPECT_EQ(out, ": open\n\n: keepalive\n\n");  // the stored events are not sent again

  httplib::Response bad;
  api_->LiveEvents(Get("/api/events/live", {{"since_seq", "-1"}}), bad);
  EXPECT_EQ(bad.status, 400);
}

TEST_F(HttpApiTest, TheDashboardsFilesAreServedWithTheirPolicy) {
  httplib::Response index;
  ASSERT_TRUE(HttpApi::DashboardFile("/", index));
  EXPECT_EQ(index.get_header_value("Content-Type").rfind("text/html", 0), 0u);
  EXPECT_NE(index.get_header_value("Content-Security-Policy").find("default-src 'self'"), std::string::npos);
  EXPECT_FALSE(index.body.empty());
  httplib::Response none;
  EXPECT_FALSE(HttpApi::DashboardFile("/ui/nothing.js", none));
}

}  // namespace
}  // namespace vigil::aggregator
