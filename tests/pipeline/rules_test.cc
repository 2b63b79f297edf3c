#include "vigil/pipeline/rules.h"

#include <gtest/gtest.h>

namespace vigil::pipeline {
namespace {

using detect::Detection;
const std::vector<std::string> kNames = {"person", "bicycle", "car", "dog"};

Detection Box(int cls, float score, float cx, float cy) { return {cx - 5, cy - 5, cx + 5, cy + 5, score, cls}; }

TEST(PointInPolygon, HandComputedCases) {
  const Polygon square = {{0, 0}, {10, 0}, {10, 10}, {0, 10}};
  EXPECT_TRUE(PointInPolygon(square, 5, 5));
  EXPECT_FALSE(PointInPolygon(square, 15, 5));
  EXPECT_FALSE(PointInPolygon(square, -0.1, 5));
  // Triangle (0,0) (10,0) (0,10): inside iff x + y < 10.
  const Polygon tri = {{0, 0}, {10, 0}, {0, 10}};
  EXPECT_TRUE(PointInPolygon(tri, 4.9, 5));
  EXPECT_FALSE(PointInPolygon(tri, 5.1, 5));
  // Concave "U": (0,0) (9,0) (9,9) (6,9) (6,3) (3,3) (3,9) (0,9): the notch x in (3,6), y > 3 is outside.
  const Polygon u = {{0, 0}, {9, 0}, {9, 9}, {6, 9}, {6, 3}, {3, 3}, {3, 9}, {0, 9}};
  EXPECT_FALSE(PointInPolygon(u, 4.5, 6));
  EXPECT_TRUE(PointInPolygon(u, 1.5, 6));
  EXPECT_TRUE(PointInPolygon(u, 4.5, 1.5));
  // Orientation does not matter.
  const Polygon reversed = {{0, 10}, {10, 10}, {10, 0}, {0, 0}};
  EXPECT_TRUE(PointInPolygon(reversed, 5, 5));
}

TEST(RuleEngine, ClassAllowListByNameAndIdAndMinScore) {
  RulesConfig c;
  c.classes = {"dog", "0"};
  c.min_score = 0.5;
  StatusOr<RuleEngine> r = RuleEngine::Create(c, kNames);
  ASSERT_TRUE(r.ok()) << r.status();
  Verdict v = r->Evaluate({Box(2, 0.9f, 1, 1), Box(3, 0.6f, 1, 1), Box(0, 0.4f, 1, 1), Box(0, 0.5f, 1, 1)}, 0);
  EXPECT_TRUE(v.event);
  ASSERT_EQ(v.detections.size(), 2u);
  EXPECT_EQ(v.detections[0].class_id, 3);
  EXPECT_EQ(v.detections[1].class_id, 0);
  EXPECT_FALSE(r->Evaluate({Box(2, 0.99f, 1, 1)}, 1).event);
}

TEST(RuleEngine, UnknownClassIsAnError) {
  RulesConfig c;
  c.classes = {"unicorn"};
  StatusOr<RuleEngine> r = RuleEngine::Create(c, kNames);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unicorn"), std::string_view::npos);
  c.classes = {"4"};
  EXPECT_FALSE(RuleEngine::Create(c, kNames).ok());
}

TEST(RuleEngine, RoiUsesBoxCentre) {
  RulesConfig c;
  c.roi = {{{100, 100}, {200, 100}, {200, 200}, {100, 200}}};
  RuleEngine r = *RuleEngine::Create(c, kNames);
  // Box 95..105 overlaps the ROI but its centre (100 - 0.5 = 99.5) is outside.
  EXPECT_FALSE(r.Evaluate({Box(0, 0.9f, 99.5f, 150)}, 0).event);
  EXPECT_TRUE(r.Evaluate({Box(0, 0.9f, 100.5f, 150)}, 1).event);
}

TEST(RuleEngine, KOfMConfirmation) {
  RulesConfig c;
  c.confirm_k = 2;
  c.confirm_m = 3;
  RuleEngine r = *RuleEngine::Create(c, kNames);
  const std::vector<Detection> hit = {Box(0, 0.9f, 1, 1)};
  // Frames: hit, miss, hit, miss, miss, hit, hit → windows of 3: events at frames 2 (h,m,h) and 6 (m,h,h).
  const std::vector<bool> qualifies = {true, false, true, false, false, true, true};
  const std::vector<bool> expected = {false, false, true, false, false, false, true};
  for (size_t i = 0; i < qualifies.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r.Evaluate(qualifies[i] ? hit : std::vector<Detection>{}, static_cast<int64_t>(i)).event, expected[i]);
  }
}

TEST(RuleEngine, CooldownInStreamTime) {
  RulesConfig c;
  c.cooldown_s = 1.0;
  RuleEngine r = *RuleEngine::Create(c, kNames);
  const std::vector<Detection> hit = {Box(0, 0.9f, 1, 1)};
  EXPECT_TRUE(r.Evaluate(hit, 0).event);
  EXPECT_FALSE(r.Evaluate(hit, 500'000'000).event);
  EXPECT_FALSE(r.Evaluate(hit, 999'999'999).event);
  EXPECT_TRUE(r.Evaluate(hit, 1'000'000'000).event);
  EXPECT_FALSE(r.Evaluate(hit, 1'900'000'000).event);
}

TEST(RuleEngine, SeverityFromBestScore) {
  RulesConfig c;
  c.critical = 0.9;
  c.warning = 0.5;
  RuleEngine r = *RuleEngine::Create(c, kNames);
  EXPECT_EQ(r.Evaluate({Box(0, 0.3f, 1, 1), Box(1, 0.95f, 1, 1)}, 0).severity, transport::Severity::kCritical);
  EXPECT_EQ(r.Evaluate({Box(0, 0.9f, 1, 1)}, 1).severity, transport::Severity::kCritical);
  EXPECT_EQ(r.Evaluate({Box(0, 0.6f, 1, 1)}, 2).severity, transport::Severity::kWarning);
  EXPECT_EQ(r.Evaluate({Box(0, 0.2f, 1, 1)}, 3).severity, transport::Severity::kInfo);
  EXPECT_EQ(r.Evaluate({}, 4).severity, transport::Severity::kNone);
}

}  // namespace
}  // namespace vigil::pipeline
