// Events pushed to sinks (aggregator/push.h): the outbox rows Store::Apply writes with each event, the Pusher's
// delivery, backoff and dead letters on a fake clock, and the webhook against an HTTP server in this process.
#include "vigil/aggregator/push.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <deque>
#include <filesystem>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::ReportKind;

const std::vector<std::string> kNames = {"person", "bicycle", "car"};

class PushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("vigil_push_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "agg.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

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

  std::filesystem::path dir_;
  std::string path_;
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
TEST_F(PushTest, StoringAnEventQueuesItForEverySinkThatTakesIt) {
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

TEST_F(PushTest, FailedDeliveriesAreRetriedWithBackoffOnTheClockAndGivenUpIntoDeadLetters) {
  auto s = Open({{"mes", {}, {}, {}, ""}});
  ASSERT_TRUE(s);
  Admit(*s);
  FakeClock clock;
  clock.Advance(1'000'000'000);  // wall 1 s
  Apply(*s, {Event(1, 0), Event(2, 0), Event(3, 0)}, clock.WallNs());
  using K = DeliveryOutcome;
  // Event 1: 503, 503, then delivered. Event 2: refused (400): dead at once. Event 3: 503 until max_attempts.
  auto delivery = std::make_unique<ScriptedDelivery>(std::deque<K::Kind>{
      K::kRetry, K::kRejected, K::kRetry,  // pass 1: events 1, 2, 3
      K::kRetry, K::kRetry,                // pass 2 (after 100 ms): events 1, 3
      K::kDelivered, K::kRetry});          // pass 3 (after 200 more): events 1, 3 (its 3rd attempt: dead)
  ScriptedDelivery* script = delivery.get();
  std::vector<std::pair<DeliveryOutcome::Kind, bool>> outcomes;
  Pusher p(s.get(), "mes", std::move(delivery), RetryPolicy{100, 1000, 3}, &clock,
           [&](const DeliveryOutcome& o, bool dead, int64_t) { outcomes.emplace_back(o.kind, dead); });
  StatusOr<std::optional<int64_t>> next = p.RunDue();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, std::optional<int64_t>(clock.WallNs() + 100'000'000)) << "the first retry after initial_ms";
  EXPECT_EQ(script->keys, (std::vector<std::string>{"edge-1/door/7/1", "edge-1/door/7/2", "edge-1/door/7/3"}));
  clock.Advance(99'000'000);
  ASSERT_TRUE(p.RunDue().ok());
  EXPECT_EQ(script->keys.size(), 3u) << "nothing is due before its backoff";
  clock.Advance(1'000'000);
  next = p.RunDue();
  EXPECT_EQ(script->keys.size(), 5u);
  EXPECT_EQ(*next, std::optional<int64_t>(clock.WallNs() + 200'000'000)) << "the second retry after twice that";
  clock.Advance(200'000'000);
  next = p.RunDue();
  EXPECT_EQ(*next, std::nullopt) << "the outbox is empty";
  EXPECT_EQ(script->keys, (std::vector<std::string>{"edge-1/door/7/1", "edge-1/door/7/2", "edge-1/door/7/3",
                                                    "edge-1/door/7/1", "edge-1/door/7/3", "edge-1/door/7/1",
                                                    "edge-1/door/7/3"}));
  const PusherStats st = p.stats();
  EXPECT_EQ(st.delivered, 1u);
  EXPECT_EQ(st.dead, 2u);
  EXPECT_EQ(st.retried, 4u);
  EXPECT_EQ(outcomes.size(), 7u);
  StatusOr<std::vector<DeadLetter>> dead = s->DeadLetters("mes", 10);
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_EQ(dead->size(), 2u);
  EXPECT_EQ((*dead)[0].event.seq, 3u);  // newest first
  EXPECT_EQ((*dead)[0].attempts, 3);
  EXPECT_EQ((*dead)[0].last_error, "HTTP 503");
  EXPECT_EQ((*dead)[1].event.seq, 2u);
  EXPECT_EQ((*dead)[1].attempts, 1);
  EXPECT_EQ((*dead)[1].last_error, "HTTP 400");
  EXPECT_EQ(*s->PushDepth("mes"), 0u);
  EXPECT_TRUE(s->DeadLetters("other", 10)->empty());
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

}  // namespace
}  // namespace vigil::aggregator
