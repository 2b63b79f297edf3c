#include "vigil/common/frame_key.h"

#include <gtest/gtest.h>

#include <set>
#include <unordered_set>

namespace vigil {
namespace {

TEST(FrameKey, OrdersByEdgeStreamRunSeq) {
  const FrameKey a{"e1", "cam1", 1, 9}, b{"e1", "cam1", 2, 0}, c{"e1", "cam2", 0, 0}, d{"e2", "cam0", 0, 0};
  EXPECT_LT(a, b);  // a later run follows every seq of an earlier one
  EXPECT_LT(b, c);
  EXPECT_LT(c, d);
  std::set<FrameKey> sorted{d, c, b, a};
  EXPECT_EQ(*sorted.begin(), a);
  EXPECT_EQ(*sorted.rbegin(), d);
}

TEST(FrameKey, SameRunComparesAllButSeq) {
  const FrameKey a{"e1", "cam1", 3, 7};
  EXPECT_TRUE(a.SameRun({"e1", "cam1", 3, 100}));
  EXPECT_FALSE(a.SameRun({"e1", "cam1", 4, 7}));
  EXPECT_FALSE(a.SameRun({"e2", "cam1", 3, 7}));
  EXPECT_FALSE(a.SameRun({"e1", "cam2", 3, 7}));
}

TEST(FrameKey, HashesEqualKeysAlikeAndNamesThemInOrder) {
  std::unordered_set<FrameKey, FrameKeyHash> keys{{"e", "s", 1, 2}, {"e", "s", 1, 2}, {"e", "s", 2, 1}};
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_EQ(FrameKey({"edge-a", "dock", 4, 17}).ToString(), "edge-a/dock/4/17");
}

}  // namespace
}  // namespace vigil
