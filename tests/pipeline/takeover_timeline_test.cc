#include "vigil/pipeline/takeover_timeline.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace vigil::pipeline {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(TakeoverTimeline, NothingIsRecordedBeforeTheContactIsKnown) {
  TakeoverTimeline t;
  EXPECT_FALSE(t.started());
  EXPECT_FALSE(t.Mark(TakeoverTimeline::kDecided, 5 * kMs));  // a primary's own Welcome: not a takeover
  t.Start(100 * kMs);
  EXPECT_FALSE(t.Seconds(TakeoverTimeline::kDecided).has_value());
}

TEST(TakeoverTimeline, PhasesAreTimedFromTheContactAndTheFirstMarkWins) {
  TakeoverTimeline t;
  t.Start(1000 * kMs);
  EXPECT_TRUE(t.Mark(TakeoverTimeline::kDecided, 1000 * kMs));
  EXPECT_TRUE(t.Mark(TakeoverTimeline::kWelcomed, 1012 * kMs + kMs / 2));
  EXPECT_FALSE(t.Mark(TakeoverTimeline::kWelcomed, 1400 * kMs));  // a reconnect's Welcome: not the takeover's
  EXPECT_TRUE(t.Mark(TakeoverTimeline::kStored, 1063 * kMs));
  EXPECT_DOUBLE_EQ(*t.Seconds(TakeoverTimeline::kWelcomed), 0.0125);
  EXPECT_DOUBLE_EQ(*t.Seconds(TakeoverTimeline::kStored), 0.063);
  EXPECT_FALSE(t.Seconds(TakeoverTimeline::kFed).has_value());
  EXPECT_EQ(t.Format(),
            "decided 0.0, drained -, serving -, ledger -, welcomed 12.5, durable -, resumed -, fed -, detected -, "
            "stored 63.0, republished -, republished_stored -");
  EXPECT_STREQ(TakeoverTimeline::Name(TakeoverTimeline::kRepublishedStored), "republished_stored");
  // A later takeover (a rejoined node takes over again) starts a fresh timeline.
  t.Start(5000 * kMs);
  EXPECT_FALSE(t.Seconds(TakeoverTimeline::kStored).has_value());
  EXPECT_TRUE(t.Mark(TakeoverTimeline::kStored, 5100 * kMs));
  EXPECT_DOUBLE_EQ(*t.Seconds(TakeoverTimeline::kStored), 0.1);
}

TEST(TakeoverTimeline, OneOfManyConcurrentMarksOfAPhaseWins) {
  TakeoverTimeline t;
  t.Start(1);
  std::atomic<int> won{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { won += t.Mark(TakeoverTimeline::kFed, 10 + i) ? 1 : 0; });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(won.load(), 1);
  ASSERT_TRUE(t.Seconds(TakeoverTimeline::kFed).has_value());
  EXPECT_GE(*t.Seconds(TakeoverTimeline::kFed), 9e-9);
  EXPECT_LE(*t.Seconds(TakeoverTimeline::kFed), 16e-9);
}

}  // namespace
}  // namespace vigil::pipeline
