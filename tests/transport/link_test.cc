// Publisher ↔ receiver on loopback (127.0.0.1, ephemeral ports), with a fault-injecting Dialer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "vigil/transport/publisher.h"
#include "vigil/transport/receiver.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
using Key = std::tuple<std::string, uint64_t, uint64_t>;  // stream, run, seq_first

// Stores reports once per key and acks each, like the aggregator without SQL.
class RecordingHandler : public ReceiverHandler {
 public:
  Status OnHello(const std::shared_ptr<Session>& s) override {
    std::lock_guard lock(mu_);
    hellos.push_back(s->edge());
    if (!refuse_hello.empty()) return absl::PermissionDeniedError(refuse_hello);
    return absl::OkStatus();
  }
  void OnReport(const std::shared_ptr<Session>& s, Report r) override {
    std::unique_lock lock(mu_);
    ++received;
    if (reject_below_epoch > r.epoch) {
      lock.unlock();
      (void)s->Send(
          Reject{RejectReason::kStaleEpoch, r.stream, r.run, r.seq_first, r.seq_last, reject_below_epoch, "stale"});
      return;
    }
    const Key key{r.stream, r.run, r.seq_first};
    if (stored_keys.insert(key).second) {
      first_arrivals.push_back(key);
      for (uint64_t s2 = r.seq_first; s2 <= r.seq_last; ++s2) seqs[{r.stream, r.run}].insert(s2);
    } else {
      ++duplicates;
    }
    std::set<uint64_t>& have = seqs[{r.stream, r.run}];
    int64_t through = -1;
    while (have.count(static_cast<uint64_t>(through + 1))) ++through;
    lock.unlock();
    if (!silent.load()) (void)s->Send(Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, through});
    cv_.notify_all();
  }
  void OnClose(const std::shared_ptr<Session>&, const Status&) override {
    std::lock_guard lock(mu_);
    ++closes;
  }
  // Waits until `n` distinct reports are stored.
  bool WaitStored(size_t n, milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stored_keys.size() >= n; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> hellos;
  std::set<Key> stored_keys;
  std::vector<Key> first_arrivals;
  std::map<std::pair<std::string, uint64_t>, std::set<uint64_t>> seqs;
  size_t received = 0, duplicates = 0, closes = 0;
  uint64_t reject_below_epoch = 0;
  std::string refuse_hello;
  std::atomic<bool> silent{false};  // stop acking (to keep reports in flight)
};

// The seam: wraps the TCP dialer. Each connection dies after a random number of written bytes
// (mid-frame or between frames): the bytes up to the budget arrive, the rest is lost, and the next
// write fails as on a reset link (acks for what arrived may still come back meanwhile). Writes may
// be delayed, and dialing may be switched off.
struct Faults {
  std::mt19937_64 rng;
  std::mutex mu;
  size_t cut_min = 0, cut_max = 0;  // 0 = never cut
  milliseconds write_delay{0};
  std::atomic<bool> down{false};
  std::atomic<int> cuts{0};
  size_t NextBudget() {
    std::lock_guard lock(mu);
    if (cut_max == 0) return SIZE_MAX;
    return std::uniform_int_distribution<size_t>(cut_min, cut_max)(rng);
  }
};

class FaultyConnection : public Connection {
 public:
  FaultyConnection(std::unique_ptr<Connection> inner, Faults* f)
      : inner_(std::move(inner)), f_(f), budget_(f->NextBudget()) {}
  Status Write(std::string_view bytes, milliseconds timeout) override {
    if (f_->write_delay.count() > 0) std::this_thread::sleep_for(f_->write_delay);
    if (dead_) {
      ++f_->cuts;
      inner_->Shutdown();
      return absl::UnavailableError("injected cut");
    }
    if (bytes.size() > budget_) {
      dead_ = true;
      return inner_->Write(bytes.substr(0, budget_), timeout);  // the rest is lost on the way
    }
    budget_ -= bytes.size();
    return inner_->Write(bytes, timeout);
  }
  StatusOr<size_t> Read(char* buf, size_t max, milliseconds timeout) override {
    return inner_->Read(buf, max, timeout);
  }
  void Shutdown() override { inner_->Shutdown(); }
  std::string peer() const override { return inner_->peer(); }

 private:
  std::unique_ptr<Connection> inner_;
  Faults* f_;
  size_t budget_;
  bool dead_ = false;
};

class FaultyDialer : public Dialer {
 public:
  FaultyDialer(uint16_t port, Faults* f) : port(port), f_(f) {}
  StatusOr<std::unique_ptr<Connection>> Dial(milliseconds timeout) override {
    if (f_->down.load()) return absl::UnavailableError("injected: aggregator unreachable");
    VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Connection> c, MakeTcpDialer("127.0.0.1", port.load())->Dial(timeout));
    return std::unique_ptr<Connection>(new FaultyConnection(std::move(c), f_));
  }
  std::string target() const override { return StrCat("faulty:127.0.0.1:", port.load()); }

  std::atomic<uint16_t> port;  // where the aggregator is now

 private:
  Faults* f_;
};

TcpPublisherOptions FastOptions(std::shared_ptr<Dialer> dialer) {
  TcpPublisherOptions o;
  o.edge = "edge-1";
  o.epoch = 7;
  o.dialer = std::move(dialer);
  o.backoff_initial = milliseconds(5);
  o.backoff_max = milliseconds(40);
  o.heartbeat_interval = milliseconds(100);
  o.peer_timeout = milliseconds(2000);
  return o;
}

std::unique_ptr<TcpReceiver> StartReceiver(RecordingHandler* h, ReceiverOptions o = {}) {
  o.host = "127.0.0.1";
  o.port = 0;
  StatusOr<std::unique_ptr<TcpReceiver>> r = TcpReceiver::Start(o, h);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

// Publishes frames 0..n-1 of each stream: every 5th an event, the 4 between as one progress range.
std::vector<Key> PublishMix(Publisher& p, const std::vector<std::string>& streams, uint64_t n, uint64_t run = 1) {
  std::vector<Key> order;
  for (uint64_t seq = 0; seq < n;) {
    const uint64_t last = seq % 5 == 0 ? seq : std::min(n - 1, seq - seq % 5 + 4);
    for (const std::string& s : streams) {
      Report r;
      r.stream = s;
      r.run = run;
      r.seq_first = seq;
      r.seq_last = last;
      r.kind = seq % 5 == 0 ? ReportKind::kEvent : ReportKind::kProgress;
      if (r.kind == ReportKind::kEvent) r.detections.push_back({0, 0.9f, 1, 2, 3, 4, "person"});
      Status st = p.Publish(r, std::chrono::hours(1));
      EXPECT_TRUE(st.ok()) << st;
      order.emplace_back(s, run, seq);
    }
    seq = last + 1;
  }
  return order;
}

TEST(LinkTest, DeliversInOrderAndTracksAcks) {
  RecordingHandler h;
  auto rx = StartReceiver(&h);
  ASSERT_TRUE(rx);
  auto pub = MakeTcpPublisher(FastOptions(std::shared_ptr<Dialer>(MakeTcpDialer("127.0.0.1", rx->port()))));
  ASSERT_TRUE(pub.ok()) << pub.status();
  const std::vector<Key> order = PublishMix(**pub, {"cam0", "cam1"}, 300);
  ASSERT_TRUE((*pub)->Flush(milliseconds(10000)));
  EXPECT_EQ(h.first_arrivals, order);
  EXPECT_EQ(h.duplicates, 0u);
  EXPECT_EQ(h.hellos, std::vector<std::string>{"edge-1"});
  EXPECT_EQ((*pub)->AckedThrough("cam0", 1), 299u);
  EXPECT_EQ((*pub)->AckedThrough("cam1", 1), 299u);
  EXPECT_EQ((*pub)->AckedThrough("cam1", 2), std::nullopt);
  PublisherStats s = (*pub)->Stats();
  EXPECT_EQ(s.published, order.size());
  EXPECT_EQ(s.acked, order.size());
  EXPECT_EQ(s.outbox, 0u);
  EXPECT_EQ(s.connects, 1u);
  EXPECT_EQ(s.resent, 0u);
  EXPECT_TRUE(s.connected);
}

TEST(LinkTest, CutConnectionsAreRedialedAndEverythingArrivesOnceInOrder) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  RecordingHandler h;
  auto rx = StartReceiver(&h);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(seed)};
  faults.cut_min = 1;
  faults.cut_max = 8000;  // up to ~60 report frames per connection
  auto pub = MakeTcpPublisher(FastOptions(std::make_shared<FaultyDialer>(rx->port(), &faults)));
  ASSERT_TRUE(pub.ok());
  const std::vector<Key> order = PublishMix(**pub, {"a", "b", "c"}, 400);
  ASSERT_TRUE((*pub)->Flush(milliseconds(20000))) << (*pub)->Stats().outbox << " left";
  EXPECT_EQ(h.first_arrivals, order);  // each report stored once, in publish order
  EXPECT_GT(faults.cuts.load(), 3);
  PublisherStats s = (*pub)->Stats();
  EXPECT_EQ(s.acked, order.size());
  EXPECT_GT(s.connects, 3u);
  EXPECT_EQ(s.disconnects + 1, s.connects);
  EXPECT_EQ(h.received, order.size() + h.duplicates);
  for (const char* stream : {"a", "b", "c"}) EXPECT_EQ((*pub)->AckedThrough(stream, 1), 399u) << stream;
  EXPECT_EQ(rx->Stats().accepted, s.connects);
}

TEST(LinkTest, UnackedReportsAreResentInOrderAfterTheAggregatorComesBack) {
  RecordingHandler h;
  auto rx = StartReceiver(&h);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(1)};
  auto dialer = std::make_shared<FaultyDialer>(rx->port(), &faults);
  auto pub = MakeTcpPublisher(FastOptions(dialer));
  ASSERT_TRUE(pub.ok());
  h.silent = true;  // stored but never acknowledged, as if the aggregator died before acking
  const std::vector<Key> order = PublishMix(**pub, {"cam"}, 40);
  ASSERT_TRUE(h.WaitStored(order.size(), milliseconds(5000)));
  EXPECT_EQ((*pub)->Stats().outbox, order.size());
  EXPECT_EQ((*pub)->AckedThrough("cam", 1), std::nullopt);

  rx->Stop();  // the connection drops; dials to the old port are refused meanwhile
  RecordingHandler h2;
  auto rx2 = StartReceiver(&h2);
  ASSERT_TRUE(rx2);
  dialer->port = rx2->port();
  ASSERT_TRUE((*pub)->Flush(milliseconds(10000)));
  EXPECT_EQ(h2.first_arrivals, order);
  EXPECT_EQ(h2.duplicates, 0u);
  PublisherStats s = (*pub)->Stats();
  EXPECT_EQ(s.resent, order.size());
  EXPECT_EQ(s.sent, 2 * order.size());
  EXPECT_EQ(s.acked, order.size());
  EXPECT_EQ(s.connects, 2u);
  EXPECT_GE(s.disconnects, 1u);
  EXPECT_EQ((*pub)->AckedThrough("cam", 1), 39u);
}

TEST(LinkTest, FullOutboxAppliesBackpressureUntilAcked) {
  RecordingHandler h;
  auto rx = StartReceiver(&h);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(1)};
  faults.down = true;
  TcpPublisherOptions o = FastOptions(std::make_shared<FaultyDialer>(rx->port(), &faults));
  o.max_outbox = 4;
  auto pub = MakeTcpPublisher(o);
  ASSERT_TRUE(pub.ok());
  Report r;
  r.stream = "cam";
  for (uint64_t seq = 0; seq < 4; ++seq) {
    r.seq_first = r.seq_last = seq;
    ASSERT_TRUE((*pub)->Publish(r, milliseconds(0)).ok());
  }
  r.seq_first = r.seq_last = 4;
  Status st = (*pub)->Publish(r, milliseconds(20));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ((*pub)->Stats().backpressure, 1u);
  EXPECT_GT((*pub)->Stats().connect_failures, 0u);
  EXPECT_EQ((*pub)->Stats().last_error, "injected: aggregator unreachable");
  faults.down = false;  // a blocked Publish completes once acks free room
  st = (*pub)->Publish(r, milliseconds(10000));
  EXPECT_TRUE(st.ok()) << st;
  ASSERT_TRUE((*pub)->Flush(milliseconds(10000)));
  EXPECT_EQ(h.stored_keys.size(), 5u);
  (*pub)->Close();
  EXPECT_EQ((*pub)->Publish(r, milliseconds(0)).code(), absl::StatusCode::kCancelled);
}

TEST(LinkTest, StaleEpochRejectsFreeTheOutboxAndMarkTheEdgeFenced) {
  RecordingHandler h;
  h.reject_below_epoch = 8;
  auto rx = StartReceiver(&h);
  ASSERT_TRUE(rx);
  auto pub = MakeTcpPublisher(FastOptions(std::shared_ptr<Dialer>(MakeTcpDialer("127.0.0.1", rx->port()))));
  ASSERT_TRUE(pub.ok());
  PublishMix(**pub, {"cam"}, 10);  // epoch 7 < 8
  ASSERT_TRUE((*pub)->Flush(milliseconds(5000)));
  PublisherStats s = (*pub)->Stats();
  EXPECT_EQ(s.rejected, 4u);  // events 0, 5 and progress 1..4, 6..9
  EXPECT_EQ(s.acked, 0u);
  EXPECT_TRUE(s.fenced);
  EXPECT_TRUE(h.stored_keys.empty());
}

TEST(LinkTest, IdleLinkStaysUpOnHeartbeats) {
  RecordingHandler h;
  ReceiverOptions ro;
  ro.peer_timeout = milliseconds(400);
  auto rx = StartReceiver(&h, ro);
  ASSERT_TRUE(rx);
  TcpPublisherOptions o = FastOptions(std::shared_ptr<Dialer>(MakeTcpDialer("127.0.0.1", rx->port())));
  o.heartbeat_interval = milliseconds(50);
  o.peer_timeout = milliseconds(400);
  auto pub = MakeTcpPublisher(o);
  ASSERT_TRUE(pub.ok());
  std::this_thread::sleep_for(milliseconds(1200));  // three peer timeouts without reports
  PublisherStats s = (*pub)->Stats();
  EXPECT_EQ(s.connects, 1u);
  EXPECT_EQ(s.disconnects, 0u);
  EXPECT_EQ(rx->Stats().timeouts, 0u);
  EXPECT_GE(rx->Stats().frames, 10u);  // Hello + heartbeats
}

// A raw client: sends `bytes`, then reads until the receiver closes; returns the decoded replies.
std::vector<Message> RawExchange(uint16_t port, const std::string& bytes) {
  StatusOr<std::unique_ptr<Connection>> c = MakeTcpDialer("127.0.0.1", port)->Dial(milliseconds(2000));
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  EXPECT_TRUE((*c)->Write(bytes, milliseconds(2000)).ok());
  FrameDecoder d;
  std::vector<Message> replies;
  char buf[4096];
  for (;;) {
    StatusOr<size_t> n = (*c)->Read(buf, sizeof buf, milliseconds(5000));
    if (!n.ok()) {
      EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable) << n.status();  // closed, not timed out
      break;
    }
    d.Feed(std::string_view(buf, *n));
    while (true) {
      StatusOr<std::optional<Message>> m = d.Next();
      if (!m.ok() || !*m) break;
      replies.push_back(**m);
    }
  }
  return replies;
}

std::string RejectDetail(const std::vector<Message>& replies) {
  if (replies.empty() || !std::holds_alternative<Reject>(replies.back())) return "<no reject>";
  return std::get<Reject>(replies.back()).detail;
}

TEST(LinkTest, MisbehavingClientsLoseOnlyTheirOwnConnection) {
  RecordingHandler h;
  ReceiverOptions ro;
  ro.peer_timeout = milliseconds(300);
  auto rx = StartReceiver(&h, ro);
  ASSERT_TRUE(rx);
  // A well-behaved publisher keeps working throughout.
  auto pub = MakeTcpPublisher(FastOptions(std::shared_ptr<Dialer>(MakeTcpDialer("127.0.0.1", rx->port()))));
  ASSERT_TRUE(pub.ok());

  const std::string hello = EncodeFrame(Hello{"edge-x", 1, kProtocolVersion});
  Report r;
  r.edge = "edge-x";
  r.stream = "s";
  std::string corrupt = EncodeFrame(r);
  corrupt[corrupt.size() - 1] ^= 0x40;
  Report other = r;
  other.edge = "edge-y";

  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), "GET /metrics HTTP/1.1\r\n\r\n")),
            "frame: bad magic 0x20544547 (expected 0x4C494756 'VGIL'): not a vigil report stream");
  EXPECT_TRUE(RejectDetail(RawExchange(rx->port(), hello + corrupt)).starts_with("frame: CRC-32 mismatch"));
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), EncodeFrame(r))), "the first message must be Hello");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + EncodeFrame(other))),
            "a report from edge 'edge-y' on the connection of 'edge-x'");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + hello)), "a second Hello");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), EncodeFrame(Hello{"edge-x", 1, 9}))),
            "Hello: protocol version 9 not supported (this aggregator speaks 1)");
  std::vector<Message> v2 = RawExchange(rx->port(), [&] {
    std::string f = hello;
    f[4] = 2;
    return f;
  }());
  ASSERT_FALSE(v2.empty());
  EXPECT_EQ(std::get<Reject>(v2.back()).reason, RejectReason::kUnsupportedVersion);
  // Half a frame, then silence: closed after peer_timeout.
  EXPECT_TRUE(RawExchange(rx->port(), hello + EncodeFrame(r).substr(0, 20)).empty());
  // A Heartbeat is echoed.
  std::vector<Message> echo = RawExchange(rx->port(), hello + EncodeFrame(Heartbeat{42}));
  ASSERT_FALSE(echo.empty());
  EXPECT_EQ(echo.front(), Message(Heartbeat{42}));

  PublishMix(**pub, {"good"}, 50);
  ASSERT_TRUE((*pub)->Flush(milliseconds(5000)));
  EXPECT_EQ((*pub)->AckedThrough("good", 1), 49u);
  ReceiverStats s = rx->Stats();
  EXPECT_EQ(s.protocol_errors, 7u);
  EXPECT_EQ(s.timeouts, 2u);  // the half frame and the heartbeat client
  EXPECT_EQ(s.accepted, 10u);
  EXPECT_EQ((*pub)->Stats().connects, 1u);
}

TEST(LinkTest, RefusedHelloAndConnectionLimit) {
  RecordingHandler h;
  ReceiverOptions ro;
  ro.max_connections = 1;
  auto rx = StartReceiver(&h, ro);
  ASSERT_TRUE(rx);
  {
    std::lock_guard lock(h.mu_);
    h.refuse_hello = "edge-x is not allowed";
  }
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), EncodeFrame(Hello{"edge-x", 1, kProtocolVersion}))),
            "edge-x is not allowed");
  {
    std::lock_guard lock(h.mu_);
    h.refuse_hello.clear();
  }
  auto pub = MakeTcpPublisher(FastOptions(std::shared_ptr<Dialer>(MakeTcpDialer("127.0.0.1", rx->port()))));
  ASSERT_TRUE(pub.ok());
  PublishMix(**pub, {"cam"}, 1);
  ASSERT_TRUE((*pub)->Flush(milliseconds(5000)));
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), "")), "too many connections");
  EXPECT_EQ(rx->Stats().refused, 1u);
}

TEST(BackoffTest, DoublesUpToTheCapWithJitterInTheUpperHalf) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Backoff b(milliseconds(100), milliseconds(1000), seed);
  for (int64_t d : {100, 200, 400, 800, 1000, 1000, 1000}) {
    const int64_t got = b.Next().count();
    EXPECT_GE(got, d / 2);
    EXPECT_LE(got, d);
  }
  b.Reset();
  EXPECT_LE(b.Next().count(), 100);
}

TEST(PublisherOptionsTest, InvalidOptionsAreNamed) {
  TcpPublisherOptions o;
  EXPECT_EQ(std::string(MakeTcpPublisher(o).status().message()), "publisher options: edge id must be 1..65535 bytes");
  o.edge = "e";
  EXPECT_EQ(std::string(MakeTcpPublisher(o).status().message()),
            "publisher options: aggregator host and port are required");
  o.host = "127.0.0.1";
  o.port = 1;
  o.peer_timeout = o.heartbeat_interval;
  EXPECT_EQ(std::string(MakeTcpPublisher(o).status().message()),
            "publisher options: timeouts must be > 0 and peer_timeout longer than heartbeat_interval");
}

}  // namespace
}  // namespace vigil::transport
