// Events pushed to sinks (aggregator/push.h): the outbox rows Store::Apply writes with each event, the Pusher's
// delivery, backoff and dead letters on a fake clock, and the webhook against an HTTP server in this process.
#include "vigil/aggregator/push.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <httplib.h>
#include <mosquitto.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "testing/test_database.h"

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::ReportKind;

const std::vector<std::string> kNames = {"person", "bicycle", "car"};

class PushTest : public ::testing::TestWithParam<testing::Engine> {
 protected:
  void SetUp() override {
    if (!db_.Create(GetParam())) {
      if (!IsSkipped()) FAIL() << "no database for this test";
      return;
    }
    path_ = db_.target();
    dir_ = std::filesystem::path(::testing::TempDir()) / ("vigil_push_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Store> Open(std::vector<PushRoute> routes) {
    StoreOptions o;
    o.routes = std::move(routes);
    StatusOr<std::unique_ptr<Store>> s = Store::Open(path_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // An event of edge-1/`stream` at `seq` with one detection of class `cls`, stored at `now_ns`.
  static Report Event(uint64_t seq, int cls, transport::Severity sev = transport::Severity::kWarning,
                      const std::string& stream = "door") {
    Report r;
    r.edge = "edge-1";
    r.stream = stream;
    r.run = 7;
    r.seq_first = r.seq_last = seq;
    r.epoch = 1;
    r.kind = ReportKind::kEvent;
    r.severity = sev;
    r.rule = "rules";
    r.capture_ns = 1'000 + static_cast<int64_t>(seq);
    r.width = 640;
    r.height = 480;
    r.detections = {{1, 2, 30, 40, 0.9f, static_cast<float>(cls)}};
    return r;
  }
  std::vector<ApplyResult> Apply(Store& s, const std::vector<Report>& reports, int64_t now_ns) {
    std::vector<PendingReport> batch;
    for (const Report& r : reports) batch.push_back({&r, &kNames});
    StatusOr<std::vector<ApplyResult>> res = s.Apply(batch, now_ns);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : std::vector<ApplyResult>{};
  }
  void Admit(Store& s) { ASSERT_TRUE(s.Admit("edge-1", 0, false, {}, 1).ok()); }

  testing::TestDatabase db_;
  std::filesystem::path dir_;  // the test's files (the broker's)
  std::string path_;           // the store
};

TEST(PushRoute, EveryListedConditionMustHold) {
  PushRoute r{"mes", {"edge-1"}, {}, {"person", "car"}, "warning"};
  EXPECT_TRUE(RouteMatches(r, "edge-1", "door", "warning", {"car"}));
  EXPECT_TRUE(RouteMatches(r, "edge-1", "door", "critical", {"bicycle", "person"}));
  EXPECT_FALSE(RouteMatches(r, "edge-2", "door", "critical", {"person"})) << "another edge";
  EXPECT_FALSE(RouteMatches(r, "edge-1", "door", "info", {"person"})) << "below the lowest severity";
  EXPECT_FALSE(RouteMatches(r, "edge-1", "door", "critical", {"bicycle"})) << "no listed class";
  EXPECT_TRUE(RouteMatches(PushRoute{"all"}, "x", "y", "none", {})) << "an empty route takes every event";
}

TEST(RetryPolicy, BackoffDoublesUpToTheMaximum) {
  const RetryPolicy p{500, 4000, 10};
  EXPECT_EQ(BackoffMs(p, 1), 500);
  EXPECT_EQ(BackoffMs(p, 2), 1000);
  EXPECT_EQ(BackoffMs(p, 3), 2000);
  EXPECT_EQ(BackoffMs(p, 4), 4000);
  EXPECT_EQ(BackoffMs(p, 9), 4000);
  EXPECT_EQ(BackoffMs(p, 1000000), 4000);
}

// The outbox row is written in the event's transaction, one per sink whose route takes it, and survives a
// reopen; progress, duplicates and events no route takes queue nothing.
TEST_P(PushTest, StoringAnEventQueuesItForEverySinkThatTakesIt) {
  const std::vector<PushRoute> routes = {{"mes", {}, {}, {"person"}, ""}, {"alarms", {}, {}, {}, "critical"}};
  auto s = Open(routes);
  ASSERT_TRUE(s);
  Admit(*s);
  Report progress = Event(0, 0);
  progress.kind = ReportKind::kProgress;
  progress.detections.clear();
  const std::vector<ApplyResult> res =
      Apply(*s, {progress, Event(1, 0), Event(2, 2), Event(3, 0, transport::Severity::kCritical), Event(1, 0)}, 5000);
  ASSERT_EQ(res.size(), 5u);
  EXPECT_EQ(res[0].pushes_queued, 0);
  EXPECT_EQ(res[1].pushes_queued, 1);  // a person, warning: mes only
  EXPECT_EQ(res[2].pushes_queued, 0);  // a car, warning: neither
  EXPECT_EQ(res[3].pushes_queued, 2);  // a person, critical: both
  EXPECT_EQ(res[4].pushes_queued, 0);  // a duplicate: queued once, with its first copy
  EXPECT_EQ(*s->PushDepth("mes"), 2u);
  EXPECT_EQ(*s->PushDepth("alarms"), 1u);
  s.reset();
  s = Open(routes);  // durable: the outbox is part of the database
  StatusOr<std::vector<OutboxItem>> due = s->PushDue("mes", 5000, 10);
  ASSERT_TRUE(due.ok()) << due.status();
  ASSERT_EQ(due->size(), 2u);
  EXPECT_EQ((*due)[0].event.seq, 1u);
  EXPECT_EQ((*due)[1].event.seq, 3u);
  EXPECT_EQ((*due)[0].attempts, 0);
  EXPECT_EQ((*due)[0].event.edge, "edge-1");
  EXPECT_EQ((*due)[0].event.stream, "door");
  ASSERT_EQ((*due)[0].event.detections.size(), 1u);
  EXPECT_EQ((*due)[0].event.detections[0].label, "person");
  EXPECT_EQ(*s->PushNextDue("mes"), std::optional<int64_t>(5000));
  EXPECT_TRUE(s->PushDue("mes", 4999, 10)->empty()) << "not due before it was stored";
  EXPECT_EQ(*s->PushNextDue("nobody"), std::nullopt);
}

// A scripted sink: each call takes the next outcome (delivered when the script ran out) and records the key.
class ScriptedDelivery final : public Delivery {
 public:
  explicit ScriptedDelivery(std::deque<DeliveryOutcome::Kind> script) : script_(std::move(script)) {}
  DeliveryOutcome Deliver(const StoredEvent& e) override {
    keys.push_back(EventKey(e));
    DeliveryOutcome::Kind k = DeliveryOutcome::kDelivered;
    if (!script_.empty()) {
      k = script_.front();
      script_.pop_front();
    }
    return {k, k == DeliveryOutcome::kDelivered ? "" : k == DeliveryOutcome::kRetry ? "HTTP 503" : "HTTP 400"};
  }
  std::string describe() const override { return "scripted"; }
  std::vector<std::string> keys;

 private:
  std::deque<DeliveryOutcome::Kind> script_;
};

TEST_P(PushTest, FailedDeliveriesAreRetriedWithBackoffOnTheClockAndGivenUpIntoDeadLetters) {
  auto s = Open({{"mes", {}, {}, {}, ""}});
  ASSERT_TRUE(s);
  Admit(*s);
  FakeClock clock;
  clock.Advance(1'000'000'000);  // wall 1 s
  const int64_t t0 = clock.WallNs();
  Apply(*s, {Event(1, 0), Event(2, 0), Event(3, 0)}, t0);
  using K = DeliveryOutcome;
  auto delivery = std::make_unique<ScriptedDelivery>(std::deque<K::Kind>{
      K::kRejected,  // t0: event 1 refused (400): dead at once, the pass goes on
      K::kRetry,     // t0: event 2 fails (503): retry in 100 ms; the pass ends, the sink pauses 100 ms
      K::kRetry,     // t0+100: event 3 (due since t0) fails: retry in 100 ms; the sink pauses 200 ms (2nd in a row)
      K::kDelivered, K::kDelivered,  // t0+300: events 2 and 3 delivered
  });
  ScriptedDelivery* script = delivery.get();
  std::vector<std::pair<DeliveryOutcome::Kind, bool>> outcomes;
  Pusher p(s.get(), "mes", std::move(delivery), RetryPolicy{100, 1000, 3}, &clock,
           [&](const DeliveryOutcome& o, bool dead, int64_t) { outcomes.emplace_back(o.kind, dead); });
  const int64_t ms = 1'000'000;
  StatusOr<std::optional<int64_t>> next = p.RunDue();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, std::optional<int64_t>(t0 + 100 * ms)) << "the sink pauses after a transient failure";
  EXPECT_EQ(script->keys, (std::vector<std::string>{"edge-1/door/7/1", "edge-1/door/7/2"}));
  clock.Advance(99 * ms);
  EXPECT_EQ(*p.RunDue(), std::optional<int64_t>(t0 + 100 * ms));
  EXPECT_EQ(script->keys.size(), 2u) << "event 3 is due, but the sink is paused";
  clock.Advance(1 * ms);
  next = p.RunDue();
  EXPECT_EQ(script->keys.back(), "edge-1/door/7/3");
  EXPECT_EQ(*next, std::optional<int64_t>(t0 + 300 * ms)) << "the second failure in a row pauses twice as long";
  clock.Advance(200 * ms);
  next = p.RunDue();
  EXPECT_EQ(*next, std::nullopt) << "the outbox is empty";
  EXPECT_EQ(script->keys, (std::vector<std::string>{"edge-1/door/7/1", "edge-1/door/7/2", "edge-1/door/7/3",
                                                    "edge-1/door/7/2", "edge-1/door/7/3"}));
  const PusherStats st = p.stats();
  EXPECT_EQ(st.delivered, 2u);
  EXPECT_EQ(st.dead, 1u);
  EXPECT_EQ(st.retried, 2u);
  EXPECT_EQ(outcomes.size(), 5u);
  StatusOr<std::vector<DeadLetter>> dead = s->DeadLetters("mes", 10);
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].event.seq, 1u);
  EXPECT_EQ((*dead)[0].attempts, 1);
  EXPECT_EQ((*dead)[0].last_error, "HTTP 400");
  EXPECT_EQ(*s->PushDepth("mes"), 0u);
  EXPECT_TRUE(s->DeadLetters("other", 10)->empty());
  // The sink fixed: its dead letters go back into the outbox, due now, attempts from 0.
  EXPECT_EQ(*s->ReplayDeadLetters("other", clock.WallNs()), 0u);
  EXPECT_EQ(*s->ReplayDeadLetters("mes", clock.WallNs()), 1u);
  EXPECT_TRUE(s->DeadLetters("mes", 10)->empty());
  StatusOr<std::vector<OutboxItem>> again = s->PushDue("mes", clock.WallNs(), 10);
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ((*again)[0].event.seq, 1u);
  EXPECT_EQ((*again)[0].attempts, 0);
}

// A delivery that takes the sink at least kDeleteEvery (a webhook) has its row deleted right after it, so a crash
// mid-pass repeats at most the delivery in flight; fast deliveries (MQTT) share one deleting transaction.
class TimedDelivery final : public Delivery {
 public:
  TimedDelivery(FakeClock* clock, int64_t takes_ns, Store* store) : clock_(clock), takes_ns_(takes_ns), store_(store) {}
  DeliveryOutcome Deliver(const StoredEvent&) override {
    depth_before.push_back(*store_->PushDepth("mes"));  // what a crash now would deliver again, plus this one
    clock_->Advance(takes_ns_);
    return {DeliveryOutcome::kDelivered, ""};
  }
  std::string describe() const override { return "timed"; }
  std::vector<uint64_t> depth_before;

 private:
  FakeClock* clock_;
  int64_t takes_ns_;
  Store* store_;
};

TEST_P(PushTest, ASlowSinksDeliveredRowsAreDeletedAsTheyGoAFastSinksTogether) {
  auto s = Open({{"mes", {}, {}, {}, ""}});
  ASSERT_TRUE(s);
  Admit(*s);
  FakeClock clock;
  std::vector<Report> events;
  for (uint64_t seq = 1; seq <= 6; ++seq) events.push_back(Event(seq, 0));
  Apply(*s, events, clock.WallNs());
  {
    auto d = std::make_unique<TimedDelivery>(&clock, Pusher::kDeleteEvery, s.get());
    TimedDelivery* slow = d.get();
    Pusher p(s.get(), "mes", std::move(d), RetryPolicy{100, 1000, 3}, &clock);
    ASSERT_TRUE(p.RunDue().ok());
    // Before each delivery only the rows not delivered yet remain: the delivered ones were deleted at once.
    EXPECT_EQ(slow->depth_before, (std::vector<uint64_t>{6, 5, 4, 3, 2, 1}));
  }
  EXPECT_EQ(*s->PushDepth("mes"), 0u);
  events.clear();
  for (uint64_t seq = 7; seq <= 12; ++seq) events.push_back(Event(seq, 0));
  Apply(*s, events, clock.WallNs());
  {
    auto d = std::make_unique<TimedDelivery>(&clock, Pusher::kDeleteEvery / 4, s.get());
    TimedDelivery* fast = d.get();
    Pusher p(s.get(), "mes", std::move(d), RetryPolicy{100, 1000, 3}, &clock);
    ASSERT_TRUE(p.RunDue().ok());
    // Four deliveries per kDeleteEvery: deleted four at a time, the rest at the pass's end.
    EXPECT_EQ(fast->depth_before, (std::vector<uint64_t>{6, 6, 6, 6, 2, 2}));
  }
  EXPECT_EQ(*s->PushDepth("mes"), 0u);
}

TEST_P(PushTest, AnEventThatNeverGoesThroughIsDeadAfterMaxAttemptsWithGrowingBackoff) {
  auto s = Open({{"mes", {}, {}, {}, ""}});
  ASSERT_TRUE(s);
  Admit(*s);
  FakeClock clock;
  clock.Advance(1'000'000'000);
  const int64_t t0 = clock.WallNs();
  Apply(*s, {Event(1, 0)}, t0);
  auto delivery = std::make_unique<ScriptedDelivery>(std::deque<DeliveryOutcome::Kind>(
      4, DeliveryOutcome::kRetry));
  ScriptedDelivery* script = delivery.get();
  Pusher p(s.get(), "mes", std::move(delivery), RetryPolicy{100, 250, 4}, &clock);
  const int64_t ms = 1'000'000;
  std::vector<int64_t> waits;
  for (int pass = 0; pass < 10; ++pass) {
    StatusOr<std::optional<int64_t>> next = p.RunDue();
    ASSERT_TRUE(next.ok()) << next.status();
    if (!*next) break;
    waits.push_back((**next - clock.WallNs()) / ms);
    clock.Advance(**next - clock.WallNs());
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{100, 200, 250})) << "doubling up to max_ms";
  EXPECT_EQ(script->keys.size(), 4u) << "max_attempts deliveries, no more";
  StatusOr<std::vector<DeadLetter>> dead = s->DeadLetters("", 10);
  ASSERT_EQ(dead->size(), 1u);
  EXPECT_EQ((*dead)[0].attempts, 4);
  EXPECT_EQ((*dead)[0].last_error, "HTTP 503");
  EXPECT_EQ((*dead)[0].sink, "mes");
}

// The webhook against a real HTTP server: the event's JSON, its key as Idempotency-Key, the bearer token;
// 2xx delivered, 5xx and 429 retried, other 4xx rejected, nobody listening retried.
TEST(Webhook, PostsTheEventWithItsKeyAndClassifiesTheAnswer) {
  httplib::Server server;
  std::mutex mu;
  std::vector<httplib::Request> got;
  int answer = 200;
  server.Post("/events", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard lock(mu);
    got.push_back(req);
    res.status = answer;
    if (answer != 204) res.set_content("nope", "text/plain");  // 204 has no body
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  WebhookOptions o;
  o.sink = "mes";
  o.url = StrCat("http://127.0.0.1:", port, "/events");
  o.token = "s3cret";
  StatusOr<std::unique_ptr<Delivery>> w = MakeWebhook(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->describe(), StrCat("webhook ", o.url));
  StoredEvent e;
  e.id = 42;
  e.edge = "line-3";
  e.stream = "door";
  e.run = 7;
  e.seq = 1234;
  e.severity = "critical";
  e.detections = {{0, "person", 0.9f, 1, 2, 3, 4}};
  auto deliver = [&](int status) {
    {
      std::lock_guard lock(mu);
      answer = status;
    }
    return (*w)->Deliver(e);
  };
  EXPECT_EQ(deliver(200).kind, DeliveryOutcome::kDelivered);
  EXPECT_EQ(deliver(204).kind, DeliveryOutcome::kDelivered);
  const DeliveryOutcome busy = deliver(503);
  EXPECT_EQ(busy.kind, DeliveryOutcome::kRetry);
  EXPECT_EQ(busy.detail, "HTTP 503: nope");
  EXPECT_EQ(deliver(429).kind, DeliveryOutcome::kRetry);
  const DeliveryOutcome bad = deliver(400);
  EXPECT_EQ(bad.kind, DeliveryOutcome::kRejected);
  EXPECT_EQ(bad.detail, "HTTP 400: nope");
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(got.size(), 5u);
    const httplib::Request& r = got[0];
    EXPECT_EQ(r.get_header_value("Idempotency-Key"), "line-3/door/7/1234");
    EXPECT_EQ(r.get_header_value("X-Vigil-Sink"), "mes");
    EXPECT_EQ(r.get_header_value("Authorization"), "Bearer s3cret");
    EXPECT_EQ(r.get_header_value("Content-Type"), "application/json");
    const nlohmann::json j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["key"], "line-3/door/7/1234");
    EXPECT_EQ(j["id"], 42);
    EXPECT_EQ(j["seq"], 1234);
    EXPECT_EQ(j["severity"], "critical");
    EXPECT_EQ(j["detections"][0]["label"], "person");
  }
  server.stop();
  t.join();
  const DeliveryOutcome down = (*w)->Deliver(e);
  EXPECT_EQ(down.kind, DeliveryOutcome::kRetry) << "nobody listening is transient";
  EXPECT_NE(down.detail.find("onnect"), std::string::npos) << down.detail;
  EXPECT_EQ(MakeWebhook({"x", "ftp://host/", 1000, "", ""}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A mosquitto broker of this test on a free port (the Debian package's binary), and a subscriber.
class Broker {
 public:
  explicit Broker(const std::filesystem::path& dir) : dir_(dir) {}
  ~Broker() { Stop(); }
  static bool Available() { return std::filesystem::exists("/usr/sbin/mosquitto"); }
  bool Start(int port) {
    port_ = port;
    const std::string conf = (dir_ / "mosquitto.conf").string();
    std::ofstream(conf) << "listener " << port << " 127.0.0.1\nallow_anonymous true\n";
    pid_ = fork();
    if (pid_ == 0) {
      execl("/usr/sbin/mosquitto", "mosquitto", "-c", conf.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {  // until it accepts
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (up) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Publishes with QoS 1 on one topic per class and the retained state topic; a broker that is down is a retry,
// and the delivery reconnects by itself once it is back.
TEST_P(PushTest, MqttPublishesEachEventPerClassAndAsTheStreamsRetainedState) {
  if (!Broker::Available()) GTEST_SKIP() << "mosquitto is not installed (Debian mosquitto; scripts/deps.sh test)";
  Broker broker(dir_);
  const int port = FreePort();
  MqttOptions o;
  o.sink = "plant";
  o.port = port;
  o.topic_prefix = "site-1/vigil";
  o.timeout_ms = 1500;
  StatusOr<std::unique_ptr<Delivery>> mqtt = MakeMqtt(o);
  ASSERT_TRUE(mqtt.ok()) << mqtt.status();
  StoredEvent e;
  e.id = 5;
  e.edge = "line+3";  // a wildcard in an id becomes _
  e.stream = "door";
  e.run = 7;
  e.seq = 99;
  e.severity = "warning";
  e.detections = {{0, "person", 0.9f, 1, 2, 3, 4}, {2, "car", 0.8f, 5, 6, 7, 8}, {0, "person", 0.7f, 1, 1, 2, 2}};
  const DeliveryOutcome down = (*mqtt)->Deliver(e);
  EXPECT_EQ(down.kind, DeliveryOutcome::kRetry);
  EXPECT_NE(down.detail.find("not connected within 1500 ms"), std::string::npos) << down.detail;

  ASSERT_TRUE(broker.Start(port));
  // A subscriber on everything under the prefix.
  struct Got {
    std::mutex mu;
    std::map<std::string, std::pair<std::string, bool>> by_topic;  // topic → (payload, retained)
  } got;
  mosquitto_lib_init();
  mosquitto* sub = mosquitto_new("test-sub", true, &got);
  auto keep = [](mosquitto*, void* p, const mosquitto_message* m) {
    auto* g = static_cast<Got*>(p);
    std::lock_guard lock(g->mu);
    g->by_topic[m->topic] = {std::string(static_cast<const char*>(m->payload), static_cast<size_t>(m->payloadlen)),
                             m->retain};
  };
  mosquitto_message_callback_set(sub, keep);
  ASSERT_EQ(mosquitto_connect(sub, "127.0.0.1", port, 30), MOSQ_ERR_SUCCESS);
  ASSERT_EQ(mosquitto_subscribe(sub, nullptr, "site-1/vigil/#", 1), MOSQ_ERR_SUCCESS);
  ASSERT_EQ(mosquitto_loop_start(sub), MOSQ_ERR_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the SUBACK
  DeliveryOutcome up{DeliveryOutcome::kRetry, "not tried"};
  for (int i = 0; i < 20 && up.kind != DeliveryOutcome::kDelivered; ++i) up = (*mqtt)->Deliver(e);  // reconnects
  EXPECT_EQ(up.kind, DeliveryOutcome::kDelivered) << up.detail;
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lock(got.mu);
      if (got.by_topic.size() >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard lock(got.mu);
    EXPECT_EQ(got.by_topic.size(), 3u);
    for (const char* t : {"site-1/vigil/line_3/door/person", "site-1/vigil/line_3/door/car",
                          "site-1/vigil/line_3/door/state"}) {
      ASSERT_EQ(got.by_topic.count(t), 1u) << t;
      EXPECT_EQ(nlohmann::json::parse(got.by_topic[t].first)["key"], "line+3/door/7/99") << t;
    }
  }
  mosquitto_disconnect(sub);
  mosquitto_loop_stop(sub, true);
  mosquitto_destroy(sub);
  // A consumer that connects later gets the stream's state at once (retained).
  mosquitto* late = mosquitto_new("test-late", true, &got);
  {
    std::lock_guard lock(got.mu);
    got.by_topic.clear();
  }
  mosquitto_message_callback_set(late, keep);
  ASSERT_EQ(mosquitto_connect(late, "127.0.0.1", port, 30), MOSQ_ERR_SUCCESS);
  ASSERT_EQ(mosquitto_subscribe(late, nullptr, "site-1/vigil/+/+/state", 1), MOSQ_ERR_SUCCESS);
  ASSERT_EQ(mosquitto_loop_start(late), MOSQ_ERR_SUCCESS);
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lock(got.mu);
      if (!got.by_topic.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard lock(got.mu);
    ASSERT_EQ(got.by_topic.count("site-1/vigil/line_3/door/state"), 1u);
    EXPECT_TRUE(got.by_topic["site-1/vigil/line_3/door/state"].second) << "retained";
  }
  mosquitto_disconnect(late);
  mosquitto_loop_stop(late, true);
  mosquitto_destroy(late);
  // The broker goes away: a retry, not a hang.
  broker.Stop();
  const DeliveryOutcome lost = (*mqtt)->Deliver(e);
  EXPECT_EQ(lost.kind, DeliveryOutcome::kRetry) << lost.detail;
}

INSTANTIATE_TEST_SUITE_P(Engines, PushTest, ::testing::Values(testing::Engine::kSqlite, testing::Engine::kPostgres),
                         testing::EngineName);

}  // namespace
}  // namespace vigil::aggregator
