// The Snapshotter: an event's pictures encoded on its own thread and handed to the sink; what cannot be is counted.
#include "vigil/pipeline/snapshotter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "vigil/video/jpeg.h"

namespace vigil::pipeline {
namespace {

video::Frame Gradient(const std::string& stream, uint64_t seq, int w, int h) {
  video::Frame f;
  f.stream_id = stream;
  f.run = 7;
  f.seq = seq;
  f.width = w;
  f.height = h;
  f.stride = w * 3;
  f.bgr.resize(static_cast<size_t>(f.stride) * h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &f.bgr[static_cast<size_t>(y) * f.stride + x * 3];
      p[0] = static_cast<uint8_t>(x * 255 / w);
      p[1] = static_cast<uint8_t>(y * 255 / h);
      p[2] = 128;
    }
  }
  return f;
}

struct Record {
  std::mutex mu;
  std::vector<transport::Snapshot> sent;
  std::map<std::string, uint64_t> outcomes;
  std::atomic<bool> refuse{false};
};

TEST(SnapshotterTest, EncodesTheFrameAndACropPerBoxAndNamesThemByTheirFrame) {
  if (!video::JpegAvailable()) GTEST_SKIP() << "built without libturbojpeg";
  Record rec;
  Snapshotter s(
      4,
      [&](transport::Snapshot snap) {
        if (rec.refuse) return false;
        std::lock_guard lock(rec.mu);
        rec.sent.push_back(std::move(snap));
        return true;
      },
      [&](size_t stream, const char* outcome, uint64_t n) {
        std::lock_guard lock(rec.mu);
        rec.outcomes[std::to_string(stream) + ":" + outcome] += n;
      });
  Snapshotter::Job job;
  job.stream = 1;
  job.frame = Gradient("door", 42, 640, 360);
  job.boxes = {{100, 50, 200, 250}, {600, 300, 700, 400}, {-50, -50, -10, -10}};  // the third is outside: no crop
  job.options.crops = true;
  job.options.frame_max_width = 320;
  ASSERT_TRUE(s.Offer(std::move(job)));
  ASSERT_TRUE(s.WaitIdle(10000));
  std::lock_guard lock(rec.mu);
  ASSERT_EQ(rec.sent.size(), 3u);
  const transport::Snapshot& frame = rec.sent[0];
  EXPECT_EQ(frame.stream, "door");
  EXPECT_EQ(frame.run, 7u);
  EXPECT_EQ(frame.seq, 42u);
  EXPECT_EQ(frame.box, -1);
  EXPECT_EQ(frame.width, 640u);
  EXPECT_EQ(frame.out_width, 320u);
  EXPECT_EQ(frame.out_height, 180u);
  EXPECT_TRUE(transport::ValidateSnapshot(frame).ok());
  video::Frame decoded;
  ASSERT_TRUE(video::DecodeJpeg(frame.jpeg, &decoded).ok());
  EXPECT_EQ(decoded.width, 320);
  EXPECT_EQ(rec.sent[1].box, 0);
  EXPECT_EQ(rec.sent[1].x, 84u);  // floor(100 − 0.15 × 100): 0.15 is not exact, the region grows outward
  EXPECT_EQ(rec.sent[1].y, 19u);  // floor(50 − 0.15 × 200)
  EXPECT_EQ(rec.sent[2].box, 1);
  EXPECT_EQ(rec.sent[2].x + rec.sent[2].width, 640u);  // clipped to the frame
  EXPECT_EQ(rec.outcomes["1:sent"], 3u);
  EXPECT_EQ(rec.outcomes.size(), 1u);
}

TEST(SnapshotterTest, WhatCannotBeEncodedQueuedOrSentIsCounted) {
  if (!video::JpegAvailable()) GTEST_SKIP() << "built without libturbojpeg";
  Record rec;
  std::mutex gate;
  std::atomic<bool> in_sink{false};
  gate.lock();  // the sink blocks until the test opens it: the queue fills behind it
  Snapshotter s(
      2,
      [&](transport::Snapshot) {
        in_sink = true;
        std::lock_guard g(gate);
        return !rec.refuse.load();
      },
      [&](size_t stream, const char* outcome, uint64_t n) {
        std::lock_guard lock(rec.mu);
        rec.outcomes[std::to_string(stream) + ":" + outcome] += n;
      });
  auto job = [](uint64_t seq) {
    Snapshotter::Job j;
    j.frame = Gradient("cam", seq, 64, 48);
    return j;
  };
  ASSERT_TRUE(s.Offer(job(0)));
  while (!in_sink) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the thread holds job 0
  EXPECT_TRUE(s.Offer(job(1)));
  EXPECT_TRUE(s.Offer(job(2)));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.Offer(job(10 + i))) << i;  // the queue holds 2: refused, counted
  rec.refuse = true;  // and the link refuses the pictures of the three it took
  gate.unlock();
  ASSERT_TRUE(s.WaitIdle(10000));
  Snapshotter::Job bad = job(99);
  bad.frame.bgr.resize(10);  // a frame without its pixels
  ASSERT_TRUE(s.Offer(std::move(bad)));
  ASSERT_TRUE(s.WaitIdle(10000));
  s.Close();
  EXPECT_FALSE(s.Offer(job(100)));  // closed
  std::lock_guard lock(rec.mu);
  const std::map<std::string, uint64_t> want = {{"0:queue_full", 6}, {"0:refused", 3}, {"0:encode_error", 1}};
  EXPECT_EQ(rec.outcomes, want);
}

}  // namespace
}  // namespace vigil::pipeline
