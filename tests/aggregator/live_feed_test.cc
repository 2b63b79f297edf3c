#include "aggregator/live_feed.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace vigil::aggregator {
namespace {

EventDecision Decision(uint64_t seq, EventState state, const std::string& reason) {
  EventDecision d;
  d.edge = "edge-1";
  d.stream = "cam0";
  d.run = 2;
  d.seq = seq;
  d.state = state;
  d.reason = reason;
  return d;
}

TEST(LiveFeedTest, EventsStoredMovesTheVersionAndWakesAWaiter) {
  FakeClock clock;
  LiveFeed feed(&clock);
  ASSERT_EQ(feed.Version(), std::optional<uint64_t>(0));
  // Nothing changed: under the fake clock the wait times out at once.
  EXPECT_EQ(feed.WaitForChange(0, 15'000'000'000), LiveFeed::Wake::kTimeout);
  feed.EventsStored();
  EXPECT_EQ(feed.Version(), std::optional<uint64_t>(1));
  EXPECT_EQ(feed.WaitForChange(0, 15'000'000'000), LiveFeed::Wake::kChanged);
  EXPECT_EQ(feed.WaitForChange(1, 0), LiveFeed::Wake::kTimeout);
}

TEST(LiveFeedTest, OnlyAppliedDecisionsAreFedInOrderFromACursor) {
  FakeClock clock;
  LiveFeed feed(&clock);
  EventDecision confirmed = Decision(7, EventState::kConfirmed, "seen in 3 of 5 frames");
  confirmed.detections.push_back({1, "person", "worker", 0.75f});
  const std::vector<EventDecision> decisions = {confirmed, Decision(8, EventState::kRejected, "too short")};
  DecisionResult decided;
  decided.applied = {true, false};  // the second was decided before: not fed
  feed.PublishDecisions(decisions, decided, 1234);
  EXPECT_EQ(feed.decided_seq(), 1u);
  EXPECT_EQ(feed.Version(), std::optional<uint64_t>(1));

  uint64_t cursor = 0;
  std::string out;
  feed.AppendDecisions(&cursor, &out);
  EXPECT_EQ(cursor, 1u);
  const std::string prefix = "event: state\ndata: ";
  ASSERT_EQ(out.substr(0, prefix.size()), prefix);
  ASSERT_EQ(out.substr(out.size() - 2), "\n\n");
  const nlohmann::json j = nlohmann::json::parse(out.substr(prefix.size(), out.size() - prefix.size() - 2));
  EXPECT_EQ(j["key"], "edge-1/cam0/2/7");
  EXPECT_EQ(j["state"], "confirmed");
  EXPECT_EQ(j["state_reason"], "seen in 3 of 5 frames");
  EXPECT_EQ(j["decided_ns"], 1234);
  ASSERT_EQ(j["detections"].size(), 1u);
  EXPECT_EQ(j["detections"][0]["index"], 1);
  EXPECT_EQ(j["detections"][0]["second_label"], "worker");

  // Nothing newer than the cursor: nothing appended.
  std::string again;
  feed.AppendDecisions(&cursor, &again);
  EXPECT_EQ(again, "");

  // A batch where nothing applied moves neither the feed nor the version.
  decided.applied = {false, false};
  feed.PublishDecisions(decisions, decided, 1300);
  EXPECT_EQ(feed.decided_seq(), 1u);
  EXPECT_EQ(feed.Version(), std::optional<uint64_t>(1));
}

TEST(LiveFeedTest, TheFeedKeepsTheNewestDecisions) {
  LiveFeed feed;
  std::vector<EventDecision> decisions;
  DecisionResult decided;
  for (uint64_t i = 0; i < LiveFeed::kMaxDecided + 10; ++i) {
    decisions.push_back(Decision(i, EventState::kRejected, "r"));
    decided.applied.push_back(true);
  }
  feed.PublishDecisions(decisions, decided, 1);
  uint64_t cursor = 0;
  std::string out;
  feed.AppendDecisions(&cursor, &out);
  EXPECT_EQ(cursor, LiveFeed::kMaxDecided + 10);
  size_t n = 0;
  for (size_t at = out.find("event: state"); at != std::string::npos; at = out.find("event: state", at + 1)) ++n;
  EXPECT_EQ(n, LiveFeed::kMaxDecided);
  EXPECT_EQ(out.find("\"key\":\"edge-1/cam0/2/9\""), std::string::npos);  // the oldest ten went
  EXPECT_NE(out.find("\"key\":\"edge-1/cam0/2/10\""), std::string::npos);
}

TEST(LiveFeedTest, CloseEndsEveryWait) {
  FakeClock clock;
  LiveFeed feed(&clock);
  feed.Close();
  EXPECT_EQ(feed.Version(), std::nullopt);
  EXPECT_EQ(feed.WaitForChange(0, 15'000'000'000), LiveFeed::Wake::kClosed);
}

}  // namespace
}  // namespace vigil::aggregator
