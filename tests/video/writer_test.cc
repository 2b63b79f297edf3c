// VideoWriter: pictures with known colours are encoded, then decoded again (the ffmpeg CLI's ffprobe for
// the stream header, vigil's own Source for the pixels) and compared.
#include "vigil/video/writer.h"

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_media.h"
#include "vigil/video/source.h"

namespace vigil::video {
namespace {

using testing::TempDir;
using Bgr = std::array<uint8_t, 3>;

// A width × height BGR picture in four solid quadrants: TL, TR, BL, BR.
std::vector<uint8_t> Quadrants(int width, int height, const std::array<Bgr, 4>& colours) {
  std::vector<uint8_t> bgr(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const Bgr& c = colours[(y < height / 2 ? 0 : 2) + (x < width / 2 ? 0 : 1)];
      std::copy(c.begin(), c.end(), bgr.begin() + (size_t(y) * width + x) * 3);
    }
  }
  return bgr;
}

constexpr std::array<Bgr, 4> kColours = {{{0, 0, 255}, {0, 255, 0}, {255, 0, 0}, {255, 255, 255}}};

// `ffprobe` on the first video stream: "codec,width,height,frames" (frames counted by decoding).
std::string Probe(const std::string& path) {
  const std::string cmd = "ffprobe -v error -count_frames -select_streams v:0 -show_entries "
                          "stream=codec_name,width,height,nb_read_frames -of csv=p=0 '" + path + "'";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ',')) out.pop_back();
  return out;
}

// Every frame of the file at `path`, decoded by vigil's Source; no decode error (such as a frame count in
// the header that disagrees with the frames in the file) may occur.
std::vector<Frame> Decode(const std::string& path) {
  SourceOptions o;
  o.uri = path;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(o);
  EXPECT_TRUE(source.ok()) << source.status();
  std::vector<Frame> frames;
  while (source.ok()) {
    StatusOr<std::optional<Frame>> f = (*source)->Next();
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok() || !f->has_value()) break;
    frames.push_back(std::move(**f));
  }
  if (source.ok()) {
    EXPECT_EQ((*source)->Stats().decode_errors, 0u) << (*source)->Stats().last_error;
  }
  return frames;
}

// The centre pixel of each quadrant is within `tolerance` of the colour written (lossy codecs).
void ExpectColours(const Frame& f, int tolerance) {
  for (int q = 0; q < 4; ++q) {
    const int x = (q % 2 == 0 ? 1 : 3) * f.width / 4, y = (q < 2 ? 1 : 3) * f.height / 4;
    const uint8_t* p = f.bgr.data() + size_t(y) * f.stride + size_t(x) * 3;
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(p[c], kColours[q][c], tolerance) << "quadrant " << q << " channel " << c;
  }
}

struct Case {
  const char* file;
  const char* codec;  // requested; "" = the default
  int width, height;
  const char* probed_codec;
};

class WriterRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(WriterRoundTrip, DecodesToTheFramesWritten) {
  VIGIL_REQUIRE_FFMPEG();
  const Case& c = GetParam();
  TempDir dir;
  WriterOptions o;
  o.path = dir / c.file;
  o.width = c.width;
  o.height = c.height;
  o.fps = 10;
  o.codec = c.codec;
  auto writer = VideoWriter::Open(o);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->codec_name(), c.probed_codec == std::string("h264") ? "libx264" : c.probed_codec);
  const std::vector<uint8_t> picture = Quadrants(c.width, c.height, kColours);
  constexpr int kFrames = 25;
  for (int i = 0; i < kFrames; ++i) {
    ASSERT_TRUE((*writer)->Write(picture.data(), c.width * 3, int64_t(i) * 100'000'000).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->frames(), uint64_t(kFrames));
  EXPECT_EQ((*writer)->retimed(), 0u);
  EXPECT_EQ(Probe(o.path), StrCat(c.probed_codec, ",", c.width, ",", c.height, ",", kFrames));
  const std::vector<Frame> frames = Decode(o.path);
  ASSERT_EQ(frames.size(), size_t(kFrames));
  for (size_t i = 0; i < frames.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(frames[i].width, c.width);
    EXPECT_EQ(frames[i].height, c.height);
    EXPECT_EQ(frames[i].pts_ns, int64_t(i) * 100'000'000);
    ExpectColours(frames[i], 12);
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, WriterRoundTrip,
                         ::testing::Values(Case{"a.mp4", "", 160, 120, "h264"},
                                           Case{"odd.mkv", "libx264", 161, 121, "h264"},
                                           Case{"b.avi", "mpeg4", 160, 120, "mpeg4"}),
                         [](const auto& test) { return std::string(test.param.codec[0] ? test.param.codec : "default") +
                                                       "_" + std::to_string(test.param.width); });

TEST(VideoWriter, NonIncreasingTimestampsAreMovedAndCounted) {
  TempDir dir;  // Matroska: 1 ms ticks
  auto writer = VideoWriter::Open({dir / "t.mkv", 64, 48, 25, ""});
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::vector<uint8_t> picture = Quadrants(64, 48, kColours);
  for (int64_t pts : {0, 40'000'000, 40'000'000, 10'000'000, 120'000'000}) {
    ASSERT_TRUE((*writer)->Write(picture.data(), 64 * 3, pts).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->retimed(), 2u);
  const std::vector<Frame> frames = Decode(dir / "t.mkv");
  ASSERT_EQ(frames.size(), 5u);
  const int64_t want_ms[] = {0, 40, 41, 42, 120};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(frames[i].pts_ns, want_ms[i] * 1'000'000) << i;
}

TEST(VideoWriter, ErrorsNameTheFile) {
  TempDir dir;
  auto bad_codec = VideoWriter::Open({dir / "x.mp4", 64, 48, 25, "no-such-encoder"});
  ASSERT_FALSE(bad_codec.ok());
  EXPECT_EQ(bad_codec.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(bad_codec.status().message().find("x.mp4"), std::string::npos) << bad_codec.status();
  auto bad_container = VideoWriter::Open({dir / "x.notacontainer", 64, 48, 25, ""});
  ASSERT_FALSE(bad_container.ok());
  EXPECT_EQ(bad_container.status().code(), absl::StatusCode::kInvalidArgument);
  auto no_dir = VideoWriter::Open({dir / "missing/x.mp4", 64, 48, 25, ""});
  ASSERT_FALSE(no_dir.ok());
  EXPECT_NE(no_dir.status().message().find("missing/x.mp4"), std::string::npos) << no_dir.status();
  auto bad_size = VideoWriter::Open({dir / "x.mp4", 0, 48, 25, ""});
  EXPECT_EQ(bad_size.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vigil::video
