// UCX connections (ucx.h) over loopback 127.0.0.1 on ephemeral ports: the Connection contract, a peer
// that dies (in-process and a killed child process), flow control, leaks, and the framed TCP link running
// unchanged over a UCX dialer against a minimal aggregator written on a UCX listener.
// Each suite runs with UCX_TLS "tcp" and "sm,tcp" (UcxOptions::tls); the socket-address handshake always
// uses UCX's tcp connection manager.
#include <gtest/gtest.h>

#include "testing/eventually.h"
#include "vigil/transport/ucx.h"

#if VIGIL_HAVE_UCX
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>

#include "vigil/transport/link.h"
#include "vigil/transport/outbox.h"
#include "vigil/transport/receiver.h"
#include "vigil/transport/protocol.h"

extern char** environ;
#endif

namespace vigil::transport {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

#if !VIGIL_HAVE_UCX

TEST(UcxTest, WithoutUcxEverythingIsUnimplemented) {
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(l.status().message(), "vigil was built without UCX (Debian libucx-dev)");
  std::unique_ptr<Dialer> d = MakeUcxDialer("agg", 7400);
  EXPECT_EQ(d->target(), "ucx://agg:7400");
  EXPECT_EQ(d->Dial(milliseconds(10)).status().code(), absl::StatusCode::kUnimplemented);
}

#else

constexpr milliseconds kLong{20000};  // generous: the machine is busy

using testutil::Eventually;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Reads exactly `n` bytes (or fails).
StatusOr<std::string> ReadExactly(Connection& c, size_t n, milliseconds timeout = kLong) {
  std::string out;
  std::vector<char> buf(64 << 10);
  const auto deadline = Clock::now() + timeout;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    StatusOr<size_t> got = c.Read(buf.data(), std::min(buf.size(), n - out.size()), std::max(left, milliseconds(0)));
    if (!got.ok()) return got.status();
    out.append(buf.data(), *got);
  }
  return out;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& ch : s) ch = static_cast<char>(rng());
  return s;
}

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client, server;
};

// A listener on 127.0.0.1:0 and one connection through it.
Pair Connect(const UcxOptions& server_options, const UcxOptions& client_options) {
  Pair p;
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, server_options);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return p;
  p.listener = std::move(*l);
  StatusOr<std::unique_ptr<Connection>> c = MakeUcxDialer("127.0.0.1", p.listener->port(), client_options)->Dial(kLong);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return p;
  p.client = std::move(*c);
  StatusOr<std::unique_ptr<Connection>> s = p.listener->Accept(kLong);
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) p.server = std::move(*s);
  return p;
}

// "sm,tcp" → "sm_tcp" (test names take no commas).
std::string TlsName(const ::testing::TestParamInfo<std::string>& p) {
  std::string name = p.param;
  for (char& ch : name) {
    if (ch == ',') ch = '_';
  }
  return name;
}

class UcxTest : public ::testing::TestWithParam<std::string> {
 protected:
  UcxOptions Options() const {
    UcxOptions o;
    o.tls = GetParam();
    return o;
  }
  Pair Connect() const { return vigil::transport::Connect(Options(), Options()); }
};

TEST_P(UcxTest, RoundTripPeerAndTransports) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  EXPECT_EQ(p.listener->kind(), "ucx");
  EXPECT_NE(p.listener->port(), 0);
  EXPECT_EQ(p.listener->address(), StrCat("127.0.0.1:", p.listener->port()));
  EXPECT_EQ(p.client->peer(), StrCat("127.0.0.1:", p.listener->port()));
  EXPECT_TRUE(p.server->peer().starts_with("127.0.0.1:")) << p.server->peer();

  ASSERT_TRUE(p.client->Write("hello", kLong).ok());
  StatusOr<std::string> got = ReadExactly(*p.server, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "hello");
  ASSERT_TRUE(p.server->Write("world!", kLong).ok());
  got = ReadExactly(*p.client, 6);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "world!");

  const std::string client_tl = p.client->transports(), server_tl = p.server->transports();
  std::cout << "[ tls '" << GetParam() << "' ] client transports '" << client_tl << "', server transports '"
            << server_tl << "'\n";
  EXPECT_FALSE(client_tl.empty());
  EXPECT_FALSE(server_tl.empty());
  if (GetParam() == "tcp") {
    EXPECT_EQ(client_tl, "tcp");
    EXPECT_EQ(server_tl, "tcp");
  }
}

TEST_P(UcxTest, OneMebibyteWriteWhileTheOtherSideReads) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  const std::string data = RandomBytes(1 << 20, 1);
  const uint64_t rndv_before = GetUcxCounters().rendezvous_messages;
  const auto t0 = Clock::now();
  std::thread writer([&] { EXPECT_TRUE(p.client->Write(data, kLong).ok()); });
  StatusOr<std::string> got = ReadExactly(*p.server, data.size());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
  const uint64_t rndv = GetUcxCounters().rendezvous_messages - rndv_before;
  std::cout << "[ tls '" << GetParam() << "' ] 1 MiB in " << SecondsSince(t0) * 1e3 << " ms, " << rndv
            << " of its messages by rendezvous\n";
  EXPECT_GT(rndv, 0u) << "256 KiB messages should go by rendezvous";
}

TEST_P(UcxTest, TenThousandSmallWritesArriveInOrder) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  constexpr int kWrites = 10000;
  const uint64_t out_of_order_before = GetUcxCounters().out_of_order_messages;
  std::string expected;
  for (int i = 0; i < kWrites; ++i) expected += StrCat("<", i, std::string(i % 7, '.'), ">");
  std::thread writer([&] {
    for (int i = 0; i < kWrites; ++i) {
      ASSERT_TRUE(p.client->Write(StrCat("<", i, std::string(i % 7, '.'), ">"), kLong).ok()) << i;
    }
  });
  StatusOr<std::string> got = ReadExactly(*p.server, expected.size());
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == expected);
  // UCX delivered the messages in the order sent (the sequence numbers never had to reorder them).
  EXPECT_EQ(GetUcxCounters().out_of_order_messages, out_of_order_before);
}

TEST_P(UcxTest, ConcurrentReadAndWriteAtBothEnds) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  const std::string to_server = RandomBytes(3 << 20, 2), to_client = RandomBytes(3 << 20, 3);
  const uint64_t out_of_order_before = GetUcxCounters().out_of_order_messages;
  // Mixed sizes: eager and rendezvous messages interleave in each direction.
  auto write_all = [](Connection& c, const std::string& data) {
    size_t off = 0, step = 1;
    while (off < data.size()) {
      const size_t n = std::min(data.size() - off, step);
      ASSERT_TRUE(c.Write(std::string_view(data).substr(off, n), kLong).ok());
      off += n;
      step = step * 7 % 400009 + 1;
    }
  };
  StatusOr<std::string> at_server, at_client;
  std::thread w1([&] { write_all(*p.client, to_server); });
  std::thread w2([&] { write_all(*p.server, to_client); });
  std::thread r1([&] { at_server = ReadExactly(*p.server, to_server.size()); });
  std::thread r2([&] { at_client = ReadExactly(*p.client, to_client.size()); });
  w1.join();
  w2.join();
  r1.join();
  r2.join();
  ASSERT_TRUE(at_server.ok()) << at_server.status();
  ASSERT_TRUE(at_client.ok()) << at_client.status();
  EXPECT_TRUE(*at_server == to_server);
  EXPECT_TRUE(*at_client == to_client);
  EXPECT_EQ(GetUcxCounters().out_of_order_messages, out_of_order_before);
}

TEST_P(UcxTest, EverythingWrittenBeforeDestroyIsDelivered) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  const std::string data = RandomBytes(1 << 20, 5);
  ASSERT_TRUE(p.server->Write(data, kLong).ok());
  p.server.reset();  // returns once the client has it all in memory (its FIN acknowledged)
  std::this_thread::sleep_for(milliseconds(100));
  StatusOr<std::string> got = ReadExactly(*p.client, data.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
  std::vector<char> buf(64);
  EXPECT_EQ(p.client->Read(buf.data(), buf.size(), kLong).status().code(), absl::StatusCode::kUnavailable);
}

TEST_P(UcxTest, IdleConnectionCostsNoCpu) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  auto cpu = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double before = cpu();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double used = cpu() - before;
  std::cout << "[ tls '" << GetParam() << "' ] idle for 1 s: " << used * 1e3 << " ms of CPU\n";
  EXPECT_LT(used, 0.1) << "a progress thread is spinning";
}

TEST_P(UcxTest, PeerDestroyedFailsReadWithUnavailableAfterItsData) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  ASSERT_TRUE(p.server->Write("last words", kLong).ok());
  const auto t0 = Clock::now();
  p.server.reset();  // FIN after the data, then the endpoint closes
  std::vector<char> buf(64);
  StatusOr<std::string> got = ReadExactly(*p.client, 10);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "last words");
  StatusOr<size_t> n = p.client->Read(buf.data(), buf.size(), kLong);
  const double s = SecondsSince(t0);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable) << n.status();
  EXPECT_LT(s, 2.0);
  std::cout << "[ tls '" << GetParam() << "' ] Read failed " << s * 1e3 << " ms after the peer was destroyed: "
            << n.status().message() << "\n";
  EXPECT_EQ(p.client->Write("x", kLong).code(), absl::StatusCode::kUnavailable);
}

TEST_P(UcxTest, PeerShutdownFailsReadPromptly) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  std::vector<char> buf(64);
  Status read_status;
  const auto t0 = Clock::now();
  std::thread reader([&] { read_status = p.client->Read(buf.data(), buf.size(), kLong).status(); });
  std::this_thread::sleep_for(milliseconds(50));
  p.server->Shutdown();
  reader.join();
  EXPECT_EQ(read_status.code(), absl::StatusCode::kUnavailable) << read_status;
  EXPECT_LT(SecondsSince(t0), 2.0);
  EXPECT_EQ(p.server->Read(buf.data(), buf.size(), kLong).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(p.server->Write("x", kLong).code(), absl::StatusCode::kUnavailable);
}

TEST_P(UcxTest, ReadTimesOutWithDeadlineExceeded) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  std::vector<char> buf(64);
  const auto t0 = Clock::now();
  StatusOr<size_t> n = p.client->Read(buf.data(), buf.size(), milliseconds(200));
  const double s = SecondsSince(t0);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDeadlineExceeded) << n.status();
  EXPECT_GE(s, 0.19);
  EXPECT_LT(s, 2.0);
  // Still usable.
  ASSERT_TRUE(p.server->Write("late", kLong).ok());
  StatusOr<std::string> got = ReadExactly(*p.client, 4);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "late");
}

TEST_P(UcxTest, ShutdownFromAnotherThreadUnblocksRead) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  std::vector<char> buf(64);
  Status read_status;
  const auto t0 = Clock::now();
  std::thread reader([&] { read_status = p.client->Read(buf.data(), buf.size(), kLong).status(); });
  std::this_thread::sleep_for(milliseconds(100));
  p.client->Shutdown();
  reader.join();
  EXPECT_EQ(read_status.code(), absl::StatusCode::kUnavailable) << read_status;
  EXPECT_LT(SecondsSince(t0), 2.0);
  p.client->Shutdown();  // idempotent
  EXPECT_EQ(p.client->Write("x", kLong).code(), absl::StatusCode::kUnavailable);
}

TEST_P(UcxTest, WriteToAPeerThatDoesNotReadTimesOutThenResumes) {
  UcxOptions small = Options();
  small.receive_window_bytes = 64 << 10;
  Pair p = vigil::transport::Connect(small, Options());
  ASSERT_TRUE(p.client && p.server);
  const std::string data = RandomBytes(1 << 20, 4);
  const auto t0 = Clock::now();
  Status st = p.client->Write(data, milliseconds(300));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(SecondsSince(t0), 2.0);
  // The window's worth arrived; reading it returns credit and the next write goes through.
  StatusOr<std::string> got = ReadExactly(*p.server, 64 << 10);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data.substr(0, 64 << 10));
  std::thread reader([&] { (void)ReadExactly(*p.server, 1, kLong); });
  EXPECT_TRUE(p.client->Write("more", kLong).ok());
  reader.join();
}

TEST_P(UcxTest, DialWithNobodyListeningFailsWithUnavailable) {
  uint16_t port = 0;
  {
    StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, Options());
    ASSERT_TRUE(l.ok()) << l.status();
    port = (*l)->port();
  }
  const auto t0 = Clock::now();
  StatusOr<std::unique_ptr<Connection>> c = MakeUcxDialer("127.0.0.1", port, Options())->Dial(milliseconds(5000));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(std::string(c.status().message()).starts_with(StrCat("connect to ucx://127.0.0.1:", port))) << c.status();
  std::cout << "[ tls '" << GetParam() << "' ] refused in " << SecondsSince(t0) * 1e3 << " ms: " << c.status().message()
            << "\n";
}

TEST_P(UcxTest, DialsAHostName) {
  // Where "localhost" also resolves to ::1 (first), that attempt fails and the next address is tried.
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, Options());
  ASSERT_TRUE(l.ok()) << l.status();
  StatusOr<std::unique_ptr<Connection>> c = MakeUcxDialer("localhost", (*l)->port(), Options())->Dial(kLong);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->peer(), StrCat("127.0.0.1:", (*l)->port()));
  StatusOr<std::unique_ptr<Connection>> s = (*l)->Accept(kLong);
  ASSERT_TRUE(s.ok()) << s.status();
}

TEST_P(UcxTest, ManyConnectDisconnectCyclesLeakNothing) {
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, Options());
  ASSERT_TRUE(l.ok()) << l.status();
  const UcxCounters base = GetUcxCounters();
  constexpr int kCycles = 40;
  const auto t0 = Clock::now();
  for (int i = 0; i < kCycles; ++i) {
    StatusOr<std::unique_ptr<Connection>> c = MakeUcxDialer("127.0.0.1", (*l)->port(), Options())->Dial(kLong);
    ASSERT_TRUE(c.ok()) << c.status();
    StatusOr<std::unique_ptr<Connection>> s = (*l)->Accept(kLong);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*c)->Write(StrCat("cycle ", i), kLong).ok());
    ASSERT_TRUE(ReadExactly(**s, StrCat("cycle ", i).size()).ok());
    if (i % 2 == 0) {  // either side may close first
      c->reset();
      s->reset();
    } else {
      s->reset();
      c->reset();
    }
  }
  std::cout << "[ tls '" << GetParam() << "' ] " << kCycles << " cycles in " << SecondsSince(t0) * 1e3 << " ms\n";
  EXPECT_TRUE(Eventually([&] {
    const UcxCounters now = GetUcxCounters();
    return now.workers == base.workers && now.endpoints == base.endpoints && now.registrations == base.registrations;
  })) << "workers " << GetUcxCounters().workers << " endpoints " << GetUcxCounters().endpoints << " registrations "
      << GetUcxCounters().registrations;
  l->reset();
  EXPECT_TRUE(Eventually([&] { return GetUcxCounters().workers == base.workers - 1; }));
}

TEST_P(UcxTest, AcceptedConnectionOutlivesItsListener) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  p.listener.reset();
  ASSERT_TRUE(p.client->Write("still here", kLong).ok());
  StatusOr<std::string> got = ReadExactly(*p.server, 10);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "still here");
}

// The existing framed link (tcp_link.cc) over a UCX dialer, against a minimal aggregator on a UCX
// listener: Hello → Welcome, Reports → Acks, Heartbeat → echo.
// The receiver's side of a session, minimal: admits with epoch 7, acks every report, echoes nothing itself
// (the Receiver echoes heartbeats).
class AckingHandler : public ReceiverHandler {
 public:
  Status OnHello(const std::shared_ptr<Session>& s) override {
    Welcome w{7, {}};
    for (const HelloStream& hs : s->hello().streams) w.streams.push_back({hs.stream, hs.run, -1, -1});
    s->Admit(w);
    return absl::OkStatus();
  }
  void OnReport(const std::shared_ptr<Session>& s, Report r) override {
    if (r.epoch != 7 || r.edge != "edge-ucx") error = "report not stamped with the session";
    ++reports_seen;
    (void)s->Enqueue(
        EncodeFrame(Ack{r.stream, r.run, r.epoch, r.seq_first, r.seq_last, static_cast<int64_t>(r.seq_last)}));
  }
  void OnClose(const std::shared_ptr<Session>&, const Status&) override {}
  std::atomic<int> reports_seen{0};
  std::string error;
};

// The framed link over a UCX dialer against the Receiver on a UCX listener, authenticated with a key.
TEST_P(UcxTest, FramedLinkRunsOverUcx) {
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, Options());
  ASSERT_TRUE(l.ok()) << l.status();
  const uint16_t port = (*l)->port();
  constexpr int kReports = 200;
  const std::string key(32, '\x33');
  AckingHandler handler;
  ReceiverOptions ro;
  ro.keys = std::make_shared<const KeyStore>(std::map<std::string, std::string, std::less<>>{{"edge-ucx", key}});
  StatusOr<std::unique_ptr<Receiver>> rx = Receiver::Start(ro, std::move(*l), &handler);
  ASSERT_TRUE(rx.ok()) << rx.status();
  EXPECT_EQ((*rx)->kind(), "ucx");

  std::unique_ptr<Link> link =
      MakeFramedLink(std::shared_ptr<Dialer>(MakeUcxDialer("127.0.0.1", port, Options())), {"ucx", key});
  EXPECT_EQ(link->target(), StrCat("ucx://127.0.0.1:", port));
  EXPECT_EQ(link->kind(), "ucx");
  Hello hello;
  hello.edge = "edge-ucx";
  hello.class_names = {"person", "car"};
  hello.streams = {{"cam0", 1}};
  StatusOr<Welcome> welcome = link->Open(hello, kLong);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->epoch, 7u);
  ASSERT_EQ(welcome->streams.size(), 1u);
  EXPECT_NE(link->transports().find("tcp"), std::string::npos) << link->transports();

  // Reports in batches, one event with detections among them.
  std::vector<OutboxMessage> messages(kReports);
  for (int i = 0; i < kReports; ++i) {
    OutboxMessage& m = messages[i];
    m.id = i;
    m.report.stream = "cam0";
    m.report.run = 1;
    m.report.seq_first = m.report.seq_last = i;
    if (i == 100) {
      m.report.kind = ReportKind::kEvent;
      m.report.severity = Severity::kWarning;
      m.report.rule = "person in zone";
      m.report.detections = {{10, 20, 30, 40, 0.9f, 0}, {1, 2, 3, 4, 0.5f, 1}};
    }
  }
  for (int i = 0; i < kReports; i += 20) {
    std::vector<const OutboxMessage*> batch;
    for (int j = i; j < i + 20; ++j) batch.push_back(&messages[j]);
    ASSERT_TRUE(link->Send(batch, kLong).ok());
  }
  ASSERT_TRUE(link->SendHeartbeat(12345, kLong).ok());
  int acks = 0;
  bool echoed = false;
  int64_t last_through = -1;
  while (acks < kReports || !echoed) {
    StatusOr<std::optional<Message>> m = link->Receive(kLong);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(m->has_value()) << "nothing within " << kLong.count() << " ms after " << acks << " acks";
    if (const Ack* a = std::get_if<Ack>(&**m)) {
      EXPECT_EQ(a->seq_first, static_cast<uint64_t>(acks)) << "acks in report order";
      last_through = a->contiguous_through;
      ++acks;
    } else if (const Heartbeat* hb = std::get_if<Heartbeat>(&**m)) {
      EXPECT_EQ(hb->sent_ns, 12345);
      echoed = true;
    }
  }
  EXPECT_EQ(last_through, kReports - 1);
  EXPECT_EQ(handler.reports_seen.load(), kReports);
  link->Close();
  (*rx)->Stop();
  EXPECT_EQ(handler.error, "");
  EXPECT_EQ((*rx)->Stats().authenticated, 1u);
}

// ---- rows sent apart from their frame (Connection::WriteReport) ----

// An event report of `rows` rows (host copies), numbered by `seq`.
Report RowsReport(uint64_t seq, uint32_t rows) {
  Report r;
  r.edge = "edge-ucx";
  r.stream = "cam0";
  r.run = 1;
  r.epoch = 7;
  r.link_seq = seq;
  r.seq_first = r.seq_last = seq;
  r.kind = ReportKind::kEvent;
  r.severity = Severity::kWarning;
  r.rule = "rows";
  for (uint32_t i = 0; i < rows; ++i) {
    const float f = static_cast<float>(seq * 1000 + i);
    r.detections.push_back({f, f + 1, f + 2, f + 3, 0.5f, static_cast<float>(i % 80)});
  }
  return r;
}

// The frame without rows, and a payload pointing at `r`'s rows in host memory (device -1), kept alive by it.
std::pair<std::string, DevicePayload> Apart(const std::shared_ptr<const Report>& r) {
  Report header = *r;
  header.detections.clear();
  std::string frame;
  AppendFrame(header, &frame);
  DevicePayload p;
  p.count = static_cast<uint32_t>(r->detections.size());
  p.device = -1;
  p.device_rows = r->detections.data();
  p.keepalive = r;
  p.download = [r](ReportDetection* dst) {
    std::copy(r->detections.begin(), r->detections.end(), dst);
    return absl::OkStatus();
  };
  return {frame, p};
}

// Decodes messages from `c` until `n` arrived (or fails).
StatusOr<std::vector<Message>> ReadMessages(Connection& c, size_t n) {
  FrameDecoder d;
  std::vector<Message> out;
  std::vector<char> buf(64 << 10);
  const auto deadline = Clock::now() + kLong;
  while (out.size() < n) {
    StatusOr<std::optional<Message>> m = d.Next();
    if (!m.ok()) return m.status();
    if (m->has_value()) {
      out.push_back(std::move(**m));
      continue;
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    StatusOr<size_t> got = c.Read(buf.data(), buf.size(), std::max(left, milliseconds(0)));
    if (!got.ok()) return got.status();
    d.Feed(std::string_view(buf.data(), *got));
  }
  return out;
}

TEST_P(UcxTest, RowsSentApartArriveAsOneReportFrameInOrderWithTheByteStream) {
  UcxOptions o = Options();
  o.rendezvous_threshold_bytes = 1024;  // the 300-row report goes by rendezvous, the small ones eagerly
  Pair p = vigil::transport::Connect(o, o);
  ASSERT_TRUE(p.client && p.server);
  EXPECT_TRUE(p.client->takes_rows_from(-1));
  // GPU rows only where the UCX loaded has CUDA transports (PyPI libucx-cu13, not Debian's).
  EXPECT_EQ(p.client->takes_rows_from(0), GetUcxCounters().cuda_memory_workers > 0);
  const UcxCounters before = GetUcxCounters();
  auto small = std::make_shared<const Report>(RowsReport(1, 3));
  auto large = std::make_shared<const Report>(RowsReport(3, kMaxDetections));
  auto [small_frame, small_rows] = Apart(small);
  auto [large_frame, large_rows] = Apart(large);
  ASSERT_TRUE(p.client->Write(EncodeFrame(Heartbeat{11}), kLong).ok());
  ASSERT_TRUE(p.client->WriteReport(small_frame, small_rows, kLong).ok());
  ASSERT_TRUE(p.client->Write(EncodeFrame(Heartbeat{22}), kLong).ok());
  ASSERT_TRUE(p.client->WriteReport(large_frame, large_rows, kLong).ok());
  ASSERT_TRUE(p.client->Write(EncodeFrame(Heartbeat{33}), kLong).ok());
  small_rows = {};  // the connection holds the rows (keepalive) until they are sent
  large_rows = {};
  StatusOr<std::vector<Message>> got = ReadMessages(*p.server, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  EXPECT_EQ(std::get<Heartbeat>((*got)[0]).sent_ns, 11);
  EXPECT_EQ(std::get<Report>((*got)[1]), *small);
  EXPECT_EQ(std::get<Heartbeat>((*got)[2]).sent_ns, 22);
  EXPECT_EQ(std::get<Report>((*got)[3]), *large);
  EXPECT_EQ(std::get<Report>((*got)[3]).detections.size(), kMaxDetections);
  EXPECT_EQ(std::get<Heartbeat>((*got)[4]).sent_ns, 33);
  const UcxCounters after = GetUcxCounters();
  EXPECT_EQ(after.rows_messages_sent - before.rows_messages_sent, 2u);
  EXPECT_EQ(after.rows_messages_received - before.rows_messages_received, 2u);
  EXPECT_EQ(after.rows_messages_rejected - before.rows_messages_rejected, 0u);
  EXPECT_GE(after.rendezvous_messages - before.rendezvous_messages, 1u);  // the large rows
  EXPECT_EQ(after.rows_messages_sent_from_device - before.rows_messages_sent_from_device, 0u);
}

TEST_P(UcxTest, RowsThatFailTheCheckFailTheConnectionWithDataLossAfterWhatCameBefore) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  const UcxCounters before = GetUcxCounters();
  Report bad = RowsReport(1, 2);
  bad.detections[1].score = std::numeric_limits<float>::quiet_NaN();
  auto [frame, rows] = Apart(std::make_shared<const Report>(bad));
  ASSERT_TRUE(p.client->Write(EncodeFrame(Heartbeat{5}), kLong).ok());
  ASSERT_TRUE(p.client->WriteReport(frame, rows, kLong).ok());
  StatusOr<std::vector<Message>> first = ReadMessages(*p.server, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(std::get<Heartbeat>((*first)[0]).sent_ns, 5);
  StatusOr<std::vector<Message>> next = ReadMessages(*p.server, 1);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDataLoss) << next.status();
  EXPECT_NE(next.status().message().find("rows message 1 rejected"), std::string::npos) << next.status();
  EXPECT_EQ(GetUcxCounters().rows_messages_rejected - before.rows_messages_rejected, 1u);
  // A frame that is not a Report without rows is refused the same way.
  Pair q = Connect();
  ASSERT_TRUE(q.client && q.server);
  auto [frame2, rows2] = Apart(std::make_shared<const Report>(RowsReport(2, 1)));
  ASSERT_TRUE(q.client->WriteReport(EncodeFrame(Heartbeat{1}), rows2, kLong).ok());
  StatusOr<std::vector<Message>> refused = ReadMessages(*q.server, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_EQ(GetUcxCounters().rows_messages_rejected - before.rows_messages_rejected, 2u);
}

TEST_P(UcxTest, RowsMessagesAreFlowControlledLikeBytes) {
  UcxOptions o = Options();
  o.receive_window_bytes = 8 << 10;  // a few rows messages fill it
  Pair p = vigil::transport::Connect(o, o);
  ASSERT_TRUE(p.client && p.server);
  constexpr int kMessages = 1000;
  std::thread writer([&] {
    for (int i = 0; i < kMessages; ++i) {
      auto [frame, rows] = Apart(std::make_shared<const Report>(RowsReport(i, 1 + i % 40)));
      Status st = p.client->WriteReport(frame, rows, kLong);
      if (!st.ok()) {
        ADD_FAILURE() << "message " << i << ": " << st;
        return;
      }
    }
  });
  StatusOr<std::vector<Message>> got = ReadMessages(*p.server, kMessages);
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < kMessages; ++i) {
    const Report& r = std::get<Report>((*got)[i]);
    ASSERT_EQ(r.seq_first, static_cast<uint64_t>(i));
    ASSERT_EQ(r, RowsReport(i, 1 + i % 40));
  }
  // A reader that stops: the writer blocks on the window and times out like Write.
  Status st = absl::OkStatus();
  for (int i = 0; i < 100 && st.ok(); ++i) {
    auto [frame, rows] = Apart(std::make_shared<const Report>(RowsReport(i, 40)));
    st = p.client->WriteReport(frame, rows, milliseconds(200));
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
}

// The framed link sends a message's rows apart when the connection takes them (here host rows, device
// -1; on the GPU machine rows in GPU memory through PyPI UCX): the receiver stores the same reports.
TEST_P(UcxTest, FramedLinkSendsPayloadRowsApartAndTheReceiverGetsWholeReports) {
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, Options());
  ASSERT_TRUE(l.ok()) << l.status();
  const uint16_t port = (*l)->port();
  struct Recording : AckingHandler {
    void OnReport(const std::shared_ptr<Session>& s, Report r) override {
      {
        std::lock_guard lock(mu);
        reports.push_back(r);
      }
      AckingHandler::OnReport(s, std::move(r));
    }
    std::mutex mu;
    std::vector<Report> reports;
  } handler;
  StatusOr<std::unique_ptr<Receiver>> rx = Receiver::Start({}, std::move(*l), &handler);
  ASSERT_TRUE(rx.ok()) << rx.status();
  std::unique_ptr<Link> link =
      MakeFramedLink(std::shared_ptr<Dialer>(MakeUcxDialer("127.0.0.1", port, Options())), {"ucx", ""});
  Hello hello;
  hello.edge = "edge-ucx";
  hello.class_names = std::vector<std::string>(80, "c");
  hello.streams = {{"cam0", 1}};
  ASSERT_TRUE(link->Open(hello, kLong).ok());
  const UcxCounters before = GetUcxCounters();
  constexpr int kReports = 60;
  std::vector<OutboxMessage> messages(kReports);
  std::vector<Report> expected;
  for (int i = 0; i < kReports; ++i) {
    Report full = RowsReport(i, i % 3 == 0 ? 0 : 1 + i % 50);
    if (full.detections.empty()) full.kind = ReportKind::kProgress, full.severity = Severity::kNone, full.rule = "";
    expected.push_back(full);
    OutboxMessage& m = messages[i];
    m.id = i;
    m.report = full;
    m.report.edge.clear();
    m.report.epoch = 0;
    if (i % 3 == 1) {  // rows apart; the others carry host rows in the report (or none)
      auto kept = std::make_shared<const Report>(full);
      m.report.detections.clear();
      m.device = Apart(kept).second;
    }
  }
  for (int i = 0; i < kReports; i += 15) {
    std::vector<const OutboxMessage*> batch;
    for (int j = i; j < i + 15; ++j) batch.push_back(&messages[j]);
    ASSERT_TRUE(link->Send(batch, kLong).ok());
  }
  ASSERT_TRUE(Eventually([&] { return handler.reports_seen.load() == kReports; }, kLong));
  {
    std::lock_guard lock(handler.mu);
    ASSERT_EQ(handler.reports.size(), expected.size());
    for (int i = 0; i < kReports; ++i) {
      Report want = expected[i];
      want.link_seq = i;  // numbered by the link in send order
      EXPECT_EQ(handler.reports[i], want) << i;
    }
  }
  EXPECT_EQ(GetUcxCounters().rows_messages_received - before.rows_messages_received, static_cast<uint64_t>(kReports / 3));
  EXPECT_EQ(handler.error, "");
  link->Close();
  (*rx)->Stop();
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTest, ::testing::Values("tcp", "sm,tcp"), TlsName);

TEST(UcxOptionsTest, InvalidOptionsAreRejected) {
  UcxOptions o;
  o.send_buffers = 0;
  EXPECT_EQ(UcxListen("127.0.0.1", 0, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeUcxDialer("127.0.0.1", 1, o)->Dial(milliseconds(100)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeUcxDialer("no-such-host.invalid", 1)->Dial(milliseconds(100)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UcxListenTest, PortInUseIsUnavailableNamingTheAddress) {
  StatusOr<std::unique_ptr<Listener>> a = UcxListen("127.0.0.1", 0);
  ASSERT_TRUE(a.ok()) << a.status();
  StatusOr<std::unique_ptr<Listener>> b = UcxListen("127.0.0.1", (*a)->port());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
  EXPECT_TRUE(std::string(b.status().message()).starts_with(StrCat("listen on 127.0.0.1:", (*a)->port())))
      << b.status();
  std::cout << b.status().message() << "\n";
}

// An aggregator restarted after it was killed binds its ucx_listen port again at once, although the
// connections the old one closed first wait in TIME_WAIT on that port (found on the GPU machine: the restart
// failed with "Address already in use").
TEST(UcxListenTest, TheSamePortListensAgainRightAfterTheServerSideClosedFirst) {
  PrepareUcxEnvironment();  // as vigil's main() does
  Pair p = Connect(UcxOptions{}, UcxOptions{});
  ASSERT_TRUE(p.server && p.client);
  const uint16_t port = p.listener->port();
  ASSERT_TRUE(p.client->Write("ping", kLong).ok());
  ASSERT_TRUE(ReadExactly(*p.server, 4).ok());
  p.server.reset();  // the server's side closes first: its end of the connection goes to TIME_WAIT
  p.listener.reset();
  char buf[8];
  EXPECT_FALSE(p.client->Read(buf, sizeof buf, kLong).ok());  // the client saw the close
  p.client.reset();
  StatusOr<std::unique_ptr<Listener>> again = UcxListen("127.0.0.1", port);
  EXPECT_TRUE(again.ok()) << again.status();
}

// A peer process killed with SIGKILL: the client's blocked Read fails with Unavailable, promptly. The
// peer is this test binary running UcxChildProcess.DISABLED_ServeUntilKilled.
constexpr const char* kChildTlsEnv = "VIGIL_UCX_TEST_CHILD_TLS";
constexpr int kChildPortFd = 3;

TEST(UcxChildProcess, DISABLED_ServeUntilKilled) {
  const char* tls = std::getenv(kChildTlsEnv);
  if (tls == nullptr) GTEST_SKIP() << "runs as the peer of UcxKillTest only";
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  UcxOptions o;
  o.tls = tls;
  StatusOr<std::unique_ptr<Listener>> l = UcxListen("127.0.0.1", 0, o);
  ASSERT_TRUE(l.ok()) << l.status();
  const std::string port = StrCat((*l)->port(), "\n");
  ASSERT_EQ(::write(kChildPortFd, port.data(), port.size()), static_cast<ssize_t>(port.size()));
  StatusOr<std::unique_ptr<Connection>> c = (*l)->Accept(kLong);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Write("ready", kLong).ok());
  std::this_thread::sleep_for(std::chrono::seconds(60));  // until killed
}

class UcxKillTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxKillTest, KilledPeerProcessFailsReadPromptly) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], kChildPortFd);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::string exe(4096, '\0');
  exe.resize(std::max<ssize_t>(0, ::readlink("/proc/self/exe", exe.data(), exe.size())));
  std::vector<std::string> args = {exe, "--gtest_filter=UcxChildProcess.DISABLED_ServeUntilKilled",
                                   "--gtest_also_run_disabled_tests"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back(StrCat(kChildTlsEnv, "=", GetParam()));
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  for (auto& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  pid_t child = -1;
  ASSERT_EQ(::posix_spawn(&child, exe.c_str(), &actions, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  std::string port_line;
  char ch;
  while (::read(fds[0], &ch, 1) == 1 && ch != '\n') port_line += ch;
  ::close(fds[0]);
  ASSERT_FALSE(port_line.empty()) << "the child did not report its port";

  UcxOptions o;
  o.tls = GetParam();
  StatusOr<std::unique_ptr<Connection>> c =
      MakeUcxDialer("127.0.0.1", static_cast<uint16_t>(std::stoi(port_line)), o)->Dial(kLong);
  ASSERT_TRUE(c.ok()) << c.status();
  StatusOr<std::string> ready = ReadExactly(**c, 5);
  ASSERT_TRUE(ready.ok()) << ready.status();
  std::cout << "[ tls '" << GetParam() << "' ] transports to the child: '" << (*c)->transports() << "'\n";

  std::vector<char> buf(64);
  Status read_status;
  Clock::time_point killed;
  std::thread reader([&] { read_status = (*c)->Read(buf.data(), buf.size(), kLong).status(); });
  std::this_thread::sleep_for(milliseconds(100));
  killed = Clock::now();
  ::kill(child, SIGKILL);
  reader.join();
  const double s = SecondsSince(killed);
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  EXPECT_EQ(read_status.code(), absl::StatusCode::kUnavailable) << read_status;
  EXPECT_LT(s, 5.0);
  std::cout << "[ tls '" << GetParam() << "' ] Read failed " << s * 1e3 << " ms after SIGKILL: "
            << read_status.message() << "\n";
  EXPECT_EQ((*c)->Write("x", kLong).code(), absl::StatusCode::kUnavailable);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxKillTest, ::testing::Values("tcp", "sm,tcp"), TlsName);

#endif  // VIGIL_HAVE_UCX

}  // namespace
}  // namespace vigil::transport
