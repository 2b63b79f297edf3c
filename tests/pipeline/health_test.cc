// The edge's own health (health.h), on hand-made samples: times are given, nothing sleeps.
#include "vigil/pipeline/health.h"

#include <gtest/gtest.h>

namespace vigil::pipeline {
namespace {

constexpr int64_t kMs = 1'000'000;

HealthSample Waiting(int64_t idle_ms, uint64_t waiting) {
  HealthSample s;
  s.last_batch_ns = 50'000 * kMs;
  s.now_ns = s.last_batch_ns + idle_ms * kMs;
  s.frames_done = 1000;
  s.frames_pushed = 1000 + waiting;
  return s;
}

TEST(Health, AStallIsNoBatchForStallMsWhileFramesWait) {
  const HealthBounds b{3000, 3};
  EXPECT_EQ(UnhealthyReason(Waiting(2999, 7), b), "");
  EXPECT_EQ(UnhealthyReason(Waiting(3000, 7), b), "no inference batch completed for 3000 ms with 7 frame(s) waiting");
  EXPECT_EQ(UnhealthyReason(Waiting(60000, 0), b), "");  // idle, nothing waiting: not a stall
  EXPECT_EQ(UnhealthyReason(Waiting(60000, 7), HealthBounds{0, 3}), "");  // stall check off
}

TEST(Health, FailingBatchesInARowCountAndComeFirst) {
  HealthSample s = Waiting(10, 2);
  s.last_error = "cudaErrorIllegalAddress";
  s.failed_in_row = 2;
  EXPECT_EQ(UnhealthyReason(s, HealthBounds{3000, 3}), "");
  s.failed_in_row = 3;
  EXPECT_EQ(UnhealthyReason(s, HealthBounds{3000, 3}), "3 inference batches in a row failed (the last: cudaErrorIllegalAddress)");
  s.now_ns += 10'000 * kMs;  // stalled as well: the failures are the reason given
  EXPECT_EQ(UnhealthyReason(s, HealthBounds{3000, 3}), "3 inference batches in a row failed (the last: cudaErrorIllegalAddress)");
  EXPECT_EQ(UnhealthyReason(s, HealthBounds{3000, 0}), "no inference batch completed for 10010 ms with 2 frame(s) waiting");
  EXPECT_EQ(UnhealthyReason(s, HealthBounds{0, 0}), "");
}

}  // namespace
}  // namespace vigil::pipeline
