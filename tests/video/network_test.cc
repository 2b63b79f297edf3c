// Network sources on loopback: refused and silent servers (timeouts, backoff, giving up, prompt stop) and
// a live RTSP stream whose server goes away and comes back (test_media.h explains the server).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "test_media.h"
#include "vigil/video/stream_reader.h"

namespace vigil::video {
namespace {

using testing::Ffmpeg;
using testing::TempDir;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Polls `done` every 10 ms for up to `limit`; true when it became true.
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

SourceOptions RtspOptions(const std::string& url) {
  SourceOptions o;
  o.uri = url;
  o.stream_id = "cam";
  o.connect_timeout = 2s;
  o.read_timeout = 2s;
  o.reconnect.initial_delay = 50ms;
  o.reconnect.max_delay = 200ms;
  return o;
}

TEST(NetworkSourceTest, ClosedPortGivesUpAfterMaxAttempts) {
  const std::string url = "rtsp://127.0.0.1:" + std::to_string(testing::FreeTcpPort()) + "/x";
  SourceOptions options = RtspOptions(url);
  options.reconnect.max_attempts = 3;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(options);
  ASSERT_TRUE(source.ok()) << source.status() << " (a network source connects in Next)";
  EXPECT_TRUE((*source)->live());
  StatusOr<std::optional<Frame>> next = (*source)->Next();
  ASSERT_FALSE(next.ok());
  EXPECT_TRUE(absl::IsUnavailable(next.status())) << next.status();
  EXPECT_NE(next.status().message().find("3 failed attempts"), absl::string_view::npos) << next.status();
  EXPECT_NE(next.status().message().find(url), absl::string_view::npos) << next.status();
  const StreamStats stats = (*source)->Stats();
  EXPECT_EQ(stats.connect_failures, 3u);
  EXPECT_EQ(stats.reconnect_attempts, 2u);
  EXPECT_EQ(stats.reconnects, 0u);
  EXPECT_EQ(stats.state, StreamState::kFailed);
  // connecting -> reconnecting -> connecting -> reconnecting -> connecting -> failed.
  EXPECT_EQ(stats.state_changes, 6u);
}

TEST(NetworkSourceTest, UnreachableRtspRetriesUntilStopped) {
  const std::string url = "rtsp://127.0.0.1:" + std::to_string(testing::FreeTcpPort()) + "/x";
  StatusOr<std::unique_ptr<Source>> source = OpenSource(RtspOptions(url));
  ASSERT_TRUE(source.ok()) << source.status();
  StreamReader reader(*std::move(source));
  ASSERT_TRUE(WaitUntil([&] { return reader.Stats().connect_failures >= 4; }, 10s))
      << "connect_failures " << reader.Stats().connect_failures;
  const StreamStats stats = reader.Stats();
  EXPECT_GE(stats.reconnect_attempts, 3u);
  EXPECT_NE(stats.last_error.find("Connection refused"), std::string::npos) << stats.last_error;
  const auto start = Clock::now();
  reader.Stop();
  EXPECT_LT(SecondsSince(start), 2.0) << "Stop() must not wait for a backoff or a connect";
  Frame frame;
  EXPECT_EQ(reader.Pop(&frame, 1s), StreamReader::PopResult::kEnd);
  EXPECT_TRUE(reader.final_status().ok()) << reader.final_status();
  EXPECT_EQ(reader.Stats().state, StreamState::kStopped);
}

TEST(NetworkSourceTest, SilentServerTimesOut) {
  // A listening socket that accepts (in the kernel's backlog) but never answers the RTSP request.
  const int fd = testing::ListenTcp(0);
  ASSERT_GE(fd, 0);
  SourceOptions options = RtspOptions("rtsp://127.0.0.1:" + std::to_string(testing::LocalPort(fd)) + "/x");
  options.connect_timeout = 300ms;
  options.reconnect.max_attempts = 1;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(options);
  ASSERT_TRUE(source.ok()) << source.status();
  const auto start = Clock::now();
  StatusOr<std::optional<Frame>> next = (*source)->Next();
  const double elapsed = SecondsSince(start);
  close(fd);
  ASSERT_FALSE(next.ok());
  EXPECT_NE(next.status().message().find("timed out after 300 ms"), absl::string_view::npos) << next.status();
  EXPECT_GE(elapsed, 0.29);
}

TEST(NetworkSourceTest, LiveRtspReconnectsAndResumes) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string clip = dir / "clip.mp4";
  ASSERT_TRUE(Ffmpeg("-f lavfi -i testsrc=s=160x120:r=25:d=2 -c:v libx264 -preset ultrafast -tune zerolatency "
                     "-g 5 -pix_fmt yuv420p " + clip));
  testing::RtpFeed feed(clip, dir / "feed.sdp");
  ASSERT_TRUE(feed.ok()) << "ffmpeg -f rtp did not start";
  const int port = testing::FreeTcpPort();
  auto relay = std::make_unique<testing::RtspRelay>(&feed, port);
  ASSERT_TRUE(relay->Start());

  StatusOr<std::unique_ptr<Source>> source = OpenSource(RtspOptions(relay->url()));
  ASSERT_TRUE(source.ok()) << source.status();
  StreamReader reader(*std::move(source), {.queue_capacity = 8});
  std::vector<Frame> frames;
  auto read_frames = [&](size_t n) {
    const auto end = Clock::now() + 8s;
    Frame frame;
    for (size_t got = 0; got < n && Clock::now() < end;) {
      if (reader.Pop(&frame, 100ms) != StreamReader::PopResult::kFrame) continue;
      EXPECT_EQ(frame.width, 160);
      EXPECT_EQ(frame.height, 120);
      EXPECT_EQ(frame.stream_id, "cam");
      frames.push_back(std::move(frame));
      ++got;
    }
  };
  read_frames(10);
  ASSERT_EQ(frames.size(), 10u) << "no frames from the live stream; stats: " << reader.Stats().last_error;

  relay->Stop();  // the server goes away
  ASSERT_TRUE(WaitUntil([&] { return reader.Stats().disconnects >= 1; }, 5s));
  std::this_thread::sleep_for(500ms);  // reconnect attempts are refused meanwhile
  const size_t before = frames.size();
  Frame frame;
  while (reader.Pop(&frame, 0ms) == StreamReader::PopResult::kFrame) frames.push_back(std::move(frame));
  relay = std::make_unique<testing::RtspRelay>(&feed, port);
  ASSERT_TRUE(relay->Start());  // and comes back on the same port
  read_frames(10);
  ASSERT_GE(frames.size(), before + 10) << "no frames after the server came back: " << reader.Stats().last_error;

  const StreamStats stats = reader.Stats();
  EXPECT_GE(stats.disconnects, 1u);
  EXPECT_GE(stats.reconnects, 1u);
  EXPECT_GE(stats.connect_failures, 1u);
  EXPECT_EQ(stats.state, StreamState::kStreaming);
  for (size_t i = 1; i < frames.size(); ++i) {
    EXPECT_GT(frames[i].seq, frames[i - 1].seq) << "seq goes on across the reconnect, in the same run";
    EXPECT_GT(frames[i].pts_ns, frames[i - 1].pts_ns);
  }
  reader.Stop();
}

}  // namespace
}  // namespace vigil::video
