// The ingest part alone: sessions made over a fake connection (no receiver, no sockets), a SQLite store in a
// temporary folder, the answers captured through IngestOptions::send, the storage thread's steps called directly.
#include "aggregator/ingest.h"

#include <gtest/gtest.h>

#include <map>

#include "testing/test_database.h"

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::Session;

class FakeConnection final : public transport::Connection {
 public:
  Status Write(std::string_view, std::chrono::milliseconds) override { return absl::OkStatus(); }
  StatusOr<size_t> Read(char*, size_t, std::chrono::milliseconds) override {
    return absl::UnavailableError("fake connection");
  }
  void Shutdown() override {}
  std::string peer() const override { return "10.0.0.7:4000"; }
};

// Records what confirmation was asked and told.
class FakeConfirm final : public ConfirmHook {
 public:
  void Observe(const std::vector<ObservedReport>& observed, std::vector<PendingReport>& reports,
               BatchConfirmation& plan) override {
    for (const ObservedReport& o : observed) current.push_back(o.current_epoch);
    plan.verdicts.reserve(reports.size());
    for (PendingReport& p : reports) {
      if (p.report->kind != transport::ReportKind::kEvent) continue;
      plan.verdicts.push_back(EventVerdict{});
      plan.verdicts.back().state = EventState::kPending;
      p.verdict = &plan.verdicts.back();
    }
  }
  void Committed(BatchConfirmation&, const std::vector<PendingReport>&, const std::vector<ApplyResult>& results,
                 const DecisionResult&, int64_t) override {
    committed += results.size();
  }
  void RolledBack(BatchConfirmation&) override { ++rolled_back; }
  std::vector<bool> current;
  size_t committed = 0;
  int rolled_back = 0;
};

class IngestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(db_.Create(testing::Engine::kSqlite));
    StatusOr<std::unique_ptr<Store>> s = Store::Open(db_.target());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void Make(ConfirmHook* confirm = nullptr, int snapshot_queue_mb = 64) {
    IngestOptions o;
    o.store = store_.get();
    o.registry = &registry_;
    o.live = &live_;
    o.confirm = confirm;
    o.wake_push = [this] { ++push_wakes_; };
    o.snapshot_queue_mb = snapshot_queue_mb;
    o.clock = &clock_;
    o.failure_pause_ns = 0;
    o.send = [this](Session& s, std::string frames) {
      transport::FrameDecoder d;
      d.Feed(frames);
      for (;;) {
        StatusOr<std::optional<transport::Message>> m = d.Next();
        ASSERT_TRUE(m.ok()) << m.status();
        if (!m->has_value()) break;
        sent_[&s].push_back(std::move(**m));
      }
    };
    ingest_ = std::make_unique<Ingest>(std::move(o));
  }
  std::shared_ptr<Session> Connect(uint64_t held_epoch, const std::string& link = "tcp") {
    transport::Hello h;
    h.edge = "edge-1";
    h.epoch = held_epoch;
    h.class_names = {"person"};
    auto s = std::make_shared<Session>(++ids_, std::make_shared<FakeConnection>(), h, size_t{1} << 20, link);
    EXPECT_TRUE(ingest_->OnHello(s).ok());
    return s;
  }
  static Report Progress(uint64_t first, uint64_t last, uint64_t epoch) {
    Report r;
    r.edge = "edge-1";
    r.stream = "cam0";
    r.run = 1;
    r.seq_first = first;
    r.seq_last = last;
    r.epoch = epoch;
    return r;
  }
  double Counter(const std::string& line) {
    const std::string text = "\n" + registry_.Render();
    const size_t at = text.find("\n" + line + " ");  // the sample, not its # HELP line
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + line.size() + 2));
  }
  // The storage thread's turn: the next Hello or report batch.
  void Step() {
    ASSERT_TRUE(ingest_->WaitForWork(INT64_MAX, nullptr));
    ingest_->ProcessNext();
  }

  testing::TestDatabase db_;
  std::unique_ptr<Store> store_;
  metrics::Registry registry_;
  FakeClock clock_;
  LiveFeed live_{&clock_};
  std::unique_ptr<Ingest> ingest_;
  std::map<Session*, std::vector<transport::Message>> sent_;
  uint64_t ids_ = 0;
  int push_wakes_ = 0;
};

TEST_F(IngestTest, AHelloIsGrantedBeforeTheWelcomeAndReportsAreAckedAfterTheirCommit) {
  Make();
  std::shared_ptr<Session> s = Connect(0);
  EXPECT_EQ(ingest_->Health().queue_depth, 1u);
  EXPECT_EQ(ingest_->Health().edges_connected, 1u);
  EXPECT_FALSE(s->admitted());  // decided by the storage thread, not on the connection's
  Step();
  EXPECT_EQ(s->epoch(), 1u);
  EXPECT_EQ(Counter("vigil_aggregator_hellos_total{result=\"granted\"}"), 1);
  IngestEdges e = ingest_->Edges();
  EXPECT_EQ(e.connected, std::set<std::string>{"edge-1"});
  EXPECT_EQ(e.links["edge-1"], std::set<std::string>{"tcp"});
  EXPECT_EQ(e.last_grant["edge-1"], std::make_pair(std::string("new"), clock_.WallNs()));

  ingest_->OnReport(s, Progress(0, 4, 1));
  ingest_->OnReport(s, Progress(5, 9, 1));
  Step();  // both in one transaction, answered in one frame batch
  ASSERT_EQ(sent_[s.get()].size(), 2u);
  const auto* ack = std::get_if<transport::Ack>(&sent_[s.get()][1]);
  ASSERT_NE(ack, nullptr);
  EXPECT_EQ(*ack, (transport::Ack{"cam0", 1, 1, 5, 9, 9}));
  EXPECT_EQ(Counter("vigil_aggregator_reports_total{result=\"stored\"}"), 2);
  EXPECT_EQ(Counter("vigil_aggregator_frames_total{edge=\"edge-1\",stream=\"cam0\"}"), 10);
  EXPECT_EQ(ingest_->Health().queue_depth, 0u);

  transport::SourceStates states;
  states.streams.push_back({"cam0", transport::SourceState::kStreaming});
  ingest_->OnSourceStates(s, states);
  EXPECT_EQ(ingest_->Edges().sources[std::make_pair(std::string("edge-1"), std::string("cam0"))],
            transport::SourceState::kStreaming);
  ingest_->OnClose(s, absl::UnavailableError("gone"));
  EXPECT_EQ(ingest_->Health().edges_connected, 0u);
  EXPECT_TRUE(ingest_->Edges().connected.empty());
}

TEST_F(IngestTest, ANewInstanceFencesTheOlderEpochWhoseReportsAreThenStale) {
  Make();
  std::shared_ptr<Session> a = Connect(0);
  Step();
  ASSERT_EQ(a->epoch(), 1u);
  std::shared_ptr<Session> b = Connect(0);  // a restart: a new instance of the same edge id
  Step();
  ASSERT_EQ(b->epoch(), 2u);
  EXPECT_EQ(Counter("vigil_aggregator_evicted_sessions_total"), 1);
  // The evicted session is told why, and keeps its connection.
  ASSERT_EQ(sent_[a.get()].size(), 1u);
  const auto* fenced = std::get_if<transport::Reject>(&sent_[a.get()][0]);
  ASSERT_NE(fenced, nullptr);
  EXPECT_EQ(fenced->reason, transport::RejectReason::kFenced);
  EXPECT_EQ(fenced->epoch, 2u);
  EXPECT_FALSE(a->closed());
  EXPECT_EQ(ingest_->Edges().last_grant["edge-1"].first, "replaced");

  // What the zombie still sends is refused as stale, never stored.
  ingest_->OnReport(a, Progress(0, 3, 1));
  Step();
  ASSERT_EQ(sent_[a.get()].size(), 2u);
  const auto* stale = std::get_if<transport::Reject>(&sent_[a.get()][1]);
  ASSERT_NE(stale, nullptr);
  EXPECT_EQ(stale->reason, transport::RejectReason::kStaleEpoch);
  EXPECT_EQ(stale->epoch, 2u);
  EXPECT_EQ(Counter("vigil_aggregator_reports_total{result=\"stale\"}"), 1);

  // An instance that still holds epoch 1 says Hello: refused, fenced.
  std::shared_ptr<Session> c = Connect(1);
  Step();
  EXPECT_FALSE(c->admitted());
  EXPECT_EQ(Counter("vigil_aggregator_hellos_total{result=\"fenced\"}"), 1);
}

TEST_F(IngestTest, TheSameInstanceOnANewSessionSupersedesTheOldOneWhoseQueuedReportsAreIgnored) {
  Make();
  std::shared_ptr<Session> a = Connect(0);
  Step();
  ingest_->OnReport(a, Progress(0, 1, 1));        // queued before the new session's Hello...
  std::shared_ptr<Session> b = Connect(1, "ucx");  // ...the same instance, over another link
  Step();                                          // the report batch (stored under epoch 1)
  Step();                                          // the Hello: re-admitted
  EXPECT_EQ(b->epoch(), 1u);
  EXPECT_TRUE(a->superseded());
  EXPECT_EQ(Counter("vigil_aggregator_hellos_total{result=\"readmitted\"}"), 1);
  EXPECT_EQ(ingest_->Edges().links["edge-1"], std::set<std::string>{"ucx"});
  ingest_->OnReport(a, Progress(2, 3, 1));  // late: the edge re-sends it on the new session
  Step();
  EXPECT_EQ(Counter("vigil_aggregator_reports_total{result=\"superseded\"}"), 1);
  EXPECT_EQ(Counter("vigil_aggregator_reports_total{result=\"stored\"}"), 1);
}

TEST_F(IngestTest, ConfirmationSeesWhetherEachReportsEpochIsCurrentAndHearsOfTheCommit) {
  FakeConfirm confirm;
  Make(&confirm);
  std::shared_ptr<Session> a = Connect(0);
  Step();
  Report ev = Progress(3, 3, 1);
  ev.kind = transport::ReportKind::kEvent;
  ev.detections = {{1, 2, 3, 4, 0.9f, 0}};
  ingest_->OnReport(a, ev);
  Step();
  EXPECT_EQ(confirm.current, std::vector<bool>{true});
  EXPECT_EQ(confirm.committed, 1u);
  StatusOr<std::vector<StoredEvent>> events = store_->Events({});
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].state, EventState::kPending);  // the hook's verdict went into the transaction
  EXPECT_EQ(live_.Version(), std::optional<uint64_t>(1));  // the live channel heard of the stored event
}

TEST_F(IngestTest, PicturesWaitInABoundedQueueAndAreStoredBetweenBatches) {
  Make(nullptr, /*snapshot_queue_mb=*/1);
  std::shared_ptr<Session> a = Connect(0);
  Step();
  transport::Snapshot pic{"cam0", 1, 3, -1, 0, 0, 64, 48, 64, 48, std::string("\xFF\xD8\xFF", 3) + std::string(600'000, 'x')};
  ingest_->OnSnapshot(a, pic);
  pic.seq = 4;
  ingest_->OnSnapshot(a, pic);  // 1.2 MB > 1 MiB: dropped, counted
  EXPECT_EQ(Counter("vigil_aggregator_snapshots_total{result=\"dropped_queue_full\"}"), 1);
  ingest_->ProcessSnapshots();
  EXPECT_EQ(Counter("vigil_aggregator_snapshots_total{result=\"stored\"}"), 1);
  StatusOr<std::optional<StoredSnapshot>> latest = store_->LatestSnapshot("edge-1", "cam0");
  ASSERT_TRUE(latest.ok());
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->seq, 3u);
}

TEST_F(IngestTest, AfterCloseReportsAreDroppedUnackedAndStorageEndsOnceTheQueueIsEmpty) {
  Make();
  std::shared_ptr<Session> a = Connect(0);
  Step();
  ingest_->OnReport(a, Progress(0, 0, 1));
  ingest_->Close(/*crash=*/false);
  ingest_->OnReport(a, Progress(1, 1, 1));  // not queued: the edge re-sends it to the next aggregator
  EXPECT_EQ(ingest_->Health().queue_depth, 1u);
  Step();  // what was queued before is still stored and acked
  EXPECT_EQ(sent_[a.get()].size(), 1u);
  EXPECT_FALSE(ingest_->WaitForWork(INT64_MAX, nullptr));
}

TEST_F(IngestTest, AStorageFailureIsReportedUntilTheNextSuccess) {
  Make();
  ingest_->StorageFailed(absl::DataLossError("disk I/O error"));
  EXPECT_EQ(ingest_->Health().storage_error, "disk I/O error");
  EXPECT_EQ(Counter("vigil_aggregator_storage_errors_total"), 1);
  std::shared_ptr<Session> a = Connect(0);
  Step();  // a committed grant: healthy again
  EXPECT_EQ(ingest_->Health().storage_error, "");
}

}  // namespace
}  // namespace vigil::aggregator
