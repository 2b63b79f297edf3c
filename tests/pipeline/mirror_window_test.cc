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

}  // namespace
}  // namespace vigil::pipeline
