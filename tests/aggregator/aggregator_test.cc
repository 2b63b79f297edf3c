// The aggregator service end to end on loopback: publisher → receiver → SQLite → HTTP.
#include "vigil/aggregator/aggregator.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "vigil/transport/publisher.h"

namespace vigil::aggregator {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using transport::Report;
using transport::ReportKind;

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(AggregatorConfigTest, ReadsEveryKey) {
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "listen: 127.0.0.1:0\nhttp: ':8080'\ndb: /tmp/a.db\ndb_synchronous: full\nmax_connections: 8\n"
      "batch_max: 64\nqueue_max: 1000\npeer_timeout_ms: 2500\n",
      "agg.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen_host, "127.0.0.1");
  EXPECT_EQ(c->listen_port, 0);
  EXPECT_EQ(c->http_host, "");
  EXPECT_EQ(c->http_port, 8080);
  EXPECT_EQ(c->db_path, "/tmp/a.db");
  EXPECT_TRUE(c->db_synchronous_full);
  EXPECT_EQ(c->max_connections, 8);
  EXPECT_EQ(c->batch_max, 64);
  EXPECT_EQ(c->queue_max, 1000);
  EXPECT_EQ(c->peer_timeout_ms, 2500);

  StatusOr<AggregatorConfig> defaults = ParseAggregatorConfig("", "empty.yaml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->listen_port, 7400);
  EXPECT_EQ(defaults->db_path, "vigil-aggregator.db");
}

TEST(AggregatorConfigTest, ErrorsNameKeyAndLine) {
  StatusOr<AggregatorConfig> c = ParseAggregatorConfig(
      "listen: 0.0.0.0:99999\n"
      "http: 127.0.0.1:7401\n"
      "batch_max: lots\n"
      "databse: x.db\n"
      "db_synchronous: sometimes\n"
      "peer_timeout_ms: 5\n",
      "agg.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(c.status()),
            "agg.yaml:1:9: listen: port 99999 is out of range [0, 65535]\n"
            "agg.yaml:3:12: batch_max: expected an integer, got 'lots'\n"
            "agg.yaml:4:1: databse: unknown key\n"
            "agg.yaml:5:17: db_synchronous: 'sometimes' is not one of: normal, full\n"
            "agg.yaml:6:18: peer_timeout_ms: 5 is out of range [100, 3600000]");
  EXPECT_EQ(LoadAggregatorConfig("/nonexistent/agg.yaml").status().code(), absl::StatusCode::kNotFound);
}

class AggregatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("vigil_agg_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
    config_.listen_host = "127.0.0.1";
    config_.listen_port = 0;
    config_.http_host = "127.0.0.1";
    config_.http_port = 0;
    config_.db_path = (dir_ / "agg.db").string();
    config_.batch_max = 64;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Aggregator> StartAggregator() {
    StatusOr<std::unique_ptr<Aggregator>> a = Aggregator::Start(config_);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }

  std::unique_ptr<transport::Publisher> Connect(uint16_t port, uint64_t epoch, const std::string& edge = "edge-1") {
    transport::TcpPublisherOptions o;
    o.edge = edge;
    o.epoch = epoch;
    o.host = "127.0.0.1";
    o.port = port;
    o.backoff_initial = milliseconds(5);
    o.backoff_max = milliseconds(50);
    StatusOr<std::unique_ptr<transport::Publisher>> p = transport::MakeTcpPublisher(o);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // Frames first..last of `stream`: an event (one person) every 4th frame, progress ranges between.
  static void PublishFrames(transport::Publisher& p, const std::string& stream, uint64_t first, uint64_t last,
                            std::atomic<bool>* stop = nullptr) {
    for (uint64_t seq = first; seq <= last;) {
      if (stop != nullptr && stop->load()) return;
      Report r;
      r.stream = stream;
      r.run = 1;
      r.seq_first = seq;
      r.capture_ns = 1'700'000'000'000'000'000 + static_cast<int64_t>(seq) * 40'000'000;
      r.width = 768;
      r.height = 576;
      if (seq % 4 == 0) {
        r.kind = ReportKind::kEvent;
        r.seq_last = seq;
        r.rule = "person";
        r.severity = transport::Severity::kWarning;
        r.detections = {{0, 0.8f, 1, 2, 30, 40, "person"}};
      } else {
        r.seq_last = std::min(last, seq - seq % 4 + 3);
      }
      ASSERT_TRUE(p.Publish(r, milliseconds(10000)).ok());
      seq = r.seq_last + 1;
    }
  }

  json Get(uint16_t port, const std::string& path, int expect_status = 200) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(5, 0);
    auto res = c.Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return json();
    EXPECT_EQ(res->status, expect_status) << path << ": " << res->body;
    if (res->get_header_value("Content-Type") != "application/json") return json(res->body);
    return json::parse(res->body);
  }

  int64_t Query(const std::string& sql) {
    sqlite3* db = nullptr;
    sqlite3_open_v2(config_.db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    int64_t v = -1;
    if (sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
  }

  std::filesystem::path dir_;
  AggregatorConfig config_;
};

TEST_F(AggregatorTest, StoresReportsAndServesThemOverHttp) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  auto pub = Connect(agg->listen_port(), 1);
  PublishFrames(*pub, "cam0", 0, 99);
  PublishFrames(*pub, "cam1", 0, 9);
  ASSERT_TRUE(pub->Flush(milliseconds(10000)));
  EXPECT_EQ(pub->AckedThrough("cam0", 1), 99u);

  json health = Get(agg->http_port(), "/healthz");
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["schema_version"], 1);
  EXPECT_EQ(health["edges_connected"], 1);

  json stats = Get(agg->http_port(), "/api/stats");
  ASSERT_EQ(stats["streams"].size(), 2u);
  const json& cam0 = stats["streams"][0];
  EXPECT_EQ(cam0["stream"], "cam0");
  EXPECT_EQ(cam0["frames"], 100);
  EXPECT_EQ(cam0["events"], 25);
  EXPECT_EQ(cam0["missing"], 0);
  EXPECT_EQ(cam0["runs"][0]["contiguous_through"], 99);
  EXPECT_EQ(cam0["runs"][0]["gaps"], json::array());
  ASSERT_EQ(stats["edges"].size(), 1u);
  EXPECT_EQ(stats["edges"][0]["edge"], "edge-1");
  EXPECT_EQ(stats["edges"][0]["connected"], true);
  EXPECT_EQ(stats["edges"][0]["frames"], 110);
  EXPECT_EQ(stats["edges"][0]["events"], 28);

  json page = Get(agg->http_port(), "/api/events?stream=cam0&limit=10");
  ASSERT_EQ(page["events"].size(), 10u);
  const json& e = page["events"][0];
  EXPECT_EQ(e["seq"], 0);
  EXPECT_EQ(e["severity"], "warning");
  EXPECT_EQ(e["capture_ns"], 1'700'000'000'000'000'000);
  EXPECT_EQ(e["detections"][0]["label"], "person");
  EXPECT_EQ(e["detections"][0]["box"], json({1.0, 2.0, 30.0, 40.0}));
  json next = Get(agg->http_port(), "/api/events?stream=cam0&since_seq=" + page["next_since_seq"].dump());
  ASSERT_EQ(next["events"].size(), 15u);
  EXPECT_EQ(next["events"][0]["seq"], 40);
  // since_time in Unix seconds: frame 80 was captured 3.2 s after the first.
  json late = Get(agg->http_port(), "/api/events?stream=cam0&since_time=1700000003.2");
  ASSERT_EQ(late["events"].size(), 5u);
  EXPECT_EQ(late["events"][0]["seq"], 80);

  EXPECT_EQ(Get(agg->http_port(), "/api/events?limit=0", 400)["error"], "limit: '0' is not an integer in [1, 10000]");
  EXPECT_EQ(Get(agg->http_port(), "/api/events?since_time=yesterday", 400)["error"],
            "since_time: 'yesterday' is not a Unix time in seconds (e.g. 1700000000.5)");

  const std::string metrics = Get(agg->http_port(), "/metrics").get<std::string>();
  EXPECT_NE(metrics.find("vigil_aggregator_frames_total{edge=\"edge-1\",stream=\"cam0\"} 100\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_events_total{edge=\"edge-1\",stream=\"cam1\"} 3\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_reports_total{result=\"stored\"} 56\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_transport_connections_total{result=\"accepted\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_frame_to_stored_seconds_count{edge=\"edge-1\",stream=\"cam0\"} 50\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("# TYPE vigil_aggregator_commit_seconds histogram\n"), std::string::npos);
}

TEST_F(AggregatorTest, ReSentFramesAreStoredOnceAndStaleEpochsRejected) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  {
    auto first = Connect(agg->listen_port(), 5);
    PublishFrames(*first, "cam0", 0, 39);
    ASSERT_TRUE(first->Flush(milliseconds(10000)));
  }
  // The edge restarts (epoch 6) from an old cursor: frames 20..39 are re-sent, 40..59 are new.
  auto restarted = Connect(agg->listen_port(), 6);
  PublishFrames(*restarted, "cam0", 20, 59);
  ASSERT_TRUE(restarted->Flush(milliseconds(10000)));
  EXPECT_EQ(restarted->AckedThrough("cam0", 1), 59u);
  // A zombie of the old instance (epoch 5) is fenced off.
  auto zombie = Connect(agg->listen_port(), 5);
  PublishFrames(*zombie, "cam0", 60, 63);
  ASSERT_TRUE(zombie->Flush(milliseconds(10000)));
  EXPECT_TRUE(zombie->Stats().fenced);
  EXPECT_EQ(zombie->Stats().rejected, 2u);

  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), 60);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), 15);
  json s = Get(agg->http_port(), "/api/stats")["streams"][0];
  EXPECT_EQ(s["frames"], 60);
  EXPECT_EQ(s["duplicates"], 20);
  EXPECT_EQ(s["stale_rejected"], 2);
  EXPECT_EQ(s["epoch"], 6);
  const std::string metrics = Get(agg->http_port(), "/metrics").get<std::string>();
  EXPECT_NE(metrics.find("vigil_aggregator_stale_rejected_total{edge=\"edge-1\",stream=\"cam0\"} 2\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("vigil_aggregator_duplicate_frames_total{edge=\"edge-1\",stream=\"cam0\"} 20\n"),
            std::string::npos);
}

TEST_F(AggregatorTest, KilledMidRunAndRestartedEveryFrameIsAccountedOnce) {
  constexpr uint64_t kFrames = 3000;
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  config_.listen_port = agg->listen_port();  // the restarted aggregator takes the same port
  auto pub = Connect(agg->listen_port(), 1);
  std::thread producer([&] {
    for (uint64_t first = 0; first < kFrames; first += 100) {
      PublishFrames(*pub, "cam0", first, first + 99);
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  // Kill once part of the run is durably acknowledged, while reports are still in flight.
  for (int i = 0; i < 5000 && pub->AckedThrough("cam0", 1).value_or(0) < 1000; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_GE(pub->AckedThrough("cam0", 1).value_or(0), 1000u);
  agg->Kill();
  agg.reset();
  agg = StartAggregator();
  ASSERT_TRUE(agg);
  producer.join();
  ASSERT_TRUE(pub->Flush(milliseconds(20000)));
  EXPECT_EQ(pub->AckedThrough("cam0", 1), kFrames - 1);
  const transport::PublisherStats ps = pub->Stats();
  EXPECT_GE(ps.connects, 2u);
  EXPECT_GT(ps.resent, 0u) << "the kill hit no report in flight";

  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), static_cast<int64_t>(kFrames));
  EXPECT_EQ(Query("SELECT COUNT(DISTINCT seq) FROM frames"), static_cast<int64_t>(kFrames));
  EXPECT_EQ(Query("SELECT MAX(seq) FROM frames"), static_cast<int64_t>(kFrames - 1));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM events"), static_cast<int64_t>(kFrames / 4));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames f JOIN events e USING(stream_id, run, seq)"),
            static_cast<int64_t>(kFrames / 4));
  json s = Get(agg->http_port(), "/api/stats")["streams"][0];
  EXPECT_EQ(s["frames"], kFrames);
  EXPECT_EQ(s["missing"], 0);
  EXPECT_EQ(s["runs"][0]["contiguous_through"], kFrames - 1);
}

TEST_F(AggregatorTest, ManyEdgesAtOnce) {
  constexpr int kEdges = 6;
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  std::vector<std::thread> edges;
  std::atomic<int> flushed{0};
  for (int e = 0; e < kEdges; ++e) {
    edges.emplace_back([&, e] {
      auto pub = Connect(agg->listen_port(), 1, "edge-" + std::to_string(e));
      PublishFrames(*pub, "a", 0, 199);
      PublishFrames(*pub, "b", 0, 99);
      if (pub->Flush(milliseconds(20000))) ++flushed;
    });
  }
  for (std::thread& t : edges) t.join();
  EXPECT_EQ(flushed.load(), kEdges);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM frames"), kEdges * 300);
  json stats = Get(agg->http_port(), "/api/stats");
  ASSERT_EQ(stats["edges"].size(), static_cast<size_t>(kEdges));
  for (const json& e : stats["edges"]) {
    EXPECT_EQ(e["frames"], 300) << e["edge"];
    EXPECT_EQ(e["events"], 75) << e["edge"];
    EXPECT_EQ(e["missing"], 0) << e["edge"];
  }
}

TEST_F(AggregatorTest, StartFailsClearlyWhenThePortIsTaken) {
  auto agg = StartAggregator();
  ASSERT_TRUE(agg);
  AggregatorConfig clash = config_;
  clash.listen_port = agg->listen_port();
  clash.db_path = (dir_ / "other.db").string();
  StatusOr<std::unique_ptr<Aggregator>> second = Aggregator::Start(clash);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(Message(second.status()).find("Address already in use"), std::string::npos) << second.status();
}

}  // namespace
}  // namespace vigil::aggregator
