// The confirmation wiring alone: the ConfirmHook driven by hand around Store::Apply (as the ingest part does), a
// SQLite store in a temporary folder, a FakeClock, fakes for the aggregator's callbacks. No second model here
// (aggregator_test.cc runs one end to end).
#include "aggregator/confirmation.h"

#include <gtest/gtest.h>

#include "testing/test_database.h"

namespace vigil::aggregator {
namespace {

using transport::Report;

class ConfirmationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(db_.Create(testing::Engine::kSqlite));
    Open();
    ASSERT_TRUE(store_->Admit("edge-1", 0, false, {}, clock_.WallNs()).ok());
  }
  void Open() {
    StatusOr<std::unique_ptr<Store>> s = Store::Open(db_.target());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  std::unique_ptr<Confirmation> Start() {
    ConfirmationOptions o;
    o.config.enabled = true;
    o.config.idle_s = 1;
    o.config.association_device = "cpu";
    o.store = store_.get();
    o.live = &live_;
    o.registry = &registry_;
    o.clock = &clock_;
    o.wake_push = [this] { ++push_wakes_; };
    o.wake_storage = [] {};
    o.storage_failed = [this](const Status& st) { failures_.push_back(std::string(st.message())); };
    StatusOr<std::unique_ptr<Confirmation>> c = Confirmation::Start(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static Report Event(uint64_t seq, float x) {
    Report r;
    r.edge = "edge-1";
    r.stream = "cam0";
    r.run = 1;
    r.seq_first = r.seq_last = seq;
    r.epoch = 1;
    r.kind = transport::ReportKind::kEvent;
    r.capture_ns = static_cast<int64_t>(seq) * 100'000'000;
    r.width = 640;
    r.height = 480;
    r.detections = {{x, 100, x + 50, 200, 0.9f, 0}};
    return r;
  }
  // One report batch as the ingest part runs it: Observe, the transaction, then Committed.
  void Batch(Confirmation& c, const std::vector<Report>& batch) {
    std::vector<PendingReport> reports;
    std::vector<ObservedReport> observed;
    for (const Report& r : batch) {
      reports.push_back({&r, &kNames});
      observed.push_back({&r, &kNames, true});
    }
    BatchConfirmation plan;
    c.Observe(observed, reports, plan);
    DecisionResult decided;
    StatusOr<std::vector<ApplyResult>> res = store_->Apply(reports, clock_.WallNs(), plan.decisions, &decided);
    ASSERT_TRUE(res.ok()) << res.status();
    c.Committed(plan, reports, *res, decided, clock_.WallNs());
    clock_.Advance(100'000'000);
  }
  std::map<uint64_t, std::string> States() {
    std::map<uint64_t, std::string> out;
    StatusOr<std::vector<StoredEvent>> ev = store_->Events({});
    EXPECT_TRUE(ev.ok());
    for (const StoredEvent& e : *ev) out[e.seq] = std::string(ToString(e.state));
    return out;
  }
  double Gauge(const std::string& name) {
    const std::string text = "\n" + registry_.Render();
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
  }

  const std::vector<std::string> kNames = {"person"};
  testing::TestDatabase db_;
  std::unique_ptr<Store> store_;
  FakeClock clock_;
  LiveFeed live_{&clock_};
  metrics::Registry registry_;
  int push_wakes_ = 0;
  std::vector<std::string> failures_;
};

TEST_F(ConfirmationTest, AnEventWaitsForItsTrackAndIsDecidedWithALaterBatch) {
  std::unique_ptr<Confirmation> c = Start();
  ASSERT_TRUE(c);
  Batch(*c, {Event(0, 100)});  // a tentative track (min_hits 2): its event is stored pending
  EXPECT_EQ(States(), (std::map<uint64_t, std::string>{{0, "pending"}}));
  EXPECT_EQ(Gauge("vigil_aggregator_events_pending"), 1);
  Batch(*c, {Event(1, 104)});  // the track is confirmed: this event at once, the first one by a decision
  EXPECT_EQ(States(), (std::map<uint64_t, std::string>{{0, "confirmed"}, {1, "confirmed"}}));
  EXPECT_EQ(Gauge("vigil_aggregator_events_pending"), 0);
  EXPECT_EQ(live_.decided_seq(), 1u);  // the decision on event 0 went to the live channel
  EXPECT_TRUE(failures_.empty());
}

TEST_F(ConfirmationTest, ASilentStreamEndsItsTracksAndPendingEventsSurviveARestart) {
  {
    std::unique_ptr<Confirmation> c = Start();
    ASSERT_TRUE(c);
    Batch(*c, {Event(0, 100)});
    EXPECT_EQ(States()[0], "pending");
  }  // stopped with an event pending
  std::unique_ptr<Confirmation> again = Start();  // resumes it from the store
  ASSERT_TRUE(again);
  EXPECT_EQ(States()[0], "pending");
  EXPECT_EQ(again->expire_interval_ns(), 100'000'000);  // a tenth of idle_s
  clock_.Advance(2'000'000'000);  // past idle_s: the stream is silent
  again->ExpireTracks();
  const std::string state = States()[0];
  EXPECT_NE(state, "pending");
  EXPECT_EQ(Gauge("vigil_aggregator_events_pending"), 0);
  EXPECT_EQ(live_.decided_seq(), 1u);
  EXPECT_FALSE(again->SecondModelPending());  // no second model configured
  EXPECT_TRUE(failures_.empty());
}

TEST_F(ConfirmationTest, AnInvalidConfigFailsTheStartNamingTheField) {
  ConfirmationOptions o;
  o.config.enabled = true;
  o.config.idle_s = 0;  // must be > 0.1
  o.store = store_.get();
  o.live = &live_;
  o.registry = &registry_;
  StatusOr<std::unique_ptr<Confirmation>> c = Confirmation::Start(std::move(o));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("idle_s"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace vigil::aggregator
