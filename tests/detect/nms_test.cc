// NMS hand cases: suppression within a class, classes kept apart unless agnostic, the strict
// IoU threshold, greedy chains, max_det, the candidate cap and deterministic ties.
#include "vigil/detect/nms.h"

#include <gtest/gtest.h>

namespace vigil::detect {
namespace {

Detection Box(float x1, float y1, float x2, float y2, float score, int cls = 0) {
  return {x1, y1, x2, y2, score, cls};
}

TEST(IoU, HandValues) {
  // Overlap 9×10 = 90, union 100 + 100 − 90 = 110.
  EXPECT_FLOAT_EQ(IoU(Box(0, 0, 10, 10, 1), Box(1, 0, 11, 10, 1)), 90.0f / 110.0f);
  EXPECT_FLOAT_EQ(IoU(Box(0, 0, 10, 10, 1), Box(10, 0, 20, 10, 1)), 0.0f);  // touching edges
  EXPECT_FLOAT_EQ(IoU(Box(0, 0, 10, 10, 1), Box(2, 2, 4, 4, 1)), 4.0f / 100.0f);
  EXPECT_FLOAT_EQ(IoU(Box(5, 5, 5, 5, 1), Box(5, 5, 5, 5, 1)), 0.0f);  // empty union
}

TEST(NonMaxSuppression, SameClassSuppressedOtherClassKeptUnlessAgnostic) {
  const std::vector<Detection> in = {Box(1, 0, 11, 10, 0.8f, 0), Box(0, 0, 10, 10, 0.9f, 0),
                                     Box(1, 0, 11, 10, 0.7f, 1)};
  const auto kept = NonMaxSuppression(in, {.iou = 0.7f});
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_FLOAT_EQ(kept[0].score, 0.9f);
  EXPECT_EQ(kept[0].class_id, 0);
  EXPECT_FLOAT_EQ(kept[1].score, 0.7f);
  EXPECT_EQ(kept[1].class_id, 1);

  const auto agnostic = NonMaxSuppression(in, {.iou = 0.7f, .agnostic = true});
  ASSERT_EQ(agnostic.size(), 1u);
  EXPECT_FLOAT_EQ(agnostic[0].score, 0.9f);
}

TEST(NonMaxSuppression, ThresholdIsStrict) {
  // IoU of these two is exactly 70/100 = 0.7: kept at iou 0.7, suppressed at 0.69.
  const std::vector<Detection> in = {Box(0, 0, 10, 10, 0.9f), Box(0, 0, 10, 7, 0.8f)};
  EXPECT_EQ(NonMaxSuppression(in, {.iou = 0.7f}).size(), 2u);
  EXPECT_EQ(NonMaxSuppression(in, {.iou = 0.69f}).size(), 1u);
}

TEST(NonMaxSuppression, GreedyChainKeepsTheThirdBox) {
  // A suppresses B (IoU 70/130 = 0.54); B would suppress C but is gone; A–C IoU is 40/160 = 0.25.
  const std::vector<Detection> in = {Box(6, 0, 16, 10, 0.7f), Box(3, 0, 13, 10, 0.8f), Box(0, 0, 10, 10, 0.9f)};
  const auto kept = NonMaxSuppression(in, {.iou = 0.5f});
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_FLOAT_EQ(kept[0].x1, 0);
  EXPECT_FLOAT_EQ(kept[1].x1, 6);
}

TEST(NonMaxSuppression, MaxDetAndCandidateCap) {
  std::vector<Detection> in;
  for (int i = 0; i < 5; ++i) in.push_back(Box(20.0f * i, 0, 20.0f * i + 10, 10, 0.1f * (i + 1)));
  const auto three = NonMaxSuppression(in, {.max_det = 3});
  ASSERT_EQ(three.size(), 3u);
  EXPECT_FLOAT_EQ(three[0].score, 0.5f);
  EXPECT_FLOAT_EQ(three[1].score, 0.4f);
  EXPECT_FLOAT_EQ(three[2].score, 0.3f);
  // Only the 2 best candidates enter at all.
  const auto capped = NonMaxSuppression(in, {.max_candidates = 2});
  ASSERT_EQ(capped.size(), 2u);
  EXPECT_FLOAT_EQ(capped[1].score, 0.4f);
}

TEST(NonMaxSuppression, EqualScoresKeepInputOrder) {
  // Same score, same class, overlapping: the one given first wins, whichever it is.
  const Detection a = Box(0, 0, 10, 10, 0.5f), b = Box(0, 0, 10, 10.5f, 0.5f);
  const auto ab = NonMaxSuppression({a, b}, {});
  ASSERT_EQ(ab.size(), 1u);
  EXPECT_FLOAT_EQ(ab[0].y2, 10.0f);
  const auto ba = NonMaxSuppression({b, a}, {});
  ASSERT_EQ(ba.size(), 1u);
  EXPECT_FLOAT_EQ(ba[0].y2, 10.5f);
  // Disjoint equal scores come out in input order.
  const auto order = NonMaxSuppression({Box(50, 0, 60, 10, 0.5f, 2), Box(0, 0, 10, 10, 0.5f, 1)}, {});
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0].class_id, 2);
  EXPECT_EQ(order[1].class_id, 1);
}

TEST(TopByScore, SortsAndTruncatesWithoutSuppression) {
  const auto top = TopByScore({Box(0, 0, 10, 10, 0.3f), Box(0, 0, 10, 10, 0.9f), Box(0, 0, 10, 10, 0.6f)}, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_FLOAT_EQ(top[0].score, 0.9f);
  EXPECT_FLOAT_EQ(top[1].score, 0.6f);
}

}  // namespace
}  // namespace vigil::detect
