// Outbox + TcpLink + Courier against Receiver on loopback (127.0.0.1, ephemeral ports), with a
// fault-injecting Dialer, and misbehaving raw clients against the receiver.
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

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "testing/eventually.h"
#include "vigil/transport/courier.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/unix_socket.h"
#include "vigil/transport/link.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/receiver.h"

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using Key = std::tuple<std::string, uint64_t, uint64_t>;  // stream, run, seq_first

constexpr milliseconds kLong{20000};  // generous: the machine is busy

using testutil::Eventually;

// The aggregator without SQL: grants epochs like protocol.h says (0 or promote → new, equal → re-admit,
// lower → kFenced), stores reports once per key and acks each.
class TestAggregator : public ReceiverHandler {
 public:
  Status OnHello(const std::shared_ptr<Session>& s) override {
    std::vector<std::shared_ptr<Session>> evicted;
    std::unique_lock lock(mu_);
    hellos.push_back(s->edge());
    if (!refuse_hello.empty()) return absl::PermissionDeniedError(refuse_hello);
    if (s->edge().starts_with("pending")) {  // never admitted
      sessions.push_back(s);
      return absl::OkStatus();
    }
    uint64_t& current = epochs[s->edge()];
    const Hello& h = s->hello();
    uint64_t granted = 0;
    if (h.epoch == 0 || (h.flags & kHelloPromote) != 0) {
      granted = ++current;
      evicted = TakeSessions(s->edge());
    } else if (h.epoch == current) {
      granted = current;
    } else {
      lock.unlock();
      s->Refuse(RejectReason::kFenced, current, StrCat("epoch ", h.epoch, " is not ", current));
      return absl::OkStatus();
    }
    sessions.push_back(s);
    Welcome w{granted, {}};
    for (const HelloStream& hs : h.streams) w.streams.push_back({hs.stream, hs.run, -1, -1});
    lock.unlock();
    for (auto& old : evicted) old->Refuse(RejectReason::kFenced, granted, "a newer instance was admitted");
    s->Admit(w);
    cv_.notify_all();
    return absl::OkStatus();
  }

  void OnReport(const std::shared_ptr<Session>& s, Report r) override {
    std::unique_lock lock(mu_);
    ++received;
    const Key key{r.stream, r.run, r.seq_first};
    if (stored_keys.insert(key).second) {
      first_arrivals.push_back(key);
      reports.push_back(r);
      for (uint64_t q = r.seq_first; q <= r.seq_last; ++q) seqs[{r.stream, r.run}].insert(q);
    } else {
      ++duplicates;
    }
    std::set<uint64_t>& have = seqs[{r.stream, r.run}];
    int64_t through = -1;
    while (have.count(static_cast<uint64_t>(through + 1))) ++through;
    lock.unlock();
    if (!silent.load()) (void)s->Enqueue(EncodeFrame(Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, through}));
    cv_.notify_all();
  }

  void OnClose(const std::shared_ptr<Session>& s, const Status&) override {
    std::lock_guard lock(mu_);
    ++closes;
    std::erase(sessions, s);
    cv_.notify_all();
  }

  // Grants a new epoch to `edge` as if another instance said Hello: evicts its sessions.
  uint64_t GrantNewEpoch(const std::string& edge) {
    std::unique_lock lock(mu_);
    const uint64_t granted = ++epochs[edge];
    std::vector<std::shared_ptr<Session>> evicted = TakeSessions(edge);
    lock.unlock();
    for (auto& old : evicted) old->Refuse(RejectReason::kFenced, granted, "a newer instance was admitted");
    return granted;
  }
  // Closes every session (no Reject), as a network failure would.
  void CloseAll() {
    std::unique_lock lock(mu_);
    std::vector<std::shared_ptr<Session>> all = sessions;
    lock.unlock();
    for (auto& s : all) s->Close();
  }
  bool WaitStored(size_t n, milliseconds timeout = kLong) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stored_keys.size() >= n; });
  }
  std::shared_ptr<Session> WaitSession(const std::string& edge, milliseconds timeout = kLong) {
    std::unique_lock lock(mu_);
    std::shared_ptr<Session> found;
    cv_.wait_for(lock, timeout, [&] {
      for (auto& s : sessions) {
        if (s->edge() == edge) found = s;
      }
      return found != nullptr;
    });
    return found;
  }
  template <typename T>
  T Get(const T& field) {
    std::lock_guard lock(mu_);
    return field;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, uint64_t> epochs;  // durable in the real aggregator: copy it to a restarted one
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::string> hellos;
  std::set<Key> stored_keys;
  std::vector<Key> first_arrivals;
  std::vector<Report> reports;
  std::map<std::pair<std::string, uint64_t>, std::set<uint64_t>> seqs;
  size_t received = 0, duplicates = 0, closes = 0;
  std::string refuse_hello;
  std::atomic<bool> silent{false};  // stop acking (to keep reports in flight)

 private:
  std::vector<std::shared_ptr<Session>> TakeSessions(const std::string& edge) {  // REQUIRES: mu_ held
    std::vector<std::shared_ptr<Session>> out;
    for (auto& s : sessions) {
      if (s->edge() == edge) out.push_back(s);
    }
    std::erase_if(sessions, [&](const auto& s) { return s->edge() == edge; });
    return out;
  }
};

// The edge's side: a fixed Hello, and what the courier reported.
class EdgeHandler : public CourierHandler {
 public:
  Hello MakeHello() override {
    Hello h;
    h.class_names = {"person", "car"};
    h.streams = {{"cam0", 1}};
    return h;
  }
  void OnWelcome(const Welcome& w, std::string_view link) override {
    std::lock_guard lock(mu);
    welcomes.push_back(w);
    links.emplace_back(link);
  }
  void OnAck(const Ack&) override { ++acks; }
  void OnReject(const Reject& r) override {
    std::lock_guard lock(mu);
    rejects.push_back(r);
  }
  void OnFenced(const Status& why) override {
    std::lock_guard lock(mu);
    ++fenced;
    fenced_why = why;
  }

  std::mutex mu;
  std::vector<Welcome> welcomes;
  std::vector<std::string> links;
  std::vector<Reject> rejects;
  std::atomic<int> acks{0};
  int fenced = 0;
  Status fenced_why;
};

// The seam: wraps the TCP dialer. Each connection dies after a random number of written bytes
// (mid-frame or between frames): the bytes up to the budget arrive, the rest is lost, and the next
// write fails as on a reset link (acks for what arrived may still come back meanwhile). Dialing may be
// switched off.
struct Faults {
  std::mt19937_64 rng;
  std::mutex mu;
  size_t cut_min = 0, cut_max = 0;  // 0 = never cut
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
  FaultyDialer(uint16_t p, Faults* f) : port(p), f_(f) {}
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

std::shared_ptr<Link> TcpTo(uint16_t port) {
  return std::shared_ptr<Link>(MakeTcpLink(std::shared_ptr<Dialer>(MakeTcpDialer("127.0.0.1", port))));
}

CourierOptions FastOptions(std::shared_ptr<Link> link) {
  CourierOptions o;
  o.edge = "edge-1";
  o.links = {std::move(link)};
  o.backoff_initial = milliseconds(5);
  o.backoff_max = milliseconds(40);
  o.heartbeat_interval = milliseconds(100);
  o.peer_timeout = milliseconds(5000);
  o.connect_timeout = milliseconds(5000);
  return o;
}

std::unique_ptr<Courier> StartCourier(CourierOptions o, Outbox* outbox, CourierHandler* h) {
  StatusOr<std::unique_ptr<Courier>> c = Courier::Start(std::move(o), outbox, h);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::unique_ptr<Listener> Loopback() {
  StatusOr<std::unique_ptr<TcpListener>> l = TcpListener::Listen("127.0.0.1", 0);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::move(*l) : nullptr;
}

std::unique_ptr<Receiver> StartReceiver(ReceiverHandler* h, ReceiverOptions o = {}) {
  StatusOr<std::unique_ptr<Receiver>> r = Receiver::Start(o, Loopback(), h);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

// Pushes frames 0..n-1 of each stream: every 5th an event, the 4 between as one progress range.
// Frames from..from+n-1 (from a multiple of 5).
std::vector<Key> PushMix(Outbox& out, const std::vector<std::string>& streams, uint64_t n, uint64_t run = 1,
                         uint64_t from = 0) {
  std::vector<Key> order;
  for (uint64_t seq = from; seq < from + n;) {
    const uint64_t last = seq % 5 == 0 ? seq : std::min(from + n - 1, seq - seq % 5 + 4);
    for (const std::string& s : streams) {
      Report r;
      r.stream = s;
      r.run = run;
      r.seq_first = seq;
      r.seq_last = last;
      r.kind = seq % 5 == 0 ? ReportKind::kEvent : ReportKind::kProgress;
      if (r.kind == ReportKind::kEvent) r.detections.push_back({1, 2, 3, 4, 0.9f, 0});
      StatusOr<uint64_t> id = out.Push(r, std::chrono::hours(1));
      EXPECT_TRUE(id.ok()) << id.status();
      order.emplace_back(s, run, seq);
    }
    seq = last + 1;
  }
  return order;
}

TEST(CourierTcpTest, DeliversInOrderAndTracksAcks) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Outbox outbox(1024);
  EdgeHandler edge;
  auto courier = StartCourier(FastOptions(TcpTo(rx->port())), &outbox, &edge);
  ASSERT_TRUE(courier);
  const std::vector<Key> order = PushMix(outbox, {"cam0", "cam1"}, 300);
  ASSERT_TRUE(outbox.WaitEmpty(kLong)) << outbox.Stats().pending << " pending";
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  EXPECT_EQ(agg.Get(agg.duplicates), 0u);
  EXPECT_EQ(agg.Get(agg.hellos), std::vector<std::string>{"edge-1"});
  for (const Report& r : agg.Get(agg.reports)) {  // stamped by the link
    EXPECT_EQ(r.edge, "edge-1");
    EXPECT_EQ(r.epoch, 1u);
  }
  // OnAck comes before the Outbox's Complete: once the outbox is empty every ack has been seen, exactly once.
  EXPECT_EQ(edge.acks.load(), static_cast<int>(order.size()));
  OutboxStats os = outbox.Stats();
  EXPECT_EQ(os.pushed, order.size());
  EXPECT_EQ(os.acked, order.size());
  EXPECT_EQ(os.pending, 0u);
  CourierStats s = courier->Stats();
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.sent, order.size());
  EXPECT_EQ(s.resent, 0u);
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_EQ(s.link, "tcp");
  EXPECT_TRUE(s.connected);
  {
    std::lock_guard lock(edge.mu);
    ASSERT_EQ(edge.welcomes.size(), 1u);
    EXPECT_EQ(edge.welcomes[0].epoch, 1u);
    EXPECT_EQ(edge.welcomes[0].streams, (std::vector<WelcomeStream>{{"cam0", 1, -1, -1}}));
    EXPECT_EQ(edge.links, std::vector<std::string>{"tcp"});
  }
  courier->Close();
  EXPECT_FALSE(courier->Stats().connected);
}

TEST(CourierTcpTest, CutConnectionsAreRedialedAndEverythingArrivesOnceInOrder) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(seed)};
  faults.cut_min = 1;
  faults.cut_max = 8000;  // up to ~60 report frames per connection
  Outbox outbox(4096);
  EdgeHandler edge;
  auto link = std::shared_ptr<Link>(MakeTcpLink(std::make_shared<FaultyDialer>(rx->port(), &faults)));
  CourierOptions o = FastOptions(link);
  o.connect_timeout = milliseconds(1000);  // a Hello cut in half waits this long for its Welcome
  auto courier = StartCourier(o, &outbox, &edge);
  ASSERT_TRUE(courier);
  // Published as an edge does, a little at a time: a backlog larger than what one connection lives to carry,
  // re-sent whole on each new connection and cut before any ack returns, would never drain (a real link
  // does not die after a fixed number of bytes).
  std::vector<Key> order;
  for (uint64_t chunk = 0; chunk < 20; ++chunk) {
    ASSERT_TRUE(Eventually([&] { return outbox.Stats().pending < 40; })) << outbox.Stats().pending << " pending";
    const std::vector<Key> part = PushMix(outbox, {"a", "b", "c"}, 20, 1, chunk * 20);
    order.insert(order.end(), part.begin(), part.end());
  }
  ASSERT_TRUE(outbox.WaitEmpty(kLong)) << outbox.Stats().pending << " pending";
  courier->Close();
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);  // each report stored once, in publish order
  EXPECT_GT(faults.cuts.load(), 3);
  CourierStats s = courier->Stats();
  EXPECT_EQ(outbox.Stats().acked, order.size());
  EXPECT_GT(s.sessions, 3u);
  EXPECT_EQ(s.disconnects + 1, s.sessions);
  EXPECT_EQ(s.epoch, 1u);  // every session re-admitted with the epoch granted first
  EXPECT_EQ(agg.Get(agg.received), order.size() + agg.Get(agg.duplicates));
  EXPECT_EQ(rx->Stats().accepted, s.sessions + s.open_failures);
}

TEST(CourierTcpTest, UnackedReportsAreResentInOrderAfterTheAggregatorComesBack) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(1)};
  auto dialer = std::make_shared<FaultyDialer>(rx->port(), &faults);
  Outbox outbox(1024);
  EdgeHandler edge;
  auto courier = StartCourier(FastOptions(std::shared_ptr<Link>(MakeTcpLink(dialer))), &outbox, &edge);
  ASSERT_TRUE(courier);
  agg.silent = true;  // stored but never acknowledged, as if the aggregator died before acking
  const std::vector<Key> order = PushMix(outbox, {"cam"}, 40);
  ASSERT_TRUE(agg.WaitStored(order.size()));
  EXPECT_EQ(outbox.Stats().pending, order.size());

  rx->Stop();  // the connection drops; dials to the old port are refused meanwhile
  TestAggregator agg2;
  agg2.epochs = agg.Get(agg.epochs);  // the restarted aggregator remembers the epochs it granted
  auto rx2 = StartReceiver(&agg2);
  ASSERT_TRUE(rx2);
  dialer->port = rx2->port();
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  courier->Close();
  EXPECT_EQ(agg2.Get(agg2.first_arrivals), order);
  EXPECT_EQ(agg2.Get(agg2.duplicates), 0u);
  CourierStats s = courier->Stats();
  EXPECT_EQ(s.resent, order.size());
  EXPECT_EQ(s.sent, 2 * order.size());
  EXPECT_EQ(outbox.Stats().acked, order.size());
  EXPECT_EQ(s.sessions, 2u);
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_GE(s.disconnects, 1u);
}

TEST(CourierTcpTest, FullOutboxAppliesBackpressureUntilAcked) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(1)};
  faults.down = true;
  Outbox outbox(4);
  EdgeHandler edge;
  auto link = std::shared_ptr<Link>(MakeTcpLink(std::make_shared<FaultyDialer>(rx->port(), &faults)));
  auto courier = StartCourier(FastOptions(link), &outbox, &edge);
  ASSERT_TRUE(courier);
  Report r;
  r.stream = "cam";
  for (uint64_t seq = 0; seq < 4; ++seq) {
    r.seq_first = r.seq_last = seq;
    StatusOr<uint64_t> id = outbox.Push(r, milliseconds(0));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, seq);
  }
  r.seq_first = r.seq_last = 4;
  StatusOr<uint64_t> full = outbox.Push(r, milliseconds(20));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  EXPECT_EQ(outbox.Stats().backpressure, 1u);
  ASSERT_TRUE(Eventually([&] { return courier->Stats().open_failures > 0; }));
  EXPECT_TRUE(courier->Stats().last_error.ends_with("injected: aggregator unreachable")) << courier->Stats().last_error;
  faults.down = false;  // a blocked Push completes once acks free room
  full = outbox.Push(r, kLong);
  EXPECT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.Get(agg.stored_keys).size(), 5u);
  outbox.Close();
  EXPECT_EQ(outbox.Push(r, milliseconds(0)).status().code(), absl::StatusCode::kCancelled);
}

TEST(CourierTcpTest, FencedHelloStopsTheCourier) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Faults faults{std::mt19937_64(1)};
  Outbox outbox(64);
  EdgeHandler edge;
  auto link = std::shared_ptr<Link>(MakeTcpLink(std::make_shared<FaultyDialer>(rx->port(), &faults)));
  auto courier = StartCourier(FastOptions(link), &outbox, &edge);
  ASSERT_TRUE(courier);
  ASSERT_TRUE(Eventually([&] { return courier->Stats().connected; }));
  EXPECT_EQ(courier->Stats().epoch, 1u);
  // The edge loses its link; meanwhile another instance is admitted (epoch 2); then the link returns.
  faults.down = true;
  agg.CloseAll();
  ASSERT_TRUE(Eventually([&] { return courier->Stats().open_failures > 0; }));
  EXPECT_EQ(agg.GrantNewEpoch("edge-1"), 2u);
  faults.down = false;
  ASSERT_TRUE(Eventually([&] { return courier->Stats().fenced; }));
  PushMix(outbox, {"cam"}, 3);  // accepted by the outbox, never sent
  courier->Close();
  CourierStats s = courier->Stats();
  EXPECT_TRUE(s.fenced);
  EXPECT_FALSE(s.connected);
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.sent, 0u);
  std::lock_guard lock(edge.mu);
  EXPECT_EQ(edge.fenced, 1);
  EXPECT_EQ(edge.fenced_why.code(), absl::StatusCode::kPermissionDenied) << edge.fenced_why;
  EXPECT_NE(std::string(edge.fenced_why.message()).find("fenced"), std::string::npos) << edge.fenced_why;
  EXPECT_TRUE(agg.Get(agg.stored_keys).empty());
}

TEST(CourierTcpTest, FencedDuringASessionStopsTheCourier) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Outbox outbox(64);
  EdgeHandler edge;
  auto courier = StartCourier(FastOptions(TcpTo(rx->port())), &outbox, &edge);
  ASSERT_TRUE(courier);
  const std::vector<Key> first = PushMix(outbox, {"cam"}, 10);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.GrantNewEpoch("edge-1"), 2u);  // a newer instance: the session is evicted with Reject(kFenced)
  ASSERT_TRUE(Eventually([&] { return courier->Stats().fenced; }));
  PushMix(outbox, {"cam"}, 3, 2);
  courier->Close();
  CourierStats s = courier->Stats();
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.sent, first.size());
  EXPECT_EQ(s.disconnects, 0u);
  EXPECT_EQ(outbox.Stats().pending, 2u);  // run 2: event 0, progress 1..2
  EXPECT_EQ(agg.Get(agg.first_arrivals), first);
  EXPECT_EQ(agg.Get(agg.hellos).size(), 1u);
  std::lock_guard lock(edge.mu);
  EXPECT_EQ(edge.fenced, 1);
  EXPECT_EQ(edge.fenced_why.code(), absl::StatusCode::kPermissionDenied);
}

TEST(CourierTcpTest, IdleLinkStaysUpOnHeartbeats) {
  TestAggregator agg;
  ReceiverOptions ro;
  ro.peer_timeout = milliseconds(1000);
  auto rx = StartReceiver(&agg, ro);
  ASSERT_TRUE(rx);
  Outbox outbox(8);
  EdgeHandler edge;
  CourierOptions o = FastOptions(TcpTo(rx->port()));
  o.heartbeat_interval = milliseconds(20);
  o.peer_timeout = milliseconds(1000);
  auto courier = StartCourier(o, &outbox, &edge);
  ASSERT_TRUE(courier);
  // Heartbeats at most every 20 ms: 160 frames span at least three peer timeouts without a report.
  ASSERT_TRUE(Eventually([&] { return rx->Stats().frames >= 160; }, milliseconds(60000)));
  CourierStats s = courier->Stats();
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.disconnects, 0u);
  EXPECT_TRUE(s.connected);
  EXPECT_EQ(rx->Stats().timeouts, 0u);
  EXPECT_EQ(rx->Stats().accepted, 1u);
}

// A raw client for the receiver: writes bytes, reads replies.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    StatusOr<std::unique_ptr<Connection>> c = MakeTcpDialer("127.0.0.1", port)->Dial(milliseconds(5000));
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) conn_ = std::move(*c);
  }
  bool ok() const { return conn_ != nullptr; }
  void Write(const std::string& bytes) { EXPECT_TRUE(conn_->Write(bytes, milliseconds(5000)).ok()); }
  // The next reply; nullopt when the receiver closed the connection (or nothing came in `timeout`).
  std::optional<Message> Next(milliseconds timeout = kLong) {
    for (;;) {
      StatusOr<std::optional<Message>> m = decoder_.Next();
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) return std::nullopt;
      if (m->has_value()) return std::move(**m);
      char buf[4096];
      StatusOr<size_t> n = conn_->Read(buf, sizeof buf, timeout);
      if (!n.ok()) {
        closed_status = n.status();
        return std::nullopt;
      }
      decoder_.Feed(std::string_view(buf, *n));
    }
  }
  // Every reply until the receiver closes the connection.
  std::vector<Message> UntilClosed() {
    std::vector<Message> out;
    while (std::optional<Message> m = Next()) out.push_back(std::move(*m));
    EXPECT_EQ(closed_status.code(), absl::StatusCode::kUnavailable) << closed_status;  // closed, not timed out
    return out;
  }
  Status closed_status;

 private:
  std::unique_ptr<Connection> conn_;
  FrameDecoder decoder_;
};

std::vector<Message> RawExchange(uint16_t port, const std::string& bytes) {
  RawClient c(port);
  if (!c.ok()) return {};
  c.Write(bytes);
  return c.UntilClosed();
}

std::string RejectDetail(const std::vector<Message>& replies) {
  if (replies.empty() || !std::holds_alternative<Reject>(replies.back())) return "<no reject>";
  return std::get<Reject>(replies.back()).detail;
}

Report RawReport(const std::string& edge, uint64_t epoch, uint64_t link_seq = 0) {
  Report r;
  r.edge = edge;
  r.stream = "s";
  r.epoch = epoch;
  r.link_seq = link_seq;
  return r;
}

// Hello and an Auth without proof: what an edge without a key sends (the test receivers run without keys).
std::string HelloAuth(const std::string& edge, uint16_t version = kProtocolVersion) {
  return EncodeFrame(Hello{edge, 0, version}) + EncodeFrame(Auth{});
}

TEST(ReceiverTest, ReportWithAnotherEpochGetsStaleEpochAndNeverReachesTheHandler) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  RawClient c(rx->port());
  ASSERT_TRUE(c.ok());
  c.Write(HelloAuth("edge-raw"));
  std::optional<Message> challenge = c.Next();
  ASSERT_TRUE(challenge && std::holds_alternative<Challenge>(*challenge));
  EXPECT_EQ(std::get<Challenge>(*challenge).proof, "");  // no keys: the receiver proves nothing
  std::optional<Message> welcome = c.Next();
  ASSERT_TRUE(welcome && std::holds_alternative<Welcome>(*welcome));
  const uint64_t epoch = std::get<Welcome>(*welcome).epoch;
  Report stale = RawReport("edge-raw", epoch + 5);
  stale.seq_first = stale.seq_last = 3;
  c.Write(EncodeFrame(stale) + EncodeFrame(RawReport("edge-raw", epoch, 1)));
  std::optional<Message> reject = c.Next();
  ASSERT_TRUE(reject && std::holds_alternative<Reject>(*reject));
  const Reject& rj = std::get<Reject>(*reject);
  EXPECT_EQ(rj.reason, RejectReason::kStaleEpoch);
  EXPECT_EQ(rj.stream, "s");
  EXPECT_EQ(rj.seq_first, 3u);
  EXPECT_EQ(rj.epoch, epoch);  // the session's epoch
  std::optional<Message> ack = c.Next();  // the session goes on: the next report is stored and acked
  ASSERT_TRUE(ack && std::holds_alternative<Ack>(*ack));
  EXPECT_EQ(std::get<Ack>(*ack).epoch, epoch);
  EXPECT_EQ(agg.Get(agg.received), 1u);
  EXPECT_EQ(rx->Stats().stale_reports, 1u);
  EXPECT_EQ(rx->Stats().protocol_errors, 0u);
}

TEST(ReceiverTest, MisbehavingClientsLoseOnlyTheirOwnConnection) {
  TestAggregator agg;
  ReceiverOptions ro;
  ro.peer_timeout = milliseconds(1000);
  auto rx = StartReceiver(&agg, ro);
  ASSERT_TRUE(rx);
  // A well-behaved courier keeps working throughout (heartbeats keep it inside the receiver's timeout).
  Outbox outbox(256);
  EdgeHandler edge;
  CourierOptions o = FastOptions(TcpTo(rx->port()));
  o.heartbeat_interval = milliseconds(50);
  auto courier = StartCourier(o, &outbox, &edge);
  ASSERT_TRUE(courier);
  ASSERT_TRUE(Eventually([&] { return courier->Stats().connected; }));

  const std::string hello = HelloAuth("edge-x");
  std::string corrupt = EncodeFrame(RawReport("edge-x", 1));
  corrupt[corrupt.size() - 1] ^= 0x40;
  std::string huge = EncodeFrame(Heartbeat{1});
  huge[8] = huge[9] = huge[10] = huge[11] = '\x7F';
  std::string v1 = EncodeFrame(Hello{"edge-x", 0, kProtocolVersion});
  v1[4] = 1;
  Hello v9{"edge-x", 0, 9};

  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), "GET /metrics HTTP/1.1\r\n\r\n")),
            "frame: bad magic 0x20544547 (expected 0x4C494756 'VGIL'): not a vigil report stream");
  EXPECT_TRUE(RejectDetail(RawExchange(rx->port(), hello + corrupt)).starts_with("frame: CRC-32 mismatch"));
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + huge)),
            "frame: body length 2139062143 exceeds the limit 1048576");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), EncodeFrame(RawReport("edge-x", 1)))),
            "the first message must be Hello");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + EncodeFrame(RawReport("edge-y", 1)))),
            "a report from edge 'edge-y' on the connection of 'edge-x'");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), HelloAuth("pending-1") + EncodeFrame(RawReport("pending-1", 1)))),
            "a report before the session was admitted (no Welcome yet)");
  const Snapshot snap{"s", 1, 0, -1, 0, 0, 8, 8, 8, 8, std::string("\xFF\xD8\xFF\xD9", 4)};
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), HelloAuth("pending-3") + EncodeFrame(snap))),
            "a snapshot before the session was admitted (no Welcome yet)");
  Snapshot png = snap;
  png.jpeg = "\x89PNG";
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + EncodeFrame(png))),
            "Snapshot body: snapshot of s run 1 seq 0 box -1: the picture is not a JPEG (no FF D8 FF start of image)");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + hello)),
            "an edge may not send Hello in a session (only Report, Snapshot, SourceStates and Heartbeat)");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), hello + EncodeFrame(Ack{}))),
            "an edge may not send Ack in a session (only Report, Snapshot, SourceStates and Heartbeat)");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), EncodeFrame(v9))),
            "Hello: protocol version 9 not supported (this aggregator speaks 4)");
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), EncodeFrame(Hello{"edge-x", 0, kProtocolVersion}) + hello)),
            "expected Auth");
  std::vector<Message> old = RawExchange(rx->port(), v1);
  ASSERT_FALSE(old.empty());
  EXPECT_EQ(std::get<Reject>(old.back()).reason, RejectReason::kUnsupportedVersion);
  EXPECT_EQ(std::get<Reject>(old.back()).detail, "frame: protocol version 1 not supported (this side speaks 4)");
  // Half a frame, then silence: closed after peer_timeout.
  EXPECT_TRUE(RawExchange(rx->port(), hello + EncodeFrame(RawReport("edge-x", 1)).substr(0, 20)).size() <= 2);
  // A Heartbeat is echoed after authentication, also before admission.
  std::vector<Message> echo = RawExchange(rx->port(), HelloAuth("pending-2") + EncodeFrame(Heartbeat{42}));
  ASSERT_EQ(echo.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<Challenge>(echo[0]));
  EXPECT_EQ(echo[1], Message(Heartbeat{42}));

  const std::vector<Key> order = PushMix(outbox, {"good"}, 50);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  ReceiverStats s = rx->Stats();
  // After authentication: CRC, length, edge id, report not admitted, snapshot not admitted, not a JPEG, Hello, Ack.
  EXPECT_EQ(s.protocol_errors, 8u);
  const std::map<std::string, uint64_t> rejected = {{kRejectMalformed, 3}, {kRejectVersion, 2}};
  EXPECT_EQ(s.rejected, rejected);  // before: HTTP, Report first, no Auth; version 9, frame version 1
  EXPECT_EQ(s.timeouts, 2u);  // the half frame and the heartbeat client
  EXPECT_EQ(s.accepted, 16u);
  EXPECT_EQ(courier->Stats().sessions, 1u);
  EXPECT_EQ(courier->Stats().disconnects, 0u);
}

TEST(ReceiverTest, RefusedHelloAndConnectionLimit) {
  TestAggregator agg;
  ReceiverOptions ro;
  ro.max_connections = 1;
  auto rx = StartReceiver(&agg, ro);
  ASSERT_TRUE(rx);
  {
    std::lock_guard lock(agg.mu_);
    agg.refuse_hello = "edge-x is not allowed";
  }
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), HelloAuth("edge-x"))), "edge-x is not allowed");
  {
    std::lock_guard lock(agg.mu_);
    agg.refuse_hello.clear();
  }
  ASSERT_TRUE(Eventually([&] { return rx->Stats().active == 0; }));
  Outbox outbox(8);
  EdgeHandler edge;
  auto courier = StartCourier(FastOptions(TcpTo(rx->port())), &outbox, &edge);
  ASSERT_TRUE(courier);
  PushMix(outbox, {"cam"}, 1);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(RejectDetail(RawExchange(rx->port(), "")), "too many connections");
  EXPECT_EQ(rx->Stats().refused, 1u);
}

TEST(ReceiverTest, SlowReaderIsClosedWithoutBlockingEnqueue) {
  TestAggregator agg;
  ReceiverOptions ro;
  ro.write_timeout = milliseconds(3000);  // the queue limit closes the session first
  ro.max_send_queue_bytes = 4 << 20;
  auto rx = StartReceiver(&agg, ro);
  ASSERT_TRUE(rx);
  RawClient c(rx->port());  // says Hello, then never reads
  ASSERT_TRUE(c.ok());
  c.Write(HelloAuth("edge-slow"));
  std::shared_ptr<Session> s = agg.WaitSession("edge-slow");
  ASSERT_TRUE(s);
  std::string chunk;
  while (chunk.size() < (256 << 10)) AppendFrame(Heartbeat{7}, &chunk);
  auto slowest = Clock::duration::zero();
  size_t enqueued = 0;
  const auto deadline = Clock::now() + kLong;
  while (Clock::now() < deadline) {
    const auto t0 = Clock::now();
    const bool ok = s->Enqueue(chunk);
    slowest = std::max(slowest, Clock::now() - t0);
    if (!ok) break;
    ++enqueued;
  }
  EXPECT_TRUE(s->closed());
  EXPECT_GT(enqueued, 0u);
  // Enqueue only appends under a lock: never anywhere near the write timeout, even on a busy machine.
  EXPECT_LT(slowest, milliseconds(1000)) << std::chrono::duration_cast<milliseconds>(slowest).count() << " ms";
  ASSERT_TRUE(Eventually([&] { return agg.Get(agg.closes) == 1; }));
  EXPECT_EQ(rx->Stats().active, 0u);
  EXPECT_FALSE(s->Enqueue("x"));
}

TEST(BackoffTest, DoublesUpToTheCapWithJitterInTheUpperHalf) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Backoff b(milliseconds(100), milliseconds(1000), seed);
  for (int64_t d : {100, 200, 400, 800, 1000, 1000, 1000}) {
    const int64_t got = b.Next().count();
    EXPECT_GE(got, d / 2);
    EXPECT_LE(got, d);
  }
  b.Reset();
  EXPECT_LE(b.Next().count(), 100);
}

TEST(OptionsTest, InvalidOptionsAreNamed) {
  Outbox outbox(1);
  EdgeHandler edge;
  auto msg = [&](CourierOptions o) { return std::string(Courier::Start(o, &outbox, &edge).status().message()); };
  CourierOptions o = FastOptions(TcpTo(1));
  o.edge.clear();
  EXPECT_EQ(msg(o), "courier options: edge: the id must be 1..65535 bytes");
  o.edge = "e";
  o.links.clear();
  EXPECT_EQ(msg(o), "courier options: links: at least one is required");
  o.links = {nullptr};
  EXPECT_EQ(msg(o), "courier options: links[0] is null");
  o = FastOptions(TcpTo(1));
  o.backoff_max = milliseconds(1);
  EXPECT_EQ(msg(o), "courier options: backoff_max must be ≥ backoff_initial");
  o = FastOptions(TcpTo(1));
  o.peer_timeout = o.heartbeat_interval;
  EXPECT_EQ(msg(o), "courier options: peer_timeout must be longer than heartbeat_interval");
  o = FastOptions(TcpTo(1));
  o.max_batch = 0;
  EXPECT_EQ(msg(o), "courier options: max_batch must be at least 1");

  TestAggregator agg;
  ReceiverOptions ro;
  ro.write_timeout = milliseconds(0);
  EXPECT_EQ(std::string(Receiver::Start(ro, Loopback(), &agg).status().message()), "receiver options: write_timeout must be > 0");
  ro = ReceiverOptions();
  ro.max_send_queue_bytes = 1000;
  EXPECT_TRUE(std::string(Receiver::Start(ro, Loopback(), &agg).status().message())
                  .starts_with("receiver options: max_send_queue_bytes must hold one largest frame"));
}

// Device rows: `download` copies from a host vector standing in for device memory.
DevicePayload FakeDeviceRows(std::shared_ptr<std::vector<ReportDetection>> rows, std::atomic<int>* downloads,
                             Status fail = absl::OkStatus()) {
  DevicePayload p;
  p.count = static_cast<uint32_t>(rows->size());
  p.device = 0;
  p.device_rows = rows->data();
  p.keepalive = rows;
  p.download = [rows, downloads, fail](ReportDetection* dst) {
    ++*downloads;
    if (!fail.ok()) return fail;
    std::copy(rows->begin(), rows->end(), dst);
    return absl::OkStatus();
  };
  return p;
}

TEST(CourierTcpTest, DevicePayloadArrivesWithTheDownloadedRows) {
  TestAggregator agg;
  auto rx = StartReceiver(&agg);
  ASSERT_TRUE(rx);
  Outbox outbox(16);
  EdgeHandler edge;
  std::atomic<int> downloads{0};
  auto rows = std::make_shared<std::vector<ReportDetection>>(
      std::vector<ReportDetection>{{10, 20, 30, 40, 0.75f, 0}, {1.5f, 2.5f, 3.5f, 4.5f, 0.5f, 1}});
  Report r;
  r.stream = "cam0";
  r.kind = ReportKind::kEvent;
  r.rule = "person-in-zone";
  ASSERT_TRUE(outbox.Push(r, milliseconds(0), FakeDeviceRows(rows, &downloads)).ok());
  // A payload whose download fails is completed as refused, and what follows still goes out.
  r.seq_first = r.seq_last = 1;
  ASSERT_TRUE(
      outbox.Push(r, milliseconds(0), FakeDeviceRows(rows, &downloads, absl::InternalError("cudaMemcpy failed"))).ok());
  r.seq_first = r.seq_last = 2;
  r.detections = {{0, 0, 1, 1, 0.25f, 1}};
  ASSERT_TRUE(outbox.Push(r, milliseconds(0)).ok());
  // Device rows with a host copy of them: a link that cannot send device memory sends the copy and
  // never downloads (this payload's download would fail).
  Report copied = r;
  copied.seq_first = copied.seq_last = 3;
  copied.detections = *rows;
  ASSERT_TRUE(outbox.Push(copied, milliseconds(0),
                          FakeDeviceRows(rows, &downloads, absl::InternalError("must not be downloaded")))
                  .ok());
  // A host copy must be the same rows.
  copied.detections.pop_back();
  EXPECT_EQ(outbox.Push(copied, milliseconds(0), FakeDeviceRows(rows, &downloads)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Only events carry rows.
  Report progress;
  progress.stream = "cam0";
  EXPECT_EQ(outbox.Push(progress, milliseconds(0), FakeDeviceRows(rows, &downloads)).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto courier = StartCourier(FastOptions(TcpTo(rx->port())), &outbox, &edge);
  ASSERT_TRUE(courier);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  courier->Close();
  std::vector<Report> got = agg.Get(agg.reports);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].seq_first, 0u);
  EXPECT_EQ(got[0].detections, *rows);
  EXPECT_EQ(got[0].rule, "person-in-zone");
  EXPECT_EQ(got[1].seq_first, 2u);
  EXPECT_EQ(got[1].detections, r.detections);
  EXPECT_EQ(got[2].seq_first, 3u);
  EXPECT_EQ(got[2].detections, *rows);
  EXPECT_EQ(outbox.Stats().acked, 3u);
  EXPECT_EQ(outbox.Stats().rejected, 1u);
  std::lock_guard lock(edge.mu);
  ASSERT_EQ(edge.rejects.size(), 1u);
  EXPECT_EQ(edge.rejects[0].reason, RejectReason::kInvalid);
  EXPECT_EQ(edge.rejects[0].seq_first, 1u);
  EXPECT_NE(edge.rejects[0].detail.find("cudaMemcpy failed"), std::string::npos) << edge.rejects[0].detail;
  EXPECT_EQ(courier->Stats().disconnects, 0u);
}

TEST(OutboxTest, CompletesOutOfOrderAndFreesTheDonePrefix) {
  Outbox outbox(8);
  Report r;
  r.stream = "s";
  for (uint64_t seq = 0; seq < 4; ++seq) {
    r.seq_first = r.seq_last = seq;
    ASSERT_EQ(*outbox.Push(r, milliseconds(0)), seq);
  }
  EXPECT_TRUE(outbox.Complete("s", 0, 2, true));
  EXPECT_FALSE(outbox.Complete("s", 0, 2, true));  // a duplicate ack
  EXPECT_EQ(outbox.front_id(), 0u);
  std::vector<uint64_t> ids;
  for (const auto& m : outbox.PendingFrom(1, 10)) ids.push_back(m->id);
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(outbox.PendingFrom(0, 1).size(), 1u);
  EXPECT_TRUE(outbox.Complete("s", 0, 0, false));
  EXPECT_TRUE(outbox.Complete("s", 0, 1, true));
  EXPECT_EQ(outbox.front_id(), 3u);  // 0..2 done
  EXPECT_FALSE(outbox.WaitEmpty(milliseconds(1)));
  EXPECT_TRUE(outbox.Complete("s", 0, 3, true));
  EXPECT_TRUE(outbox.WaitEmpty(milliseconds(0)));
  EXPECT_EQ(outbox.front_id(), 4u);
  EXPECT_EQ(outbox.next_id(), 4u);
  OutboxStats s = outbox.Stats();
  EXPECT_EQ(s.pushed, 4u);
  EXPECT_EQ(s.acked, 3u);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_FALSE(outbox.WaitBeyond(4, milliseconds(1)));
  EXPECT_TRUE(outbox.WaitBeyond(3, milliseconds(0)));
  r.seq_first = 5;
  r.seq_last = 4;
  EXPECT_EQ(outbox.Push(r, milliseconds(0)).status().code(), absl::StatusCode::kInvalidArgument);
  outbox.Close();
  EXPECT_TRUE(outbox.closed());
  EXPECT_FALSE(outbox.WaitBeyond(4, kLong));  // Close wakes the waiter
}


TEST(OutboxTest, WaitCompletedWaitsForTheMessagesBeforeAnIdOnly) {
  Outbox outbox(8);
  Report r;
  r.stream = "s";
  for (uint64_t seq = 0; seq < 3; ++seq) {
    r.seq_first = r.seq_last = seq;
    ASSERT_TRUE(outbox.Push(r, milliseconds(0)).ok());
  }
  EXPECT_TRUE(outbox.WaitCompleted(0, milliseconds(0)));   // nothing before id 0
  EXPECT_FALSE(outbox.WaitCompleted(2, milliseconds(1)));  // 0 and 1 pending
  EXPECT_TRUE(outbox.Complete("s", 0, 1, true));
  EXPECT_FALSE(outbox.WaitCompleted(2, milliseconds(1)));  // 0 still pending: completion out of order is not enough
  // A waiter is woken by the completion of the message it waits for (the later one 2 stays pending).
  std::thread acker([&] { EXPECT_TRUE(outbox.Complete("s", 0, 0, false)); });
  EXPECT_TRUE(outbox.WaitCompleted(2, kLong));
  acker.join();
  EXPECT_FALSE(outbox.WaitCompleted(3, milliseconds(0)));
  outbox.Close();
  EXPECT_FALSE(outbox.WaitCompleted(3, kLong));  // Close wakes the waiter; 2 is still pending
}

// ---- cuda_ipc (cuda_ipc.h) with its ring in shared host memory (the CPU machines; the GPU runs use cuda:N) --

std::string SocketPath(const std::string& name) {
  return StrCat(::testing::TempDir(), "/vigil-", ::getpid(), "-", name, ".sock");
}

std::unique_ptr<Receiver> StartRingReceiver(ReceiverHandler* h, const std::string& path, uint32_t slots = 4,
                                            uint32_t slot_bytes = 4096, std::string device = "host",
                                            std::vector<uid_t> uids = {}) {
  CudaIpcListenOptions o;
  o.path = path;
  o.device = std::move(device);
  o.slots = slots;
  o.slot_bytes = slot_bytes;
  o.allow_uids = std::move(uids);
  StatusOr<std::unique_ptr<Listener>> l = CudaIpcListen(o);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return nullptr;
  StatusOr<std::unique_ptr<Receiver>> r = Receiver::Start({}, std::move(*l), h);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

Report BigEvent(uint64_t seq, size_t rows) {
  Report r;
  r.stream = "cam0";
  r.run = 1;
  r.seq_first = r.seq_last = seq;
  r.kind = ReportKind::kEvent;
  r.rule = "crowd";
  for (size_t i = 0; i < rows; ++i) {
    const float f = static_cast<float>(i);
    r.detections.push_back({f, f + 1, f + 2, f + 3, 0.5f, static_cast<float>(i % 2)});
  }
  return r;
}

TEST(CudaIpcTest, ReportsGoThroughTheRingInOrderAndLargeOnesSpanSlots) {
  TestAggregator agg;
  const std::string path = SocketPath("ring");
  auto rx = StartRingReceiver(&agg, path);  // 4 slots of 4 KiB: the sender waits for slots, a report spans them
  ASSERT_TRUE(rx);
  EXPECT_EQ(rx->kind(), "cuda_ipc");
  const CudaIpcCounters before = GetCudaIpcCounters();
  Outbox outbox(4096);
  EdgeHandler edge;
  auto courier = StartCourier(FastOptions(std::shared_ptr<Link>(MakeCudaIpcLink(path, ""))), &outbox, &edge);
  ASSERT_TRUE(courier);
  std::vector<Key> order = PushMix(outbox, {"cam0", "cam1"}, 500);
  const Report big = BigEvent(1000, 1000);  // 24 KB of rows: six slots
  ASSERT_TRUE(outbox.Push(big, kLong).ok());
  order.emplace_back("cam0", 1, 1000);
  ASSERT_TRUE(outbox.WaitEmpty(kLong)) << outbox.Stats().pending << " pending";
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  EXPECT_EQ(agg.Get(agg.duplicates), 0u);
  EXPECT_EQ(agg.Get(agg.reports).back().detections, big.detections);
  const CourierStats s = courier->Stats();
  EXPECT_EQ(s.sessions, 1u);
  EXPECT_EQ(s.link, "cuda_ipc");
  ASSERT_EQ(s.links.size(), 1u);
  EXPECT_EQ(s.links[0].transports, "shm");
  const CudaIpcCounters after = GetCudaIpcCounters();
  EXPECT_EQ(after.rings_offered - before.rings_offered, 1u);
  EXPECT_EQ(after.rings_mapped - before.rings_mapped, 1u);
  EXPECT_GE(after.slots_received - before.slots_received, 7u);  // the big report alone fills six
  EXPECT_EQ(after.slots_received - before.slots_received, after.slots_written - before.slots_written);
  EXPECT_EQ(after.slots_rejected, before.slots_rejected);
  const ReceiverStats rs = rx->Stats();
  EXPECT_EQ(rs.protocol_errors, 0u);
  EXPECT_EQ(rs.authenticated, 1u);
  courier->Close();
}

TEST(CudaIpcTest, ACorruptedSlotIsRejectedCountedAndItsReportsArriveOnceFromTheNextSession) {
  TestAggregator agg;
  const std::string path = SocketPath("corrupt");
  auto rx = StartRingReceiver(&agg, path, 8, 4096);
  ASSERT_TRUE(rx);
  const CudaIpcCounters before = GetCudaIpcCounters();
  Outbox outbox(1024);
  EdgeHandler edge;
  CorruptNextRingSlotsForTesting(1);
  const std::vector<Key> order = PushMix(outbox, {"cam0"}, 50);
  auto courier = StartCourier(FastOptions(std::shared_ptr<Link>(MakeCudaIpcLink(path, ""))), &outbox, &edge);
  ASSERT_TRUE(courier);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  EXPECT_EQ(agg.Get(agg.duplicates), 0u);
  EXPECT_EQ(GetCudaIpcCounters().slots_rejected - before.slots_rejected, 1u);
  EXPECT_GE(courier->Stats().sessions, 2u);  // the session with the bad slot ended; the next re-sent
  courier->Close();
}

TEST(CudaIpcTest, APeerWhoseUidIsNotAllowedIsRefusedAndCounted) {
  TestAggregator agg;
  const std::string path = SocketPath("uid");
  auto rx = StartRingReceiver(&agg, path, 4, 4096, "host", {::getuid() + 4242});
  ASSERT_TRUE(rx);
  std::unique_ptr<Link> link = MakeCudaIpcLink(path, "");
  Hello h;
  h.edge = "edge-1";
  StatusOr<Welcome> w = link->Open(h, milliseconds(2000));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
  EXPECT_TRUE(Eventually([&] { return rx->Stats().rejected["peer_credentials"] == 1; }));
  EXPECT_TRUE(agg.Get(agg.hellos).empty());
}

TEST(CudaIpcTest, NoRingForTheSessionFallsBackToTcpAndSaysWhy) {
  TestAggregator agg;
  const std::string path = SocketPath("noring");
  auto ring_rx = StartRingReceiver(&agg, path, 4, 4096, "cuda:99");  // no such GPU: the offer says so
  auto tcp_rx = StartReceiver(&agg);
  ASSERT_TRUE(ring_rx && tcp_rx);
  const CudaIpcCounters before = GetCudaIpcCounters();
  Outbox outbox(1024);
  EdgeHandler edge;
  CourierOptions o = FastOptions(std::shared_ptr<Link>(MakeCudaIpcLink(path, "")));
  o.links.push_back(TcpTo(tcp_rx->port()));
  o.probe_interval = milliseconds(50);
  auto courier = StartCourier(o, &outbox, &edge);
  ASSERT_TRUE(courier);
  const std::vector<Key> order = PushMix(outbox, {"cam0"}, 50);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  // The probes keep failing without costing the tcp session anything: the aggregator decides on a Hello only
  // after the ring was accepted, so a failed ring grants no epoch and supersedes nothing.
  ASSERT_TRUE(Eventually([&] { return courier->Stats().links[0].open_failures >= 4; }));
  const CourierStats s = courier->Stats();
  EXPECT_EQ(s.link, "tcp");
  EXPECT_EQ(s.links[1].sessions, 1u);
  EXPECT_EQ(s.disconnects, 0u);
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_NE(s.last_error.find("offers no ring"), std::string::npos) << s.last_error;
  EXPECT_EQ(agg.Get(agg.hellos), std::vector<std::string>{"edge-1"});  // only the tcp session's Hello
  // The edge may see a refusal before the aggregator's thread has counted it: wait for the counts, do not race.
  EXPECT_TRUE(Eventually([&] { return ring_rx->Stats().rejected["ring_unavailable"] >= 4u; }))
      << ring_rx->Stats().rejected["ring_unavailable"];
  EXPECT_TRUE(Eventually([&] { return GetCudaIpcCounters().ring_failures - before.ring_failures >= 4u; }));
  EXPECT_GE(GetCudaIpcCounters().map_failures - before.map_failures, 4u);
  courier->Close();
}

TEST(CudaIpcTest, AggregatorGoneFallsBackToTcpAndReturnsToTheRingWhenItIsBack) {
  TestAggregator agg;
  const std::string path = SocketPath("back");
  auto ring_rx = StartRingReceiver(&agg, path);
  auto tcp_rx = StartReceiver(&agg);
  ASSERT_TRUE(ring_rx && tcp_rx);
  Outbox outbox(4096);
  EdgeHandler edge;
  CourierOptions o = FastOptions(std::shared_ptr<Link>(MakeCudaIpcLink(path, "")));
  o.links.push_back(TcpTo(tcp_rx->port()));
  o.probe_interval = milliseconds(50);
  o.peer_timeout = milliseconds(500);
  auto courier = StartCourier(o, &outbox, &edge);
  ASSERT_TRUE(courier);
  std::vector<Key> order = PushMix(outbox, {"cam0"}, 100);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(courier->Stats().link, "cuda_ipc");
  ring_rx->Stop();  // the ring side dies (its socket and ring go away)
  ring_rx.reset();
  std::vector<Key> more = PushMix(outbox, {"cam0"}, 100, 1, 100);
  order.insert(order.end(), more.begin(), more.end());
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(courier->Stats().link, "tcp");
  ring_rx = StartRingReceiver(&agg, path);  // back: the prober returns to the ring
  ASSERT_TRUE(ring_rx);
  EXPECT_TRUE(Eventually([&] { return courier->Stats().link == "cuda_ipc"; })) << courier->Stats().link;
  more = PushMix(outbox, {"cam0"}, 100, 1, 200);
  order.insert(order.end(), more.begin(), more.end());
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  const CourierStats s = courier->Stats();
  EXPECT_GE(s.fail_backs, 1u);
  EXPECT_EQ(s.links[0].transports, "shm");
  courier->Close();
}

TEST(CudaIpcTest, ListenOptionsAndSocketFilesAreChecked) {
  CudaIpcListenOptions o;
  o.path = SocketPath("opts");
  o.device = "host";
  o.slots = 1;
  EXPECT_EQ(std::string(CudaIpcListen(o).status().message()), "cuda_ipc.slots: 1 (2..65536)");
  o.slots = 4;
  o.slot_bytes = 100;
  EXPECT_EQ(std::string(CudaIpcListen(o).status().message()), "cuda_ipc.slot_bytes: 100 (4096..16777215)");
  o.slot_bytes = 4096;
  o.device = "gpu0";
  EXPECT_EQ(std::string(CudaIpcListen(o).status().message()), "cuda_ipc.device: 'gpu0' (host or cuda:N)");
  o.device = "host";
  StatusOr<std::unique_ptr<Listener>> first = CudaIpcListen(o);
  ASSERT_TRUE(first.ok()) << first.status();
  StatusOr<std::unique_ptr<Listener>> second = CudaIpcListen(o);  // a live socket is not taken over
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  o.path = std::string(200, 'x');
  EXPECT_EQ(CudaIpcListen(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.path = SocketPath("nodir") + "/missing/agg.sock";
  EXPECT_NE(std::string(CudaIpcListen(o).status().message()).find("/missing' does not exist"), std::string::npos)
      << CudaIpcListen(o).status();
  EXPECT_TRUE(CheckRingDevice("host").ok());
  EXPECT_FALSE(CheckRingDevice("cuda:99").ok());
  EXPECT_EQ(CheckRingDevice("gpu").code(), absl::StatusCode::kInvalidArgument);
}


TEST(CudaIpcTest, TwoSlotsCarryAThousandReportsWithFlowControl) {
  TestAggregator agg;
  const std::string path = SocketPath("two");
  auto rx = StartRingReceiver(&agg, path, 2, 4096);  // the sender must wait for the aggregator again and again
  ASSERT_TRUE(rx);
  const CudaIpcCounters before = GetCudaIpcCounters();
  Outbox outbox(4096);
  EdgeHandler edge;
  std::vector<Key> order = PushMix(outbox, {"cam0", "cam1", "cam2"}, 1000);
  for (uint64_t seq : {1000, 1005}) {  // two reports of ~12 KB: three slots each, through a ring of two
    ASSERT_TRUE(outbox.Push(BigEvent(seq, 500), kLong).ok());
    order.emplace_back("cam0", 1, seq);
  }
  auto courier = StartCourier(FastOptions(std::shared_ptr<Link>(MakeCudaIpcLink(path, ""))), &outbox, &edge);
  ASSERT_TRUE(courier);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  EXPECT_EQ(agg.Get(agg.first_arrivals), order);
  EXPECT_EQ(agg.Get(agg.duplicates), 0u);
  EXPECT_EQ(courier->Stats().sessions, 1u);
  const CudaIpcCounters after = GetCudaIpcCounters();
  EXPECT_GT(after.slot_waits, before.slot_waits);
  EXPECT_EQ(after.slots_rejected, before.slots_rejected);
  courier->Close();
}

TEST(UnixSocketTest, SocketFileIsPrivateAStaleOneIsReplacedAndPeersAreNamed) {
  const std::string path = SocketPath("unix");
  {
    StatusOr<std::unique_ptr<UnixListener>> l = UnixListener::Listen(path);
    ASSERT_TRUE(l.ok()) << l.status();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);  // only this uid can even connect
    StatusOr<std::unique_ptr<Connection>> c = MakeUnixDialer(path)->Dial(milliseconds(1000));
    ASSERT_TRUE(c.ok()) << c.status();
    StatusOr<std::unique_ptr<Connection>> a = (*l)->Accept(milliseconds(1000));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->peer(), StrCat("unix:pid=", ::getpid(), ",uid=", ::getuid()));
    ASSERT_TRUE((*c)->Write("ping", milliseconds(1000)).ok());
    char buf[8];
    StatusOr<size_t> n = (*a)->Read(buf, sizeof buf, milliseconds(1000));
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(std::string(buf, *n), "ping");
  }
  // A socket file left by a process that died (nobody listens) is replaced; a live one is not.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::copy(path.begin(), path.end(), a.sun_path);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::close(fd);  // the file stays, nobody listens
  StatusOr<std::unique_ptr<UnixListener>> again = UnixListener::Listen(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(UnixListener::Listen(path).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(MakeUnixDialer(SocketPath("nobody"))->Dial(milliseconds(100)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace vigil::transport
