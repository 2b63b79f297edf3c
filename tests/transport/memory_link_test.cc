// The in-memory Link and FakeAggregator (tests/testing/memory_link.h), and the Courier switching
// between two of them.
#include "testing/eventually.h"
#include "testing/memory_link.h"

#include <gtest/gtest.h>

#include <thread>

#include "vigil/transport/courier.h"

namespace vigil::testing {
namespace {

using std::chrono::milliseconds;
using transport::Courier;
using transport::CourierOptions;
using transport::Outbox;
using transport::Report;
using transport::ReportKind;

constexpr milliseconds kLong{20000};

class EdgeHandler : public transport::CourierHandler {
 public:
  transport::Hello MakeHello() override { return transport::Hello{"", 0, transport::kProtocolVersion, 0, {"person"}, {{"cam", 1}}}; }
  void OnWelcome(const transport::Welcome& w, std::string_view) override {
    std::lock_guard lock(mu);
    welcomes.push_back(w);
  }
  void OnAck(const transport::Ack&) override {}
  void OnReject(const transport::Reject&) override {}
  void OnFenced(const Status&) override { ++fenced; }
  std::mutex mu;
  std::vector<transport::Welcome> welcomes;
  std::atomic<int> fenced{0};
};

std::vector<FakeAggregator::Key> Push(Outbox& out, uint64_t from, uint64_t n) {
  std::vector<FakeAggregator::Key> keys;
  for (uint64_t seq = from; seq < from + n; ++seq) {
    Report r;
    r.stream = "cam";
    r.run = 1;
    r.seq_first = r.seq_last = seq;
    r.kind = ReportKind::kEvent;
    r.detections = {{0, 0, 1, 1, 0.5f, 0}};
    EXPECT_TRUE(out.Push(r, kLong).ok());
    keys.emplace_back("cam", 1, seq);
  }
  return keys;
}

using testutil::Eventually;

CourierOptions Options(std::vector<std::shared_ptr<transport::Link>> links) {
  CourierOptions o;
  o.edge = "edge-m";
  o.links = std::move(links);
  o.backoff_initial = milliseconds(1);
  o.backoff_max = milliseconds(10);
  o.heartbeat_interval = milliseconds(50);
  o.peer_timeout = milliseconds(5000);
  o.max_batch = 7;
  o.probe_interval = milliseconds(20);
  return o;
}

TEST(MemoryLinkTest, CourierSwitchesLinksWhenOneFailsMidStreamAndStoresEverythingOnceInOrder) {
  auto agg = std::make_shared<FakeAggregator>();
  auto a = std::make_shared<MemoryLink>(agg, "a");
  auto b = std::make_shared<MemoryLink>(agg, "b");
  a->BreakAfter(30, /*then_down=*/true);  // the preferred link fails mid-stream and stays down
  Outbox outbox(1000);
  EdgeHandler edge;
  auto courier = Courier::Start(Options({a, b}), &outbox, &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  std::vector<FakeAggregator::Key> order = Push(outbox, 0, 100);
  ASSERT_TRUE(outbox.WaitEmpty(kLong)) << outbox.Stats().pending << " pending";
  EXPECT_EQ(a->breaks(), 1);
  EXPECT_EQ((*courier)->Stats().link_switches, 1u);

  // The preferred link comes back: a probe finds it and the courier moves back, with b still healthy.
  a->FailOpen(false);
  ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().fail_backs == 1; }));
  std::vector<FakeAggregator::Key> more = Push(outbox, 100, 100);
  order.insert(order.end(), more.begin(), more.end());
  ASSERT_TRUE(outbox.WaitEmpty(kLong)) << outbox.Stats().pending << " pending";
  (*courier)->Close();

  EXPECT_EQ(agg->StoredOrder(), order);  // every report stored once, in order, across both links
  EXPECT_EQ(b->breaks(), 0);
  transport::CourierStats s = (*courier)->Stats();
  EXPECT_EQ(s.link_switches, 2u);
  EXPECT_EQ(s.fail_backs, 1u);
  EXPECT_EQ(s.sessions, 3u);
  EXPECT_EQ(s.disconnects, 1u);  // a's break; moving back is not a loss
  ASSERT_EQ(s.links.size(), 2u);
  EXPECT_EQ(s.links[0].sessions, 2u);
  EXPECT_EQ(s.links[1].sessions, 1u);
  EXPECT_GE(s.probes, 1u);
  EXPECT_EQ(s.epoch, 1u);  // granted once, re-admitted on every later session
  EXPECT_EQ(outbox.Stats().acked, 200u);
  EXPECT_EQ(edge.fenced.load(), 0);
  std::lock_guard lock(edge.mu);
  ASSERT_EQ(edge.welcomes.size(), 3u);
  // The third session resumes "cam" run 1: the Welcome says what is stored.
  ASSERT_EQ(edge.welcomes[2].streams.size(), 1u);
  EXPECT_EQ(edge.welcomes[2].streams[0].stream, "cam");
  EXPECT_GE(edge.welcomes[2].streams[0].contiguous_through, 99);
  EXPECT_EQ(edge.welcomes[2].streams[0].highest_seq, edge.welcomes[2].streams[0].contiguous_through);
}

TEST(MemoryLinkTest, DroppedAcksAreResentAndStoredOnce) {
  auto agg = std::make_shared<FakeAggregator>();
  auto a = std::make_shared<MemoryLink>(agg, "a");
  a->DropAcks(true);
  Outbox outbox(100);
  EdgeHandler edge;
  auto courier = Courier::Start(Options({a}), &outbox, &edge);
  ASSERT_TRUE(courier.ok());
  const std::vector<FakeAggregator::Key> order = Push(outbox, 0, 20);
  ASSERT_TRUE(agg->WaitStored(20, kLong));
  EXPECT_EQ(outbox.Stats().pending, 20u);
  a->DropAcks(false);
  a->BreakAfter(0);  // the next message breaks the session; the next one re-sends all 20
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  (*courier)->Close();
  EXPECT_EQ(agg->StoredOrder(), order);
  EXPECT_EQ(agg->duplicates(), 20u);
  EXPECT_EQ((*courier)->Stats().resent, 20u);
}

transport::Snapshot Picture(uint64_t seq, size_t bytes) {
  transport::Snapshot s{"cam", 1, seq, -1, 0, 0, 64, 48, 64, 48, std::string(bytes, '\xFF')};
  s.jpeg[1] = '\xD8';
  return s;
}

TEST(MemoryLinkTest, SnapshotsGoOutBesideTheReportsAndWhatCannotGoIsCounted) {
  auto agg = std::make_shared<FakeAggregator>();
  auto a = std::make_shared<MemoryLink>(agg, "a");
  Outbox outbox(1000);
  EdgeHandler edge;
  CourierOptions o = Options({a});
  o.max_snapshot_bytes = 3000;  // two 1,000-byte pictures fit with room; a third of 1,500 does not
  auto courier = Courier::Start(o, &outbox, &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().connected; }));
  Push(outbox, 0, 20);
  EXPECT_TRUE((*courier)->OfferSnapshot(Picture(3, 1000)));
  EXPECT_TRUE((*courier)->OfferSnapshot(Picture(7, 1000)));
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().snapshots_sent == 2; }));
  // Every report once, and both pictures, stamped with the session's edge id.
  EXPECT_EQ(agg->StoredOrder().size(), 20u);
  const auto snaps = agg->Snapshots();
  ASSERT_EQ(snaps.size(), 2u);
  EXPECT_EQ(snaps[0].first, "edge-m");
  EXPECT_EQ(snaps[0].second, Picture(3, 1000));
  EXPECT_EQ(snaps[1].second, Picture(7, 1000));

  // While no session is open, pictures wait in the queue (up to its bytes) and go out once one opens.
  a->BreakAfter(0, /*then_down=*/true);
  Push(outbox, 20, 1);  // the session breaks on it
  ASSERT_TRUE(Eventually([&] { return !(*courier)->Stats().connected; }));
  EXPECT_TRUE((*courier)->OfferSnapshot(Picture(21, 1000)));
  EXPECT_TRUE((*courier)->OfferSnapshot(Picture(22, 1500)));
  EXPECT_FALSE((*courier)->OfferSnapshot(Picture(23, 1500)));  // 4,000 bytes would be queued: refused
  transport::CourierStats st = (*courier)->Stats();
  EXPECT_EQ(st.snapshots_dropped, 1u);
  EXPECT_EQ(st.snapshots_queued, 2u);
  a->FailOpen(false);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  ASSERT_TRUE(Eventually([&] { return (*courier)->Stats().snapshots_sent == 4; }));
  EXPECT_EQ(agg->Snapshots().back().second, Picture(22, 1500));
  EXPECT_EQ(agg->StoredOrder().size(), 21u);

  // Pictures still queued when the courier closes are counted as dropped.
  a->BreakAfter(0, /*then_down=*/true);
  Push(outbox, 21, 1);
  ASSERT_TRUE(Eventually([&] { return !(*courier)->Stats().connected; }));
  EXPECT_TRUE((*courier)->OfferSnapshot(Picture(24, 100)));
  (*courier)->Close();
  st = (*courier)->Stats();
  EXPECT_EQ(st.snapshots_dropped, 2u);
  EXPECT_EQ(st.snapshots_queued, 0u);
  EXPECT_EQ(st.snapshots_sent, 4u);
  EXPECT_FALSE((*courier)->OfferSnapshot(Picture(25, 100)));  // closed
  EXPECT_EQ((*courier)->Stats().snapshots_dropped, 3u);
}

TEST(MemoryLinkTest, SourceStatesGoOutAtEachSessionAndWhenTheyChange) {
  auto agg = std::make_shared<FakeAggregator>();
  auto a = std::make_shared<MemoryLink>(agg, "a");
  Outbox outbox(1000);
  EdgeHandler edge;
  auto courier = Courier::Start(Options({a}), &outbox, &edge);
  ASSERT_TRUE(courier.ok()) << courier.status();
  using transport::SourceState;
  using transport::SourceStates;
  const SourceStates connecting{{{"cam", SourceState::kConnecting}}}, streaming{{{"cam", SourceState::kStreaming}}};
  (*courier)->SetSourceStates(connecting);
  ASSERT_TRUE(Eventually([&] { return agg->SourceStatesReceived().size() == 1; }));
  (*courier)->SetSourceStates(connecting);  // unchanged: not sent again
  (*courier)->SetSourceStates(streaming);
  ASSERT_TRUE(Eventually([&] { return agg->SourceStatesReceived().size() == 2; }));
  EXPECT_EQ(agg->SourceStatesReceived()[1].second, streaming);
  EXPECT_EQ(agg->SourceStatesReceived()[1].first, "edge-m");
  // A new session (the old one broke) starts with the newest states.
  a->BreakAfter(0);
  Push(outbox, 0, 1);
  ASSERT_TRUE(outbox.WaitEmpty(kLong));
  ASSERT_TRUE(Eventually([&] { return agg->SourceStatesReceived().size() == 3; }));
  EXPECT_EQ(agg->SourceStatesReceived()[2].second, streaming);
  EXPECT_EQ((*courier)->Stats().source_states_sent, 3u);
}

TEST(FakeAggregatorTest, GrantsEpochsAndFencesLikeTheProtocol) {
  auto agg = std::make_shared<FakeAggregator>();
  MemoryLink first(agg, "1"), second(agg, "2");
  transport::Hello h{"edge", 0, transport::kProtocolVersion};
  StatusOr<transport::Welcome> w1 = first.Open(h, kLong);
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->epoch, 1u);
  // A new instance (epoch 0) is granted 2; the first session is evicted with Reject(kFenced).
  StatusOr<transport::Welcome> w2 = second.Open(h, kLong);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(w2->epoch, 2u);
  StatusOr<std::optional<transport::Message>> m = first.Receive(kLong);
  ASSERT_TRUE(m.ok() && m->has_value()) << m.status();
  ASSERT_TRUE(std::holds_alternative<transport::Reject>(**m));
  EXPECT_EQ(std::get<transport::Reject>(**m).reason, transport::RejectReason::kFenced);
  EXPECT_EQ(std::get<transport::Reject>(**m).epoch, 2u);
  EXPECT_EQ(first.Receive(kLong).status().code(), absl::StatusCode::kUnavailable);
  // The old epoch is refused; the current one re-admitted; promote grants a new one.
  h.epoch = 1;
  EXPECT_EQ(first.Open(h, kLong).status().code(), absl::StatusCode::kPermissionDenied);
  h.epoch = 2;
  EXPECT_EQ(first.Open(h, kLong)->epoch, 2u);
  h.flags = transport::kHelloPromote;
  EXPECT_EQ(second.Open(h, kLong)->epoch, 3u);
  // A report on a re-admitted session is stored and acknowledged.
  h.flags = 0;
  h.epoch = 3;
  ASSERT_TRUE(first.Open(h, kLong).ok());
  transport::OutboxMessage msg;
  msg.report.stream = "cam";
  msg.report.run = 3;
  const transport::OutboxMessage* batch[] = {&msg};
  ASSERT_TRUE(first.Send(batch, kLong).ok());
  m = first.Receive(kLong);
  ASSERT_TRUE(m.ok() && m->has_value());
  ASSERT_TRUE(std::holds_alternative<transport::Ack>(**m));
  EXPECT_EQ(std::get<transport::Ack>(**m).contiguous_through, 0);
  // The Welcome lists what is stored of the streams the Hello names.
  h.streams = {{"cam", 3}, {"other", 1}};
  StatusOr<transport::Welcome> w = first.Open(h, kLong);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->streams, (std::vector<transport::WelcomeStream>{{"cam", 3, 0, 0}, {"other", 1, -1, -1}}));
  first.FailOpen(true);
  EXPECT_EQ(first.Open(h, kLong).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace vigil::testing
