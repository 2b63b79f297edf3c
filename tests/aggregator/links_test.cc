// The edge's links end to end against a real Aggregator (SQLite, authenticated receivers): an Outbox
// drained by a Courier over links whose connections lose, delay, duplicate, reorder and cut frames on a
// seeded random schedule, and a switch ucx → tcp → ucx mid-stream. What must hold: every report stored
// exactly once, and each stream's frames stored in the order the edge published them.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "testing/eventually.h"
#include "vigil/aggregator/aggregator.h"
#include "vigil/transport/auth.h"
#include "vigil/transport/courier.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/link.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/protocol.h"
#include "testing/test_certs.h"
#include "vigil/transport/tls.h"
#include "vigil/transport/ucx.h"

namespace vigil::aggregator {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using transport::Connection;
using transport::Dialer;
using transport::Message;
using transport::MessageType;
using transport::Outbox;
using transport::Report;
using transport::ReportKind;

constexpr milliseconds kLong{60000};  // an upper bound on a busy 2-core machine, not a timing assertion
constexpr char kEdge[] = "edge-1";

using testutil::Eventually;

// What a fault-injecting connection does to each frame after the handshake, drawn per frame from one
// seeded generator (shared by every connection of a test, so one seed replays the schedule).
struct FaultPlan {
  double drop = 0, duplicate = 0, reorder = 0, delay = 0, cut = 0;  // probabilities per frame
  std::mutex mu;
  std::mt19937_64 rng;
  std::map<std::string, int> counts;  // what was done, for the log and the assertions

  explicit FaultPlan(uint64_t seed) : rng(seed) {}
  // One decision for a frame: "pass", "drop", "duplicate", "reorder", "delay", "cut".
  std::string Decide() {
    std::lock_guard lock(mu);
    std::uniform_real_distribution<double> u(0, 1);
    double x = u(rng);
    std::string what = "pass";
    for (auto [name, p] : {std::pair{"drop", drop}, {"duplicate", duplicate}, {"reorder", reorder}, {"delay", delay},
                           {"cut", cut}}) {
      if (x < p) {
        what = name;
        break;
      }
      x -= p;
    }
    ++counts[what];
    return what;
  }
  int count(const std::string& what) {
    std::lock_guard lock(mu);
    return counts[what];
  }
};

// Splits a byte stream into whole protocol frames (header + body), keeping a partial tail.
class FrameSplitter {
 public:
  std::vector<std::string> Feed(std::string_view bytes) {
    buf_.append(bytes);
    std::vector<std::string> frames;
    while (buf_.size() >= transport::kHeaderBytes) {
      uint32_t body = 0;
      for (int i = 0; i < 4; ++i) body |= static_cast<uint32_t>(static_cast<uint8_t>(buf_[8 + i])) << (8 * i);
      const size_t n = transport::kHeaderBytes + body;
      if (buf_.size() < n) break;
      frames.push_back(buf_.substr(0, n));
      buf_.erase(0, n);
    }
    return frames;
  }

 private:
  std::string buf_;
};

MessageType TypeOf(const std::string& frame) { return static_cast<MessageType>(static_cast<uint8_t>(frame[5])); }

// A connection that applies the plan to Reports going out and to Acks and Heartbeats coming in; the
// handshake (Hello, Challenge, Auth, Welcome) passes untouched so that sessions do start.
class FaultyConnection final : public Connection {
 public:
  FaultyConnection(std::unique_ptr<Connection> inner, FaultPlan* plan) : inner_(std::move(inner)), plan_(plan) {}

  Status Write(std::string_view bytes, milliseconds timeout) override {
    std::string out;
    for (std::string& f : out_split_.Feed(bytes)) {
      if (TypeOf(f) != MessageType::kReport) {
        out += f;
        continue;
      }
      const std::string what = plan_->Decide();
      if (what == "cut") {
        inner_->Shutdown();
        return absl::UnavailableError("injected: connection cut");
      }
      if (what == "drop") continue;
      if (what == "delay") std::this_thread::sleep_for(milliseconds(plan_->count("delay") % 4));
      if (what == "reorder" && held_.empty()) {
        held_ = std::move(f);  // goes out after the next frame
        continue;
      }
      out += f;
      if (what == "duplicate") out += f;
      if (!held_.empty()) {
        out += held_;
        held_.clear();
      }
    }
    if (out.empty()) return absl::OkStatus();
    return inner_->Write(out, timeout);
  }

  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    while (ready_.empty()) {
      std::string raw(64 << 10, '\0');
      VIGIL_ASSIGN_OR_RETURN(size_t n, inner_->Read(raw.data(), raw.size(), timeout));
      for (std::string& f : in_split_.Feed(std::string_view(raw.data(), n))) {
        const MessageType t = TypeOf(f);
        if (t != MessageType::kAck && t != MessageType::kHeartbeat) {
          ready_ += f;
          continue;
        }
        const std::string what = plan_->Decide();
        if (what == "drop" || what == "cut" || what == "reorder") continue;  // an ack lost on the way back
        ready_ += f;
        if (what == "duplicate") ready_ += f;
      }
    }
    const size_t n = std::min(max, ready_.size());
    std::copy_n(ready_.data(), n, buf);
    ready_.erase(0, n);
    return n;
  }

  void Shutdown() override { inner_->Shutdown(); }
  std::string peer() const override { return inner_->peer(); }
  std::string transports() const override { return inner_->transports(); }

 private:
  const std::unique_ptr<Connection> inner_;
  FaultPlan* const plan_;
  FrameSplitter out_split_, in_split_;  // Write thread / Read thread
  std::string held_;                    // Write thread: a report held back to go out after the next one
  std::string ready_;                   // Read thread: bytes that passed the plan
};

// Wraps a dialer: faults on every connection, and a switch that takes the path down (dials fail, open
// connections are cut) and back up.
class TestDialer final : public Dialer {
 public:
  TestDialer(std::unique_ptr<Dialer> inner, FaultPlan* plan) : inner_(std::move(inner)), plan_(plan) {}

  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    if (down_.load()) return absl::UnavailableError("injected: path down");
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> c, inner_->Dial(timeout));
    std::shared_ptr<Connection> conn;
    if (plan_ != nullptr) {
      conn = std::make_shared<FaultyConnection>(std::move(c), plan_);
    } else {
      conn = std::move(c);
    }
    {
      std::lock_guard lock(mu_);
      live_.push_back(conn);
    }
    return std::unique_ptr<Connection>(new Shared(conn));
  }
  std::string target() const override { return inner_->target(); }

  void SetDown(bool down) {
    down_ = down;
    if (!down) return;
    std::lock_guard lock(mu_);
    for (auto& w : live_) {
      if (auto c = w.lock()) c->Shutdown();
    }
    live_.clear();
  }

 private:
  // The courier owns a unique_ptr; the dialer keeps a weak handle to cut it.
  class Shared final : public Connection {
   public:
    explicit Shared(std::shared_ptr<Connection> c) : c_(std::move(c)) {}
    Status Write(std::string_view b, milliseconds t) override { return c_->Write(b, t); }
    StatusOr<size_t> Read(char* buf, size_t max, milliseconds t) override { return c_->Read(buf, max, t); }
    void Shutdown() override { c_->Shutdown(); }
    std::string peer() const override { return c_->peer(); }
    std::string transports() const override { return c_->transports(); }

   private:
    std::shared_ptr<Connection> c_;
  };

  const std::unique_ptr<Dialer> inner_;
  FaultPlan* const plan_;
  std::atomic<bool> down_{false};
  std::mutex mu_;
  std::vector<std::weak_ptr<Connection>> live_;  // GUARDED_BY(mu_)
};

class Edge : public transport::CourierHandler {
 public:
  transport::Hello MakeHello() override { return transport::Hello{"", 0, transport::kProtocolVersion, 0, {"person"}}; }
  void OnWelcome(const transport::Welcome&, std::string_view) override {}
  void OnAck(const transport::Ack&) override { ++acks; }
  void OnReject(const transport::Reject&) override { ++rejects; }
  void OnFenced(const Status&) override { ++fenced; }
  std::atomic<int> acks{0}, rejects{0}, fenced{0};
};

class LinksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / StrCat("vigil_links_", std::random_device{}());
    fs::create_directories(dir_);
    key_ = std::string(32, '\x42');
    config_.listen_host = config_.http_host = "127.0.0.1";
    config_.listen_port = config_.http_port = 0;
    config_.db_path = (dir_ / "agg.db").string();
    config_.keys_file = (dir_ / "keys.yaml").string();
    std::ofstream keys(config_.keys_file);
    keys << kEdge << ": ";
    for (char c : key_) keys << "0123456789abcdef"[static_cast<uint8_t>(c) >> 4] << "0123456789abcdef"[c & 15];
    keys << "\n";
    keys.close();
    fs::permissions(config_.keys_file, fs::perms::owner_read | fs::perms::owner_write);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<Aggregator> Start() {
    StatusOr<std::unique_ptr<Aggregator>> a = Aggregator::Start(config_);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }

  transport::CourierOptions Options(std::vector<std::shared_ptr<transport::Link>> links) {
    transport::CourierOptions o;
    o.edge = kEdge;
    o.links = std::move(links);
    o.backoff_initial = milliseconds(5);
    o.backoff_max = milliseconds(50);
    o.heartbeat_interval = milliseconds(50);
    o.peer_timeout = milliseconds(3000);
    o.ack_timeout = milliseconds(400);
    o.probe_interval = milliseconds(50);
    o.connect_timeout = milliseconds(5000);
    o.max_batch = 16;
    return o;
  }

  // Publishes frames [from, from + n) of each stream the way an edge does: an event every 3rd frame,
  // progress marks between, a dropped mark now and then. Returns the frames covered per stream.
  static void Publish(Outbox& outbox, const std::vector<std::string>& streams, uint64_t from, uint64_t n) {
    for (uint64_t seq = from; seq < from + n;) {
      uint64_t last = seq;
      ReportKind kind = ReportKind::kEvent;
      if (seq % 3 != 0) {
        last = std::min(from + n - 1, seq + (seq % 3 == 1 ? 1 : 0));
        kind = seq % 7 == 2 ? ReportKind::kDropped : ReportKind::kProgress;
      }
      for (const std::string& s : streams) {
        Report r;
        r.stream = s;
        r.run = 1;
        r.seq_first = seq;
        r.seq_last = last;
        r.kind = kind;
        r.capture_ns = 1'800'000'000'000'000'000 + static_cast<int64_t>(seq);
        if (kind == ReportKind::kEvent) {
          r.rule = "person";
          r.severity = transport::Severity::kInfo;
          r.detections = {{1, 2, 3, 4, 0.9f, 0}};
        } else if (kind == ReportKind::kDropped) {
          r.rule = "queue_full";
        }
        ASSERT_TRUE(outbox.Push(std::move(r), kLong).ok());
      }
      seq = last + 1;
    }
  }

  std::vector<std::vector<int64_t>> Rows(const std::string& sql) {
    sqlite3* db = nullptr;
    sqlite3_open_v2(config_.db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    std::vector<std::vector<int64_t>> rows;
    while (sqlite3_step(s) == SQLITE_ROW) {
      std::vector<int64_t>& r = rows.emplace_back();
      for (int c = 0; c < sqlite3_column_count(s); ++c) r.push_back(sqlite3_column_int64(s, c));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return rows;
  }

  // Every frame 0..frames-1 of each stream stored once, and in the order published: within a stream,
  // events in ascending event id have ascending seq, and no frame was stored before a lower one.
  void ExpectStoredOnceInOrder(const std::vector<std::string>& streams, int64_t frames) {
    for (const std::string& s : streams) {
      SCOPED_TRACE(s);
      const std::string where = StrCat("s.stream = '", s, "'");
      auto rows = Rows(StrCat("SELECT f.seq, f.stored_ns FROM frames f JOIN streams s ON s.id = f.stream_id WHERE ",
                              where, " ORDER BY f.seq"));
      ASSERT_EQ(static_cast<int64_t>(rows.size()), frames);
      for (int64_t i = 0; i < frames; ++i) {
        ASSERT_EQ(rows[i][0], i);
        if (i > 0) {
          EXPECT_GE(rows[i][1], rows[i - 1][1]) << "frame " << i << " stored before frame " << i - 1;
        }
      }
      auto events = Rows(StrCat("SELECT e.seq FROM events e JOIN streams s ON s.id = e.stream_id WHERE ", where,
                                " ORDER BY e.id"));
      ASSERT_EQ(static_cast<int64_t>(events.size()), (frames + 2) / 3);
      for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i][0], static_cast<int64_t>(3 * i));
    }
  }

  fs::path dir_;
  std::string key_;
  AggregatorConfig config_;
};

TEST_F(LinksTest, RandomFaultsOnTheLinkLoseDuplicateAndReorderNothing) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "fault schedule seed " << seed);
  std::fprintf(stderr, "fault schedule seed %llu\n", static_cast<unsigned long long>(seed));
  auto agg = Start();
  ASSERT_TRUE(agg);
  FaultPlan plan(seed);
  plan.drop = 0.01;
  plan.duplicate = 0.03;
  plan.reorder = 0.01;
  plan.delay = 0.05;
  plan.cut = 0.004;
  auto dialer = std::make_shared<TestDialer>(transport::MakeTcpDialer("127.0.0.1", agg->listen_port()), &plan);
  Outbox outbox(100000);
  Edge edge;
  auto courier = transport::Courier::Start(Options({transport::MakeFramedLink(dialer, {"tcp", key_})}), &outbox, &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  const std::vector<std::string> streams = {"cam0", "cam1", "cam2"};
  constexpr int64_t kFrames = 600;
  for (int64_t part = 0; part < 6; ++part) {  // published while sessions come and go
    Publish(outbox, streams, static_cast<uint64_t>(part) * (kFrames / 6), kFrames / 6);
  }
  ASSERT_TRUE(outbox.WaitEmpty(kLong)) << outbox.Stats().pending << " pending";
  const transport::CourierStats cs = (*courier)->Stats();
  (*courier)->Close();
  agg->Stop();
  std::fprintf(stderr, "faults: drop %d duplicate %d reorder %d delay %d cut %d; sessions %llu, ack timeouts %llu\n",
               plan.count("drop"), plan.count("duplicate"), plan.count("reorder"), plan.count("delay"),
               plan.count("cut"), static_cast<unsigned long long>(cs.sessions),
               static_cast<unsigned long long>(cs.ack_timeouts));
  ExpectStoredOnceInOrder(streams, kFrames);
  EXPECT_EQ(edge.rejects.load(), 0);
  EXPECT_EQ(edge.fenced.load(), 0);
  EXPECT_EQ(cs.epoch, 1u);  // one instance: granted once, re-admitted after every fault
  // The schedule did its work (with these rates several faults of each kind are all but certain over
  // ~1,200 reports plus their re-sends and acks; the seed above replays it).
  EXPECT_GT(plan.count("duplicate") + plan.count("drop") + plan.count("reorder") + plan.count("cut"), 0);
  EXPECT_GT(cs.sessions, 1u);
}

TEST_F(LinksTest, MutualTlsOnTheTcpLinkAdmitsTheEdgeWithItsCertificateAndRefusesOneWithout) {
  StatusOr<testing::TestCerts> certs = testing::MakeTestCerts((dir_ / "certs").string());
  ASSERT_TRUE(certs.ok()) << certs.status();
  config_.tls_cert_file = certs->server_cert;
  config_.tls_key_file = certs->server_key;
  config_.tls_client_ca_file = certs->ca_cert;
  auto agg = Start();
  ASSERT_TRUE(agg);
  auto tls_dialer = [&](bool with_cert) {
    transport::TlsOptions o;
    o.ca_file = certs->ca_cert;
    if (with_cert) {
      o.cert_file = certs->client_cert;
      o.key_file = certs->client_key;
    }
    StatusOr<std::shared_ptr<transport::TlsContext>> ctx = transport::TlsContext::Client(o);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    return std::shared_ptr<Dialer>(
        transport::MakeTlsDialer(transport::MakeTcpDialer("127.0.0.1", agg->listen_port()), *ctx, "127.0.0.1"));
  };
  // Without a client certificate: the TLS handshake fails; the edge's key alone does not get it in.
  {
    auto link = transport::MakeFramedLink(tls_dialer(false), {"tcp", key_});
    StatusOr<transport::Welcome> w =
        link->Open(transport::Hello{kEdge, 0, transport::kProtocolVersion}, milliseconds(5000));
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
  }
  Outbox outbox(1000);
  Edge edge;
  auto courier =
      transport::Courier::Start(Options({transport::MakeFramedLink(tls_dialer(true), {"tcp", key_})}), &outbox, &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  Publish(outbox, {"cam0"}, 0, 60);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  (*courier)->Close();
  ASSERT_TRUE(Eventually([&] {
    return agg->metrics().Render().find("vigil_transport_rejected_total{link=\"tcp\",reason=\"tls\"} 1\n") !=
           std::string::npos;
  }, kLong));
  agg->Stop();
  ExpectStoredOnceInOrder({"cam0"}, 60);
  EXPECT_EQ(Rows("SELECT COUNT(*) FROM edges")[0][0], 1);
}

// cuda_ipc against the real aggregator (rings in shared host memory here; cuda:N on the GPU machine, where
// the two sides run as two processes: scripts/gpu-check.sh). The aggregator stops mid-run and comes back:
// the edge falls back to tcp while the ring side is gone, then returns to the ring; every frame once, in order.
TEST_F(LinksTest, CudaIpcOnAGpuThatCannotHoldRingsFailsTheStartNamingIt) {
  config_.cuda_ipc_enabled = true;
  config_.cuda_ipc_socket = (dir_ / "agg.sock").string();
  config_.cuda_ipc_device = "cuda:99";
  StatusOr<std::unique_ptr<Aggregator>> a = Aggregator::Start(config_);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(std::string(a.status().message()).starts_with("cuda_ipc.device cuda:99: ")) << a.status();
}

TEST_F(LinksTest, CudaIpcRingStoresEverythingOnceAcrossAnAggregatorRestart) {
  config_.cuda_ipc_enabled = true;
  config_.cuda_ipc_socket = (dir_ / "agg.sock").string();
  config_.cuda_ipc_device = "host";
  config_.cuda_ipc_slots = 8;
  config_.cuda_ipc_slot_bytes = 4096;
  config_.allow = {"127.0.0.1/32"};  // IP listeners only: the socket's peers are checked by uid
  auto agg = Start();
  ASSERT_TRUE(agg);
  const uint16_t tcp_port = agg->listen_port();
  config_.listen_port = tcp_port;  // the restarted aggregator listens where the edge dials
  Outbox outbox(100000);
  Edge edge;
  auto courier = transport::Courier::Start(
      Options({transport::MakeCudaIpcLink(config_.cuda_ipc_socket, key_),
               transport::MakeFramedLink(transport::MakeTcpDialer("127.0.0.1", tcp_port), {"tcp", key_})}),
      &outbox, &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  const std::vector<std::string> streams = {"cam0", "cam1"};
  Publish(outbox, streams, 0, 200);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ((*courier)->Stats().link, "cuda_ipc");
  std::string metrics = agg->metrics().Render();
  EXPECT_NE(metrics.find("vigil_transport_connections_total{link=\"cuda_ipc\",result=\"authenticated\"} 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("vigil_cuda_ipc_slots_total 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("vigil_cuda_ipc_slots_rejected_total 0\n"), std::string::npos) << metrics;

  agg->Stop();  // gone: reports queue in the outbox
  agg.reset();
  Publish(outbox, streams, 200, 100);
  agg = Start();
  ASSERT_TRUE(agg);
  Publish(outbox, streams, 300, 100);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().link == "cuda_ipc"; }, kLong));
  const transport::CourierStats cs = (*courier)->Stats();
  (*courier)->Close();
  agg->Stop();
  ExpectStoredOnceInOrder(streams, 400);
  // The IP allow-list (127.0.0.1/32) does not apply to the Unix socket: nothing refused there by address.
  EXPECT_NE(metrics.find("vigil_transport_rejected_total{link=\"cuda_ipc\",reason=\"address\"} 0\n"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(cs.links[0].kind, "cuda_ipc");
  EXPECT_EQ(cs.links[0].transports, "shm");
  EXPECT_GE(cs.links[0].sessions, 2u);
  EXPECT_EQ(cs.epoch, 1u);  // the same instance: re-admitted with its epoch
}

// Snapshots travel beside the reports on each link kind (cuda_ipc: on its Unix socket, not through the ring) and
// the aggregator stores each once, whether its event came before or after it.
TEST_F(LinksTest, SnapshotsAreStoredOnceOverTcpAndCudaIpc) {
  config_.cuda_ipc_enabled = true;
  config_.cuda_ipc_socket = (dir_ / "agg.sock").string();
  config_.cuda_ipc_device = "host";
  auto agg = Start();
  ASSERT_TRUE(agg);
  auto picture = [](const std::string& stream, uint64_t seq, int32_t box, size_t bytes) {
    transport::Snapshot s{stream, 1, seq, box, 0, 0, 64, 48, 64, 48, std::string(bytes, '\x11')};
    s.jpeg[0] = '\xFF';
    s.jpeg[1] = '\xD8';
    s.jpeg[2] = '\xFF';
    return s;
  };
  struct Case {
    const char* link;
    std::shared_ptr<transport::Link> make;
  } cases[] = {
      {"tcp", transport::MakeFramedLink(transport::MakeTcpDialer("127.0.0.1", agg->listen_port()), {"tcp", key_})},
      {"cuda_ipc", transport::MakeCudaIpcLink(config_.cuda_ipc_socket, key_)},
  };
  uint64_t expected = 0;
  for (Case& c : cases) {
    SCOPED_TRACE(c.link);
    const std::string stream = StrCat("cam-", c.link);
    Outbox outbox(1000);
    Edge edge;
    auto courier = transport::Courier::Start(Options({c.make}), &outbox, &edge);
    ASSERT_TRUE(courier.ok()) << courier.status();
    ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().connected; }, kLong));
    // One picture before its event is reported, one after, a large one (600 KB: a frame's socket write in many
    // pieces) and a repeat.
    ASSERT_TRUE((*courier)->OfferSnapshot(picture(stream, 0, -1, 2000)));
    Publish(outbox, {stream}, 0, 9);
    ASSERT_TRUE(outbox.WaitEmpty(kLong));
    ASSERT_TRUE((*courier)->OfferSnapshot(picture(stream, 3, -1, 600000)));
    ASSERT_TRUE((*courier)->OfferSnapshot(picture(stream, 3, 0, 3000)));
    ASSERT_TRUE((*courier)->OfferSnapshot(picture(stream, 3, 0, 3000)));
    ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().snapshots_sent == 4; }, kLong));
    EXPECT_EQ((*courier)->Stats().link, c.link);
    expected += 3;
    ASSERT_TRUE(Eventually(
        [&] {
          auto rows = Rows(StrCat("SELECT COUNT(*) FROM snapshots WHERE stream = '", stream, "'"));
          return rows.size() == 1 && rows[0][0] == 3;
        },
        kLong));
    auto sizes = Rows(StrCat("SELECT seq, box, length(jpeg) FROM snapshots WHERE stream = '", stream,
                             "' ORDER BY seq, box"));
    ASSERT_EQ(sizes.size(), 3u);
    EXPECT_EQ(sizes[0], (std::vector<int64_t>{0, -1, 2000}));
    EXPECT_EQ(sizes[1], (std::vector<int64_t>{3, -1, 600000}));
    EXPECT_EQ(sizes[2], (std::vector<int64_t>{3, 0, 3000}));
    (*courier)->Close();
  }
  const std::string metrics = agg->metrics().Render();
  EXPECT_NE(metrics.find(StrCat("vigil_aggregator_snapshots_total{result=\"stored\"} ", expected, "\n")),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("vigil_aggregator_snapshots_total{result=\"duplicate\"} 2\n"), std::string::npos) << metrics;
  agg->Stop();
}

#if VIGIL_HAVE_UCX
TEST_F(LinksTest, UcxCutMidStreamFallsBackToTcpAndComesBackWhenRestored) {
  config_.ucx_enabled = true;
  config_.ucx_host = "127.0.0.1";
  config_.ucx_port = 0;
  auto agg = Start();
  ASSERT_TRUE(agg);
  ASSERT_NE(agg->ucx_port(), 0);
  auto ucx = std::make_shared<TestDialer>(transport::MakeUcxDialer("127.0.0.1", agg->ucx_port()), nullptr);
  auto tcp = std::make_shared<TestDialer>(transport::MakeTcpDialer("127.0.0.1", agg->listen_port()), nullptr);
  Outbox outbox(100000);
  Edge edge;
  auto courier = transport::Courier::Start(
      Options({transport::MakeFramedLink(ucx, {"ucx", key_}), transport::MakeFramedLink(tcp, {"tcp", key_})}), &outbox,
      &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  const std::vector<std::string> streams = {"cam0", "cam1"};
  auto sent = [&](size_t link) { return (*courier)->Stats().links[link].sent; };

  // Phase 1: UCX.
  Publish(outbox, streams, 0, 150);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  const uint64_t ucx1 = sent(0), tcp1 = sent(1);
  EXPECT_GT(ucx1, 0u);
  EXPECT_EQ(tcp1, 0u);
  EXPECT_EQ((*courier)->Stats().link, "ucx");

  // Phase 2: UCX cut mid-stream: the session breaks, the next one runs on TCP.
  ucx->SetDown(true);
  Publish(outbox, streams, 150, 150);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  const uint64_t ucx2 = sent(0), tcp2 = sent(1);
  EXPECT_EQ(ucx2, ucx1);
  EXPECT_GT(tcp2, 0u);
  EXPECT_EQ((*courier)->Stats().link, "tcp");

  // Phase 3: UCX restored: a probe finds it and the courier moves back.
  ucx->SetDown(false);
  ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().fail_backs == 1 && (*courier)->Stats().link == "ucx"; }, kLong));
  Publish(outbox, streams, 300, 150);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_GT(sent(0), ucx2);
  EXPECT_EQ(sent(1), tcp2);
  const transport::CourierStats cs = (*courier)->Stats();
  (*courier)->Close();
  const std::string metrics = agg->metrics().Render();
  agg->Stop();

  ExpectStoredOnceInOrder(streams, 450);
  EXPECT_EQ(cs.link_switches, 2u);
  EXPECT_EQ(cs.fail_backs, 1u);
  EXPECT_EQ(cs.epoch, 1u);
  // The aggregator saw both links; each authenticated its sessions.
  EXPECT_NE(metrics.find("vigil_transport_connections_total{link=\"ucx\",result=\"authenticated\"}"), std::string::npos);
  EXPECT_NE(metrics.find("vigil_transport_connections_total{link=\"tcp\",result=\"authenticated\"} 1\n"),
            std::string::npos)
      << metrics;
}
#endif

}  // namespace
}  // namespace vigil::aggregator
