#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "vigil/pipeline/edge_state.h"
#include "vigil/pipeline/progress.h"

namespace vigil::pipeline {
namespace {

TEST(ProgressCoalescer, MergesConsecutiveSeqsAndSplitsAtGaps) {
  ProgressCoalescer p("cam", 7);
  EXPECT_FALSE(p.Add(0, 1000, 10, 640, 480, 0));
  EXPECT_FALSE(p.Add(1, 2000, 20, 640, 480, 1));
  EXPECT_FALSE(p.Add(2, 3000, 30, 640, 480, 2));
  // seq 3 was an event: 4 starts a new range and hands out 0..2.
  std::optional<transport::Report> r = p.Add(4, 5000, 50, 640, 480, 3);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stream, "cam");
  EXPECT_EQ(r->run, 7u);
  EXPECT_EQ(r->seq_first, 0u);
  EXPECT_EQ(r->seq_last, 2u);
  EXPECT_EQ(r->kind, transport::ReportKind::kProgress);
  EXPECT_EQ(r->capture_ns, 1000);
  EXPECT_EQ(r->pts_ns, 10);
  EXPECT_EQ(r->width, 640u);
  EXPECT_TRUE(r->detections.empty());
  EXPECT_TRUE(transport::ValidateReport([&] {
                transport::Report v = *r;
                v.edge = "e";
                return v;
              }())
                  .ok());
  r = p.Take();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->seq_first, 4u);
  EXPECT_EQ(r->seq_last, 4u);
  EXPECT_FALSE(p.Take());
}

TEST(ProgressCoalescer, FlushesByAge) {
  ProgressCoalescer p("cam", 1);
  EXPECT_FALSE(p.Add(10, 0, 0, 1, 1, 1'000));
  EXPECT_FALSE(p.Add(11, 0, 0, 1, 1, 1'400));
  EXPECT_FALSE(p.TakeIfOlder(1'499, 500));  // started at 1000: 499 ns old
  std::optional<transport::Report> r = p.TakeIfOlder(1'500, 500);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->seq_first, 10u);
  EXPECT_EQ(r->seq_last, 11u);
  EXPECT_FALSE(p.TakeIfOlder(1'000'000, 500));  // nothing pending
}

class StateDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("vigil_edge_state_" + std::to_string(std::random_device{}()));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(StateDir, EpochIncrementsAtEveryOpen) {
  for (uint64_t expected = 1; expected <= 3; ++expected) {
    StatusOr<EdgeState> s = EdgeState::Open(dir_.string());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->epoch(), expected);
  }
  std::ifstream in(dir_ / "epoch");
  std::string text;
  in >> text;
  EXPECT_EQ(text, "3");
}

TEST_F(StateDir, StreamCursorRoundTrip) {
  EdgeState s = *EdgeState::Open(dir_.string());
  EXPECT_FALSE(*s.Load("cam/1"));
  const StreamCursor a{42, std::nullopt, "/videos/a b.mp4"};
  ASSERT_TRUE(s.Save("cam/1", a).ok());
  EXPECT_EQ(**s.Load("cam/1"), a);
  const StreamCursor b{42, 199, "/videos/a b.mp4"};
  ASSERT_TRUE(s.Save("cam/1", b).ok());
  EdgeState reopened = *EdgeState::Open(dir_.string());
  EXPECT_EQ(**reopened.Load("cam/1"), b);
  EXPECT_FALSE(*reopened.Load("cam"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "streams" / "cam%2F1.state"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "streams" / "cam%2F1.state.tmp"));
}

TEST_F(StateDir, MalformedFilesAreDataLoss) {
  EdgeState s = *EdgeState::Open(dir_.string());
  std::ofstream(dir_ / "streams" / "x.state") << "run twelve\ncursor none\nsource a\n";
  EXPECT_TRUE(absl::IsDataLoss(s.Load("x").status()));
  std::ofstream(dir_ / "epoch") << "-3\n";
  EXPECT_TRUE(absl::IsDataLoss(EdgeState::Open(dir_.string()).status()));
}

}  // namespace
}  // namespace vigil::pipeline
