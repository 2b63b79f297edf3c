// StreamReader: the queue policies (file blocks, live drops the oldest) and prompt stopping.
#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "test_media.h"
#include "vigil/video/stream_reader.h"

namespace vigil::video {
namespace {

using testing::Ffmpeg;
using testing::TempDir;
using namespace std::chrono_literals;

std::unique_ptr<Source> TenFrameClip(const TempDir& dir) {
  const std::string path = dir / "ten.mp4";
  if (!Ffmpeg("-f lavfi -i testsrc=s=64x48:r=10 -frames:v 10 -c:v libx264 -pix_fmt yuv420p " + path)) return nullptr;
  SourceOptions options;
  options.uri = path;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(options);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

TEST(StreamReaderTest, FileSourceBlocksAndLosesNothing) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  auto source = TenFrameClip(dir);
  ASSERT_TRUE(source);
  StreamReader reader(std::move(source), {.queue_capacity = 2});
  std::this_thread::sleep_for(200ms);  // a slow consumer: the producer waits on the full queue
  EXPECT_LE(reader.Stats().queue_depth, 2u);
  uint64_t expected_seq = 0;
  Frame frame;
  StreamReader::PopResult r;
  while ((r = reader.Pop(&frame, 10s)) == StreamReader::PopResult::kFrame) EXPECT_EQ(frame.seq, expected_seq++);
  EXPECT_EQ(r, StreamReader::PopResult::kEnd);
  EXPECT_EQ(expected_seq, 10u);
  EXPECT_TRUE(reader.final_status().ok()) << reader.final_status();
  const StreamStats stats = reader.Stats();
  EXPECT_EQ(stats.dropped_queue_full, 0u);
  EXPECT_EQ(stats.state, StreamState::kEnded);
}

TEST(StreamReaderTest, ThreadStartHookRunsOnTheReadingThreadFirst) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  auto source = TenFrameClip(dir);
  ASSERT_TRUE(source);
  const Source* src = source.get();
  std::atomic<int> calls{0};
  std::atomic<uint64_t> delivered_at_start{99};
  std::thread::id hook_thread;
  StreamReader reader(std::move(source), {.on_thread_start = [&] {
                                            hook_thread = std::this_thread::get_id();
                                            delivered_at_start = src->Stats().frames_delivered;
                                            ++calls;
                                          }});
  Frame frame;
  ASSERT_EQ(reader.Pop(&frame, 10s), StreamReader::PopResult::kFrame);
  reader.Stop();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(delivered_at_start.load(), 0u) << "the hook runs before the Source is read";
  EXPECT_NE(hook_thread, std::this_thread::get_id());
}

TEST(StreamReaderTest, DropOldestKeepsTheLatestFrames) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  auto source = TenFrameClip(dir);
  ASSERT_TRUE(source);
  StreamReader reader(std::move(source), {.queue_capacity = 3, .policy = QueuePolicy::kDropOldest});
  for (int i = 0; i < 500 && reader.Stats().state != StreamState::kEnded; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(reader.Stats().state, StreamState::kEnded);
  Frame frame;
  for (uint64_t seq : {7u, 8u, 9u}) {
    ASSERT_EQ(reader.Pop(&frame, 1s), StreamReader::PopResult::kFrame);
    EXPECT_EQ(frame.seq, seq);
  }
  EXPECT_EQ(reader.Pop(&frame, 1s), StreamReader::PopResult::kEnd);
  EXPECT_EQ(reader.Stats().dropped_queue_full, 7u);
}

TEST(StreamReaderTest, StopReleasesABlockedProducer) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  auto source = TenFrameClip(dir);
  ASSERT_TRUE(source);
  StreamReader reader(std::move(source), {.queue_capacity = 1});
  Frame frame;
  ASSERT_EQ(reader.Pop(&frame, 10s), StreamReader::PopResult::kFrame);
  reader.Stop();  // the producer is waiting for room
  EXPECT_TRUE(reader.final_status().ok()) << reader.final_status();
  int popped = 0;
  while (reader.Pop(&frame, 1s) == StreamReader::PopResult::kFrame) ++popped;
  EXPECT_LE(popped, 1) << "at most the one frame that was queued";
  EXPECT_EQ(reader.Stats().state, StreamState::kStopped);
}

}  // namespace
}  // namespace vigil::video
