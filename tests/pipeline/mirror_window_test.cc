// The standby's window of mirrored live pictures (pipeline/mirror_window.h): what it keeps, forgets and hands
// over at a takeover.
#include "vigil/pipeline/mirror_window.h"

#include <gtest/gtest.h>

namespace vigil::pipeline {
namespace {

replication::MirroredFrame Pic(const std::string& stream, uint64_t run, uint64_t seq, size_t bytes = 10) {
  return {stream, run, seq, 1000 + static_cast<int64_t>(seq), 40 * static_cast<int64_t>(seq), 64, 48,
          std::string(bytes, static_cast<char>('a' + seq % 26))};
}

TEST(MirrorWindow, KeepsWhatTheAggregatorHasNotAcknowledgedAndHandsItOverInSeqOrder) {
  MirrorWindow w({"cam", "door"}, 100);
  for (uint64_t q = 0; q < 10; ++q) w.Add(Pic("cam", 5, q));
  w.Add(Pic("door", 5, 3));
  w.Follow({{"cam", "rtsp://c", 5, 6, 12}, {"door", "rtsp://d", 5, std::nullopt, 4}});
  std::optional<MirroredSeqs> s = w.Seqs("cam", 5);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->run, 5u);
  EXPECT_EQ(s->seqs, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_EQ(w.stats("cam").held, 3u);
  EXPECT_EQ(w.stats("cam").bytes, 30u);
  EXPECT_EQ(w.stats("cam").acked, 7u);
  ASSERT_TRUE(w.Held("cam"));  // the run of the last state followed
  EXPECT_EQ(w.Held("cam")->run, 5u);
  EXPECT_EQ(w.Held("cam")->seqs, (std::vector<uint64_t>{7, 8, 9}));
  w.Add(Pic("cam", 5, 4));  // acknowledged already: not kept
  EXPECT_EQ(w.stats("cam").held, 3u);
  EXPECT_EQ(w.stats("cam").received, 11u);
  EXPECT_FALSE(w.Seqs("cam", 4)) << "another run";
  const std::vector<replication::MirroredFrame> got = w.Take("cam", 5, {8, 9, 11});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].seq, 8u);
  EXPECT_EQ(got[0].jpeg, std::string(10, 'i'));
  EXPECT_EQ(got[0].capture_ns, 1008);
  EXPECT_EQ(got[1].seq, 9u);
  EXPECT_FALSE(w.Seqs("cam", 5)) << "Take forgets the stream's frames";
  EXPECT_EQ(w.stats("cam").bytes, 0u);
  ASSERT_TRUE(w.Seqs("door", 5));
  EXPECT_EQ(w.Seqs("door", 5)->seqs, std::vector<uint64_t>{3});
}

// Wanted answers what Add would keep, before any pixels are copied (a frame ring asks it), and counts a picture
// it turns away as Add would have: received and acknowledged.
TEST(MirrorWindow, WantedTurnsAwayWhatAddWouldNotKeepAndCountsItTheSame) {
  MirrorWindow w({"cam"}, 100);
  EXPECT_TRUE(w.Wanted(Pic("cam", 5, 0))) << "no ledger state yet: everything is wanted";
  w.Follow({{"cam", "rtsp://c", 5, 6, 12}});
  EXPECT_FALSE(w.Wanted(Pic("cam", 5, 6))) << "acknowledged through 6";
  EXPECT_FALSE(w.Wanted(Pic("cam", 5, 2)));
  EXPECT_FALSE(w.Wanted(Pic("cam", 4, 9))) << "a run the ledger left";
  EXPECT_TRUE(w.Wanted(Pic("cam", 5, 7)));
  EXPECT_TRUE(w.Wanted(Pic("cam", 6, 0))) << "a newer run";
  EXPECT_TRUE(w.Wanted(Pic("elsewhere", 5, 1))) << "an unknown stream goes to Add, which counts it";
  EXPECT_EQ(w.stats("cam").received, 3u);
  EXPECT_EQ(w.stats("cam").acked, 3u);
  EXPECT_EQ(w.stats("cam").held, 0u);
  EXPECT_EQ(w.unknown(), 0u);
}

TEST(MirrorWindow, ABoundedWindowEvictsTheOldestAndCountsIt) {
  MirrorWindow w({"cam"}, 4);
  for (uint64_t q = 0; q < 10; ++q) w.Add(Pic("cam", 2, q, q + 1));
  EXPECT_FALSE(w.Held("cam")) << "no ledger state followed yet: no run to name";
  EXPECT_EQ(w.Seqs("cam", 2)->seqs, (std::vector<uint64_t>{6, 7, 8, 9}));
  const MirrorWindowStats st = w.stats("cam");
  EXPECT_EQ(st.evicted, 6u);
  EXPECT_EQ(st.held, 4u);
  EXPECT_EQ(st.bytes, 7u + 8 + 9 + 10);
}

TEST(MirrorWindow, ANewRunDropsTheOldOnesFramesAndASeqNumberedAgainReplacesItsPicture) {
  MirrorWindow w({"cam"}, 10);
  w.Add(Pic("cam", 2, 5));
  w.Add(Pic("cam", 2, 6));
  w.Add(Pic("cam", 2, 6, 3));  // numbered again by a restarted primary: the newer picture wins
  EXPECT_EQ(w.stats("cam").bytes, 13u);
  w.Follow({{"cam", "rtsp://c", 3, std::nullopt, 0}});
  EXPECT_FALSE(w.Seqs("cam", 2));
  EXPECT_EQ(w.stats("cam").held, 0u);
  w.Add(Pic("cam", 2, 7));  // an older run's straggler
  EXPECT_EQ(w.stats("cam").held, 0u);
  w.Add(Pic("other", 3, 1));
  EXPECT_EQ(w.unknown(), 1u);
}

replication::MirroredResult Result(const std::string& stream, uint64_t run, uint64_t seq, int detections) {
  replication::MirroredResult r{stream, run, seq, 1000 + static_cast<int64_t>(seq), 40 * static_cast<int64_t>(seq),
                                64, 48, {}};
  for (int k = 0; k < detections; ++k) {
    r.detections.push_back({1.0f * k, 2.0f, 10.0f + k, 20.0f, 0.5f + 0.01f * k, k});
  }
  return r;
}

// The primary's results are kept beside the pictures: a seq is held when either is; Take attaches the result
// (and hands a result alone as a frame without a picture); acknowledgements and new runs prune both.
TEST(MirrorWindow, ResultsAreKeptBesideThePicturesAndHandedOverWithThem) {
  MirrorWindow w({"cam"}, 100);
  for (uint64_t q = 0; q < 6; ++q) w.Add(Pic("cam", 5, q));
  for (uint64_t q = 0; q < 4; ++q) w.AddResult(Result("cam", 5, q, static_cast<int>(q)));
  w.AddResult(Result("cam", 5, 7, 2));  // a result whose picture never came (evicted on its way)
  w.AddResult(Result("door", 5, 1, 1));  // not served here
  EXPECT_EQ(w.unknown(), 1u);
  w.Follow({{"cam", "rtsp://c", 5, 1, 8}});  // 0 and 1 stored: picture and result go
  EXPECT_EQ(w.stats("cam").held, 4u);
  EXPECT_EQ(w.stats("cam").results_held, 3u);
  EXPECT_EQ(w.stats("cam").results_received, 5u);
  ASSERT_TRUE(w.Seqs("cam", 5));
  EXPECT_EQ(w.Seqs("cam", 5)->seqs, (std::vector<uint64_t>{2, 3, 4, 5, 7})) << "pictures and results, once each";
  w.AddResult(Result("cam", 5, 1, 3));  // acknowledged already: not kept
  EXPECT_EQ(w.stats("cam").results_held, 3u);
  const std::vector<replication::MirroredFrame> got = w.Take("cam", 5, {3, 4, 7});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].seq, 3u);
  EXPECT_TRUE(got[0].has_picture());
  ASSERT_TRUE(got[0].result);
  EXPECT_EQ(*got[0].result, Result("cam", 5, 3, 3));
  EXPECT_EQ(got[1].seq, 4u);
  EXPECT_TRUE(got[1].has_picture());
  EXPECT_FALSE(got[1].result) << "processed by nobody: its picture is run again";
  EXPECT_EQ(got[2].seq, 7u);
  EXPECT_FALSE(got[2].has_picture());
  ASSERT_TRUE(got[2].result);
  EXPECT_EQ(got[2].result->detections.size(), 2u);
  EXPECT_EQ(got[2].capture_ns, 1007) << "the frame's identity comes from the result";
  EXPECT_EQ(got[2].pts_ns, 280);
  EXPECT_EQ(got[2].width, 64u);
  EXPECT_EQ(got[2].height, 48u);
  EXPECT_EQ(w.stats("cam").results_held, 0u) << "Take forgets the stream's results too";
  EXPECT_FALSE(w.Seqs("cam", 5));
}

TEST(MirrorWindow, ResultsAreBoundedLikePicturesAndANewRunDropsThem) {
  MirrorWindow w({"cam"}, 3);
  for (uint64_t q = 0; q < 5; ++q) w.AddResult(Result("cam", 2, q, 1));
  EXPECT_EQ(w.Seqs("cam", 2)->seqs, (std::vector<uint64_t>{2, 3, 4})) << "the oldest go";
  EXPECT_EQ(w.stats("cam").results_evicted, 2u);
  w.AddResult(Result("cam", 2, 4, 5));  // numbered again by a restarted primary: the newer result wins
  EXPECT_EQ(w.stats("cam").results_held, 3u);
  w.Follow({{"cam", "rtsp://c", 3, std::nullopt, 0}});
  EXPECT_EQ(w.stats("cam").results_held, 0u);
  EXPECT_FALSE(w.Seqs("cam", 2));
}

}  // namespace
}  // namespace vigil::pipeline
