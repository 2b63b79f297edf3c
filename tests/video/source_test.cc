// Sources on files and images: real-file handling, timing options, errors. Media are generated with the
// ffmpeg CLI into a temporary folder (test_media.h); vtest.avi comes from Debian's opencv-doc.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_media.h"
#include "vigil/video/source.h"

namespace vigil::video {
namespace {

using testing::Ffmpeg;
using testing::QuadrantFilter;
using testing::ReadAll;
using testing::TempDir;
using Bgr = std::array<int, 3>;

constexpr Bgr kRed{0, 0, 255}, kLime{0, 255, 0}, kBlue{255, 0, 0}, kWhite{255, 255, 255};
constexpr char kVtest[] = "/usr/share/doc/opencv-doc/examples/data/vtest.avi";

Bgr PixelAt(const Frame& f, int x, int y) {
  const uint8_t* p = f.bgr.data() + size_t(y) * f.stride + size_t(x) * 3;
  return {p[0], p[1], p[2]};
}

// A resumed source delivers frames first, first + 1, … of the full run: same seq, pts and pixels.
void ExpectSameFramesFrom(const std::vector<Frame>& resumed, const std::vector<Frame>& full, size_t first) {
  ASSERT_LE(first + resumed.size(), full.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].seq, first + i);
    EXPECT_EQ(resumed[i].pts_ns, full[first + i].pts_ns);
    EXPECT_EQ(resumed[i].bgr, full[first + i].bgr);
  }
}

// The centres of the four quadrants, top-left, top-right, bottom-left, bottom-right, within `tolerance`.
void ExpectQuadrants(const Frame& f, const std::array<Bgr, 4>& expected, int tolerance) {
  const std::array<std::pair<int, int>, 4> centres = {
      {{f.width / 4, f.height / 4}, {3 * f.width / 4, f.height / 4}, {f.width / 4, 3 * f.height / 4},
       {3 * f.width / 4, 3 * f.height / 4}}};
  for (int q = 0; q < 4; ++q) {
    const Bgr got = PixelAt(f, centres[q].first, centres[q].second);
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(got[c], expected[q][c], tolerance) << "quadrant " << q << " channel " << c;
    }
  }
}

std::unique_ptr<Source> MustOpen(SourceOptions options) {
  StatusOr<std::unique_ptr<Source>> source = OpenSource(std::move(options));
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

SourceOptions Options(const std::string& uri) {
  SourceOptions o;
  o.uri = uri;
  return o;
}


// 30 fps testsrc clip of `seconds`, H.264 with a keyframe every 10 frames.
std::string TestClip(const TempDir& dir, const std::string& name, double seconds, const std::string& extra = "") {
  const std::string path = dir / name;
  Ffmpeg("-f lavfi -i testsrc=s=160x120:r=30:d=" + std::to_string(seconds) +
         " -c:v libx264 -preset ultrafast -g 10 -pix_fmt yuv420p " + extra + " " + path);
  return path;
}

// The index (moov) first, as cameras and web exports write MP4, so that a cut keeps it.
std::string Faststart(const std::string& container) { return container == "mp4" ? "-movflags +faststart" : ""; }

TEST(BackoffTest, FullJitterBoundsDoubleUpToTheCap) {
  ReconnectPolicy p;  // 0.5 s initial, 30 s max
  const double expected_cap_s[] = {0.5, 1, 2, 4, 8, 16, 30, 30, 30};
  for (int n = 0; n < 9; ++n) {
    EXPECT_NEAR(std::chrono::duration<double>(BackoffDelay(p, n, 1.0)).count(), expected_cap_s[n], 1e-9) << n;
    EXPECT_EQ(BackoffDelay(p, n, 0.0).count(), 0) << n;
  }
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  const double u = std::uniform_real_distribution<double>(0, 1)(rng);
  EXPECT_NEAR(std::chrono::duration<double>(BackoffDelay(p, 3, u)).count(), 4.0 * u, 1e-9);
  EXPECT_NEAR(std::chrono::duration<double>(BackoffDelay(p, 1000, u)).count(), 30.0 * u, 1e-9);
}

TEST(SourceUriTest, ClassifiesAndRedacts) {
  EXPECT_EQ(ClassifyUri("rtsp://cam/x"), SourceKind::kNetwork);
  EXPECT_EQ(ClassifyUri("https://host/live.m3u8"), SourceKind::kNetwork);
  EXPECT_EQ(ClassifyUri("clip.mp4"), SourceKind::kFile);
  EXPECT_EQ(ClassifyUri("file:///data/clip.mp4"), SourceKind::kFile);
  EXPECT_EQ(ClassifyUri("/data/img/*.jpg"), SourceKind::kImages);
  EXPECT_EQ(ClassifyUri("dog.JPG"), SourceKind::kImages);
  EXPECT_EQ(ClassifyUri(std::filesystem::temp_directory_path().string()), SourceKind::kImages);
  EXPECT_EQ(RedactUri("rtsp://admin:s3cret@10.0.0.5:554/stream1"), "rtsp://admin:***@10.0.0.5:554/stream1");
  EXPECT_EQ(RedactUri("rtsp://10.0.0.5/a@b"), "rtsp://10.0.0.5/a@b");
  EXPECT_EQ(RedactUri("/videos/a:b@c.mp4"), "/videos/a:b@c.mp4");
}

TEST(FileSourceTest, VtestFirst200Frames) {
  if (!std::filesystem::exists(kVtest)) GTEST_SKIP() << kVtest << " is missing (Debian package opencv-doc)";
  auto source = MustOpen(Options(kVtest));
  ASSERT_TRUE(source);
  EXPECT_EQ(source->probed().width, 768);  // known before the first frame (placement plans with it)
  EXPECT_EQ(source->probed().height, 576);
  EXPECT_DOUBLE_EQ(source->probed().fps, 10.0);
  EXPECT_EQ(source->declared_frames(), 795u) << "ffprobe: nb_frames=795";
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Frame> frames = ReadAll(*source, 200);
  const int64_t elapsed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(frames.size(), 200u);
  // Decode time is measured per picture: positive, and all of it fits into the time reading took.
  int64_t decode_ns = 0;
  for (const Frame& f : frames) {
    ASSERT_GT(f.decode_ns, 0) << "seq " << f.seq;
    decode_ns += f.decode_ns;
  }
  EXPECT_LE(decode_ns, elapsed_ns);
  for (size_t i = 0; i < frames.size(); ++i) {
    const Frame& f = frames[i];
    ASSERT_EQ(f.width, 768);
    ASSERT_EQ(f.height, 576);
    ASSERT_EQ(f.stride, 768 * 3);
    ASSERT_EQ(f.bgr.size(), 576u * 768 * 3);
    ASSERT_EQ(f.seq, i);
    ASSERT_EQ(f.stream_id, kVtest);
    ASSERT_EQ(f.pts_ns, int64_t(i) * 100'000'000) << "vtest.avi is 10 fps, time base 1/10";
    if (i > 0) {
      ASSERT_GE(f.source_steady_ns, frames[i - 1].source_steady_ns);
    }
  }
  const StreamStats stats = source->Stats();
  EXPECT_EQ(stats.frames_delivered, 200u);
  EXPECT_EQ(stats.decode_errors, 0u);
  EXPECT_EQ(stats.state, StreamState::kStreaming);
}

TEST(FileSourceTest, VtestPixelsMatchFfmpegCli) {
  VIGIL_REQUIRE_FFMPEG();
  if (!std::filesystem::exists(kVtest)) GTEST_SKIP() << kVtest << " is missing (Debian package opencv-doc)";
  TempDir dir;
  // Reference: frame 150 decoded and converted by the ffmpeg CLI (yuv420p -> bgr24, no scaling).
  ASSERT_TRUE(Ffmpeg(std::string("-i ") + kVtest + " -vf 'select=eq(n\\,150)' -frames:v 1 -f rawvideo -pix_fmt bgr24 " +
                     (dir / "ref.bgr")));
  std::ifstream in(dir / "ref.bgr", std::ios::binary);
  const std::vector<uint8_t> ref((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(ref.size(), 768u * 576 * 3);
  auto source = MustOpen(Options(kVtest));
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source, 151);
  ASSERT_EQ(frames.size(), 151u);
  // Chroma upsampling may differ between swscale paths by a level or two; the mean must be tiny.
  double sum = 0;
  for (size_t i = 0; i < ref.size(); ++i) sum += std::abs(int(frames[150].bgr[i]) - int(ref[i]));
  EXPECT_LT(sum / double(ref.size()), 1.5);
}

struct RotationCase {
  int tag;                     // -metadata:s:v rotate=<tag> as ffmpeg 5.1 writes it into the mp4 display matrix
  int clockwise;               // what FFmpeg's CLI autorotate shows (checked by hand with -f rawvideo)
  std::array<Bgr, 4> quadrants;  // of the upright picture: TL, TR, BL, BR
};

class RotationTest : public ::testing::TestWithParam<RotationCase> {};

TEST_P(RotationTest, ComesOutUpright) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string coded = dir / "coded.mp4", rotated = dir / "rotated.mp4";
  ASSERT_TRUE(Ffmpeg("-f lavfi -i " + QuadrantFilter(64, 32) + " -frames:v 3 -c:v libx264 -pix_fmt yuv420p " + coded));
  ASSERT_TRUE(Ffmpeg("-i " + coded + " -c copy -metadata:s:v rotate=" + std::to_string(GetParam().tag) + " " + rotated));
  auto source = MustOpen(Options(rotated));
  ASSERT_TRUE(source);
  const bool portrait = GetParam().clockwise % 180 != 0;
  EXPECT_EQ(source->probed().width, portrait ? 32 : 64);
  EXPECT_EQ(source->probed().height, portrait ? 64 : 32);
  const std::vector<Frame> frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 3u);
  const Frame& f = frames[0];
  EXPECT_EQ(f.rotation, GetParam().clockwise);
  EXPECT_EQ(f.width, portrait ? 32 : 64);
  EXPECT_EQ(f.height, portrait ? 64 : 32);
  ExpectQuadrants(f, GetParam().quadrants, 12);
}

// Coded picture: TL red, TR lime, BL blue, BR white.
INSTANTIATE_TEST_SUITE_P(
    DisplayMatrix, RotationTest,
    ::testing::Values(RotationCase{270, 90, {kBlue, kRed, kWhite, kLime}},     // phone portrait: turn clockwise
                      RotationCase{90, 270, {kLime, kWhite, kRed, kBlue}},     // turn counterclockwise
                      RotationCase{180, 180, {kWhite, kBlue, kLime, kRed}},
                      RotationCase{0, 0, {kRed, kLime, kBlue, kWhite}}));

struct FormatCase {
  std::string codec, pix_fmt, container;
  int width, height;
};

class PixelFormatTest : public ::testing::TestWithParam<FormatCase> {};

TEST_P(PixelFormatTest, ConvertsToBgrAtTheCodedSize) {
  VIGIL_REQUIRE_FFMPEG();
  const FormatCase& c = GetParam();
  TempDir dir;
  const std::string path = dir / ("clip." + c.container);
  ASSERT_TRUE(Ffmpeg("-f lavfi -i " + QuadrantFilter(c.width, c.height) + " -frames:v 4 -c:v " + c.codec +
                     " -pix_fmt " + c.pix_fmt + " " + path));
  auto source = MustOpen(Options(path));
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 4u);
  for (const Frame& f : frames) {
    EXPECT_EQ(f.width, c.width);
    EXPECT_EQ(f.height, c.height);
    EXPECT_EQ(f.stride, c.width * 3);
    EXPECT_EQ(f.bgr.size(), size_t(c.width) * c.height * 3);
  }
  // Primaries survive YUV (limited or full range, 8 or 10 bit) within a few levels.
  ExpectQuadrants(frames[0], {kRed, kLime, kBlue, kWhite}, 8);
  EXPECT_EQ(source->Stats().decode_errors, 0u);
}

INSTANTIATE_TEST_SUITE_P(Formats, PixelFormatTest,
                         ::testing::Values(FormatCase{"libx264", "yuv420p", "mp4", 320, 240},
                                           FormatCase{"libx264", "yuv444p", "mp4", 321, 243},
                                           FormatCase{"mjpeg", "yuvj422p", "avi", 321, 243},
                                           FormatCase{"ffv1", "yuv420p10le", "mkv", 321, 243},
                                           FormatCase{"rawvideo", "nv12", "nut", 321, 243}),
                         [](const auto& test) { return test.param.pix_fmt + "_" + std::to_string(test.param.width); });

TEST(FileSourceTest, NonSquarePixelsAreResampled) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = dir / "anamorphic.mp4";
  // 160x120 coded with pixels twice as wide as high: displayed 320x120.
  ASSERT_TRUE(Ffmpeg("-f lavfi -i " + QuadrantFilter(160, 120) + ",setsar=2/1 -frames:v 2 -c:v libx264 -pix_fmt yuv420p " + path));
  SourceOptions options = Options(path);
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  EXPECT_EQ(source->probed().width, 320);
  EXPECT_EQ(source->probed().height, 120);
  std::vector<Frame> frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].width, 320);
  EXPECT_EQ(frames[0].height, 120);
  ExpectQuadrants(frames[0], {kRed, kLime, kBlue, kWhite}, 12);

  options.apply_sample_aspect = false;
  source = MustOpen(options);
  ASSERT_TRUE(source);
  frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].width, 160);
}

// FFmpeg's own count of the frames in `path` (ffprobe -count_frames), the reference for damaged files.
int FfprobeFrameCount(const TempDir& dir, const std::string& path) {
  const std::string out = dir / "count.txt";
  const std::string cmd = "ffprobe -v quiet -select_streams v:0 -count_frames -show_entries stream=nb_read_frames "
                          "-of default=nw=1:nk=1 " + path + " > " + out;
  if (std::system(cmd.c_str()) != 0) return -1;
  std::ifstream in(out);
  int n = -1;
  in >> n;
  return n;
}

class TruncatedFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TruncatedFileTest, EndsCleanlyWithTheErrorCounted) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string full = TestClip(dir, "full." + GetParam(), 3, Faststart(GetParam()));  // 90 frames
  const std::string cut = dir / ("cut." + GetParam());
  std::filesystem::copy_file(full, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(full) / 2);
  const int reference = FfprobeFrameCount(dir, cut);
  ASSERT_GT(reference, 10);

  auto source = MustOpen(Options(cut));
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source);  // ends with nullopt, not an error
  EXPECT_NEAR(double(frames.size()), double(reference), 1.0);
  EXPECT_LT(frames.size(), 90u);
  for (size_t i = 0; i < frames.size(); ++i) EXPECT_EQ(frames[i].seq, i);
  const StreamStats stats = source->Stats();
  EXPECT_EQ(stats.state, StreamState::kEnded);
  EXPECT_GE(stats.decode_errors, 1u);
  EXPECT_NE(stats.last_error.find("ends early"), std::string::npos) << stats.last_error;
}

// Containers whose header declares the length (frame count or duration), so that a cut is noticed.
INSTANTIATE_TEST_SUITE_P(Containers, TruncatedFileTest, ::testing::Values("mp4", "mkv", "avi", "flv"));

TEST(FileSourceTest, TruncatedMp4WithoutItsIndexIsAClearError) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string full = TestClip(dir, "full.mp4", 1);  // moov (the index) at the end
  const std::string cut = dir / "cut.mp4";
  std::filesystem::copy_file(full, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(full) / 2);
  StatusOr<std::unique_ptr<Source>> source = OpenSource(Options(cut));
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(absl::IsDataLoss(source.status())) << source.status();
  EXPECT_NE(source.status().message().find(cut), absl::string_view::npos) << source.status();
}

class CorruptFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CorruptFileTest, FramesAfterTheDamageStillDecode) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = TestClip(dir, "clip." + GetParam(), 3, Faststart(GetParam()));  // 90 frames, 3 s
  const auto size = std::filesystem::file_size(path);
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  {
    // 2 KB of random bytes at 40% of the file, inside the coded pictures.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size * 2 / 5));
    for (int i = 0; i < 2048; ++i) f.put(char(rng() & 0xff));
  }
  auto source = MustOpen(Options(path));
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source);
  const StreamStats stats = source->Stats();
  EXPECT_GE(stats.decode_errors, 1u) << "2 KB of noise in the pictures must be noticed";
  EXPECT_EQ(stats.state, StreamState::kEnded);
  EXPECT_EQ(stats.last_error.find("ends early"), std::string::npos) << "damaged, not truncated: " << stats.last_error;
  ASSERT_GE(frames.size(), 60u);
  EXPECT_GE(frames.back().pts_ns, 2'800'000'000) << "the frames after the damage decode up to the end (3 s)";
  for (size_t i = 1; i < frames.size(); ++i) EXPECT_GT(frames[i].pts_ns, frames[i - 1].pts_ns);
}

INSTANTIATE_TEST_SUITE_P(Containers, CorruptFileTest, ::testing::Values("ts", "mp4"));

TEST(FileSourceTest, MissingFileNamesThePath) {
  const std::string path = "/nonexistent/vigil/clip-404.mp4";
  StatusOr<std::unique_ptr<Source>> source = OpenSource(Options(path));
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(absl::IsNotFound(source.status())) << source.status();
  EXPECT_NE(source.status().message().find(path), absl::string_view::npos) << source.status();
}

TEST(FileSourceTest, AudioOnlyFileHasNoVideoStream) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = dir / "tone.wav";
  ASSERT_TRUE(Ffmpeg("-f lavfi -i sine=d=0.2 " + path));
  StatusOr<std::unique_ptr<Source>> source = OpenSource(Options(path));
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(source.status())) << source.status();
  EXPECT_NE(source.status().message().find("no video stream"), absl::string_view::npos) << source.status();
}

TEST(FileSourceTest, VariableFrameRateKeepsTimestampsAndJumpsAreClosed) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  // VFR: frame n at n^2 * 10 ms (Matroska's 1 ms time base; -r 1000 only sets the encoder's time base).
  const std::string vfr = dir / "vfr.mkv";
  ASSERT_TRUE(Ffmpeg("-f lavfi -i testsrc=s=64x48:r=10 -frames:v 8 -vf settb=1/1000,setpts=N*N*10 -fps_mode passthrough "
                     "-r 1000 -c:v libx264 -pix_fmt yuv420p -bf 0 " + vfr));
  auto source = MustOpen(Options(vfr));
  ASSERT_TRUE(source);
  std::vector<Frame> frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 8u);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(frames[n].pts_ns, int64_t(n) * n * 10'000'000) << n;
  EXPECT_EQ(source->Stats().timestamp_fixups, 0u);

  // A 100 s jump after frame 4 of a 10 fps clip: beyond max_pts_jump_ns (10 s), so re-timed to continue at 100 ms.
  const std::string jump = dir / "jump.mkv";
  ASSERT_TRUE(Ffmpeg("-f lavfi -i testsrc=s=64x48:r=10 -frames:v 10 -vf \"setpts=(N+gte(N\\,5)*1000)/(10*TB)\" "
                     "-fps_mode passthrough -c:v libx264 -pix_fmt yuv420p -bf 0 " + jump));
  source = MustOpen(Options(jump));
  ASSERT_TRUE(source);
  frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 10u);
  for (int n = 0; n < 10; ++n) EXPECT_EQ(frames[n].pts_ns, int64_t(n) * 100'000'000) << n;
  EXPECT_EQ(source->Stats().timestamp_fixups, 1u);
}

TEST(FileSourceTest, TargetFpsHalvesByTimestamps) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = TestClip(dir, "clip.mp4", 2);  // 60 frames at 30 fps
  SourceOptions options = Options(path);
  options.target_fps = 15;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 30u);
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].seq, i);
    EXPECT_NEAR(double(frames[i].pts_ns), double(i) * 1e9 / 15, 1e6) << i;  // every second frame
  }
  const StreamStats stats = source->Stats();
  EXPECT_EQ(stats.frames_decoded, 60u);
  EXPECT_EQ(stats.skipped_target_fps, 30u);
}

TEST(FileSourceTest, RealtimePacesAtTheNativeRate) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = TestClip(dir, "clip.mp4", 1);  // 30 frames, the last at 0.967 s
  SourceOptions options = Options(path);
  options.realtime = true;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Frame> frames = ReadAll(*source);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(frames.size(), 30u);
  EXPECT_GE(elapsed, 0.8);
}

TEST(FileSourceTest, LoopContinuesSeqAndPtsInTheSameRun) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = dir / "ten.mp4";
  ASSERT_TRUE(Ffmpeg("-f lavfi -i testsrc=s=64x48:r=10 -frames:v 10 -c:v libx264 -pix_fmt yuv420p " + path));
  SourceOptions options = Options(path);
  options.loop = true;
  options.run = 7;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source, 25);
  ASSERT_EQ(frames.size(), 25u);
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].run, 7u);
    EXPECT_EQ(frames[i].seq, i);
    EXPECT_EQ(frames[i].pts_ns, int64_t(i) * 100'000'000) << "10 fps, continued across passes";
  }
  EXPECT_EQ(frames[12].bgr, frames[2].bgr) << "the second pass shows the same pictures";
  EXPECT_EQ(source->Stats().timestamp_fixups, 0u);
}

TEST(FileSourceTest, ResumeSkipsAcknowledgedFrames) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  const std::string path = TestClip(dir, "clip.mp4", 1);  // 30 frames
  auto full_source = MustOpen(Options(path));
  ASSERT_TRUE(full_source);
  const std::vector<Frame> full = ReadAll(*full_source);
  ASSERT_EQ(full.size(), 30u);

  SourceOptions options = Options(path);
  options.start_after_seq = 19;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> resumed = ReadAll(*source);
  ASSERT_EQ(resumed.size(), 10u);
  ExpectSameFramesFrom(resumed, full, 20);
  EXPECT_EQ(source->Stats().skipped_resume, 20u);
}

TEST(ImageSourceTest, FolderSkipsAndNamesAnUnreadableFile) {
  VIGIL_REQUIRE_FFMPEG();
  TempDir dir;
  ASSERT_TRUE(Ffmpeg("-f lavfi -i color=c=red:s=40x30 -frames:v 1 " + (dir / "a.png")));
  ASSERT_TRUE(Ffmpeg("-f lavfi -i color=c=lime:s=44x32 -frames:v 1 " + (dir / "c.jpg")));
  ASSERT_TRUE(Ffmpeg("-f lavfi -i color=c=blue:s=48x36 -frames:v 1 " + (dir / "d.bmp")));
  std::ofstream(dir / "b_broken.png") << "this is not a PNG";
  std::ofstream(dir / "notes.txt") << "not an image: not listed";

  for (const std::string& uri : {dir.path().string(), dir / "*.*g", dir / "[abcd]*"}) {
    SCOPED_TRACE(uri);
    SourceOptions options = Options(uri);
    options.stream_id = "yard";
    auto source = MustOpen(options);
    ASSERT_TRUE(source);
    const bool glob_without_bmp = uri.find("*.*g") != std::string::npos;
    EXPECT_EQ(source->declared_frames(), glob_without_bmp ? 3u : 4u);  // the broken file is listed too
    const std::vector<Frame> frames = ReadAll(*source);
    ASSERT_EQ(frames.size(), glob_without_bmp ? 2u : 3u);
    EXPECT_EQ(frames[0].width, 40);
    ExpectQuadrants(frames[0], {kRed, kRed, kRed, kRed}, 3);
    EXPECT_EQ(frames[1].width, 44);
    ExpectQuadrants(frames[1], {kLime, kLime, kLime, kLime}, 6);  // JPEG
    if (!glob_without_bmp) {
      EXPECT_EQ(frames[2].width, 48);
      ExpectQuadrants(frames[2], {kBlue, kBlue, kBlue, kBlue}, 3);
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      EXPECT_EQ(frames[i].seq, i);
      EXPECT_EQ(frames[i].stream_id, "yard");
      EXPECT_GT(frames[i].decode_ns, 0);
    }
    const StreamStats stats = source->Stats();
    EXPECT_EQ(stats.decode_errors, 1u);
    EXPECT_NE(stats.last_error.find("b_broken.png"), std::string::npos) << stats.last_error;
    EXPECT_EQ(stats.state, StreamState::kEnded);
  }
}

TEST(ImageSourceTest, EmptyGlobIsNotFound) {
  TempDir dir;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(Options(dir / "*.jpg"));
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(absl::IsNotFound(source.status())) << source.status();
  EXPECT_NE(source.status().message().find("no file matches"), absl::string_view::npos) << source.status();
}

// The pattern source.h documents for synthetic sources: pixel (x, y) of frame k of a `height`-row stream.
Bgr SyntheticPixel(int height, uint64_t k, int x, int y) {
  const int u = x + int(k % 256);
  return {u % 256, y * 255 / std::max(1, height - 1), ((u / 32 + y / 32) & 1) ? 255 : 0};
}

// Pixels of `f` that differ from SyntheticPixel for frame k; the first one is reported.
int SyntheticMismatches(const Frame& f, uint64_t k) {
  int bad = 0;
  for (int y = 0; y < f.height; ++y) {
    for (int x = 0; x < f.width; ++x) {
      const Bgr want = SyntheticPixel(f.height, k, x, y), got = PixelAt(f, x, y);
      if (got != want && bad++ == 0) {
        ADD_FAILURE() << "frame " << k << " pixel (" << x << ", " << y << "): got " << got[0] << "," << got[1] << ","
                      << got[2] << " want " << want[0] << "," << want[1] << "," << want[2];
      }
    }
  }
  return bad;
}

TEST(SyntheticSourceTest, ClassifiedBeforeGlobsAndSchemes) {
  EXPECT_EQ(ClassifyUri("synthetic:1920x1080"), SourceKind::kSynthetic);
  EXPECT_EQ(ClassifyUri("synthetic:1920x1080?fps=30&frames=300"), SourceKind::kSynthetic) << "'?' is no glob here";
  EXPECT_EQ(ClassifyUri("synthetic://1920x1080"), SourceKind::kSynthetic) << "fails with the syntax, not in FFmpeg";
  EXPECT_EQ(ClassifyUri("./synthetic:1920x1080.mp4"), SourceKind::kFile);
  EXPECT_EQ(RedactUri("synthetic:64x48?fps=5"), "synthetic:64x48?fps=5");
}

TEST(SyntheticSourceTest, SizesProbeAndPattern) {
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{1, 1}, {2, 3}, {33, 17}, {641, 479}, {1920, 1080}}) {
    const std::string uri = "synthetic:" + std::to_string(w) + "x" + std::to_string(h);
    SCOPED_TRACE(uri);
    auto source = MustOpen(Options(uri));
    ASSERT_TRUE(source);
    EXPECT_FALSE(source->live());
    EXPECT_EQ(source->probed().width, w);
    EXPECT_EQ(source->probed().height, h);
    EXPECT_DOUBLE_EQ(source->probed().fps, 30.0);
    EXPECT_FALSE(source->declared_frames().has_value()) << "endless";
    const std::vector<Frame> frames = ReadAll(*source, 3);
    ASSERT_EQ(frames.size(), 3u);
    for (uint64_t k = 0; k < frames.size(); ++k) {
      const Frame& f = frames[k];
      ASSERT_EQ(f.width, w);
      ASSERT_EQ(f.height, h);
      ASSERT_EQ(f.stride, w * 3);
      ASSERT_EQ(f.bgr.size(), size_t(w) * h * 3);
      EXPECT_FALSE(f.device);
      EXPECT_EQ(f.rotation, 0);
      EXPECT_EQ(f.seq, k);
      EXPECT_EQ(f.stream_id, uri);
      EXPECT_GE(f.decode_ns, 0);
      EXPECT_GT(f.capture_time_ns, 0);
      EXPECT_EQ(SyntheticMismatches(f, k), 0);
      if (k > 0) {
        EXPECT_GE(f.source_steady_ns, frames[k - 1].source_steady_ns);
        size_t same = 0;  // consecutive frames differ in every pixel (blue moves by one)
        for (size_t i = 0; i < f.bgr.size(); i += 3) same += f.bgr[i] == frames[k - 1].bgr[i];
        EXPECT_EQ(same, 0u);
      }
    }
    EXPECT_EQ(source->Stats().state, StreamState::kStreaming);
  }
}

TEST(SyntheticSourceTest, SameFrameIndexSamePixelsAcrossOpens) {
  auto a = MustOpen(Options("synthetic:70x20"));
  auto b = MustOpen(Options("synthetic:70x20?fps=7"));  // the rate changes the timeline, not the pixels
  ASSERT_TRUE(a && b);
  const std::vector<Frame> fa = ReadAll(*a, 300), fb = ReadAll(*b, 300);
  ASSERT_EQ(fa.size(), 300u);
  ASSERT_EQ(fb.size(), 300u);
  for (size_t k = 0; k < fa.size(); ++k) {
    ASSERT_EQ(fa[k].bgr, fb[k].bgr) << "frame " << k;
    ASSERT_EQ(SyntheticMismatches(fa[k], k), 0);
  }
  EXPECT_EQ(fa[256].bgr, fa[0].bgr) << "the pattern repeats every 256 frames";
  EXPECT_NE(fa[255].bgr, fa[0].bgr);
}

TEST(SyntheticSourceTest, PtsFollowFps) {
  for (const double fps : {30.0, 7.5, 1000.0, 0.1}) {
    const std::string uri = "synthetic:8x6?fps=" + std::to_string(fps);
    SCOPED_TRACE(uri);
    auto source = MustOpen(Options(uri));
    ASSERT_TRUE(source);
    EXPECT_DOUBLE_EQ(source->probed().fps, fps);
    const std::vector<Frame> frames = ReadAll(*source, 100);  // without realtime: as fast as asked
    ASSERT_EQ(frames.size(), 100u);
    for (size_t k = 0; k < frames.size(); ++k) {
      EXPECT_EQ(frames[k].pts_ns, std::llround(double(k) * 1e9 / fps)) << k;
    }
    EXPECT_EQ(source->Stats().timestamp_fixups, 0u);
  }
}

TEST(SyntheticSourceTest, FramesEndsAfterNInAnyParameterOrder) {
  SourceOptions options = Options("synthetic:33x17?frames=5&fps=12.5");
  options.stream_id = "bench-0";
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  EXPECT_EQ(source->declared_frames(), 5u);
  EXPECT_DOUBLE_EQ(source->probed().fps, 12.5);
  const std::vector<Frame> frames = ReadAll(*source, 100);
  ASSERT_EQ(frames.size(), 5u);
  for (size_t k = 0; k < frames.size(); ++k) {
    EXPECT_EQ(frames[k].pts_ns, int64_t(k) * 80'000'000);
    EXPECT_EQ(frames[k].stream_id, "bench-0");
  }
  for (int i = 0; i < 2; ++i) {  // the end stays the end
    StatusOr<std::optional<Frame>> next = source->Next();
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_FALSE(next->has_value());
  }
  const StreamStats stats = source->Stats();
  EXPECT_EQ(stats.state, StreamState::kEnded);
  EXPECT_EQ(stats.frames_delivered, 5u);
}

TEST(SyntheticSourceTest, LoopStartsTheFramesOverInTheSameRun) {
  SourceOptions options = Options("synthetic:16x8?fps=10&frames=3");
  options.loop = true;
  options.run = 4;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source, 8);
  ASSERT_EQ(frames.size(), 8u);
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].run, 4u);
    EXPECT_EQ(frames[i].seq, i);
    EXPECT_EQ(frames[i].pts_ns, int64_t(i) * 100'000'000) << "10 fps, continued across passes";
    EXPECT_EQ(SyntheticMismatches(frames[i], i % 3), 0) << "pass " << i / 3;
  }
  EXPECT_EQ(source->Stats().timestamp_fixups, 0u);
}

TEST(SyntheticSourceTest, TargetFpsAndResumeDeliverTheSameFrames) {
  SourceOptions options = Options("synthetic:40x30?fps=30&frames=60");
  options.target_fps = 10;
  auto full_source = MustOpen(options);
  ASSERT_TRUE(full_source);
  const std::vector<Frame> full = ReadAll(*full_source);
  ASSERT_EQ(full.size(), 20u);
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(SyntheticMismatches(full[i], 3 * i), 0) << "every third";
  EXPECT_EQ(full_source->Stats().skipped_target_fps, 40u);

  // Resumed: pictures before the resume point are skipped without being generated; those delivered match.
  options.start_after_seq = 4;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> resumed = ReadAll(*source);
  ASSERT_EQ(resumed.size(), 15u);
  ExpectSameFramesFrom(resumed, full, 5);
  EXPECT_EQ(source->Stats().skipped_resume, 5u);

  options.target_fps = 0;
  options.start_after_seq = 57;
  source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> tail = ReadAll(*source);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].seq, 58u);
  EXPECT_EQ(SyntheticMismatches(tail[0], 58), 0);
  EXPECT_EQ(SyntheticMismatches(tail[1], 59), 0);
}

// A real-time synthetic source at 0.1 fps (a frame due every 10 s) whose first frame was delivered.
std::unique_ptr<Source> PacedAfterFirstFrame() {
  SourceOptions options = Options("synthetic:8x6?fps=0.1");
  options.realtime = true;
  auto source = MustOpen(options);
  if (!source) return nullptr;
  StatusOr<std::optional<Frame>> first = source->Next();
  EXPECT_TRUE(first.ok() && first->has_value()) << first.status();
  return source;
}

// Interrupts `source` if still alive after 30 s: a test of a frame that must come at once fails, not hangs.
class Watchdog {
 public:
  explicit Watchdog(Source* source)
      : thread_([this, source] {
          for (int i = 0; i < 3000 && !done_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          if (!done_.load()) source->Interrupt();
        }) {}
  ~Watchdog() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Pacing reads the steady clock (Source::Next; no clock seam), so this asserts no duration: at 0.1 fps the
// second frame is due 10 s after the first, and Interrupt() ends that wait with Cancelled. Without pacing
// Next() would return the frame at once.
TEST(SyntheticSourceTest, RealtimeWaitsForTheNextFrameUntilInterrupted) {
  auto source = PacedAfterFirstFrame();
  ASSERT_TRUE(source);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    source->Interrupt();
  });
  StatusOr<std::optional<Frame>> second = source->Next();
  stopper.join();
  EXPECT_TRUE(absl::IsCancelled(second.status())) << (second.ok() ? "a frame came before it was due" : "")
                                                  << second.status();
  EXPECT_EQ(source->Stats().state, StreamState::kStopped);
}

// A hot standby's source: its first picture was paced (held while the standby waited), then the mirrored
// cursor moved and DoNotPaceThrough was raised while it ran. The pictures through the cursor come at once,
// and so does the one after them: it is paced from when it is delivered, not from the first picture's clock
// (at 0.1 fps that would be 60 s later). A watchdog interrupts after 30 s, so a regression fails, not hangs.
TEST(SyntheticSourceTest, PacingStartsAnewAfterFramesItWasToldNotToPace) {
  auto source = PacedAfterFirstFrame();
  ASSERT_TRUE(source);
  source->DoNotPaceThrough(5);
  std::vector<uint64_t> seqs;
  {
    Watchdog watchdog(source.get());
    for (int i = 0; i < 6; ++i) {
      StatusOr<std::optional<Frame>> f = source->Next();
      if (!f.ok() || !f->has_value()) break;
      seqs.push_back((*f)->seq);
    }
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6})) << "seq 6 waited for the first picture's clock";
}

// The takeover: a standby's reader held picture 1 (paced when decoded); the ledger then skips it and the next
// one must come at once, not 10 s after picture 1 (0.1 fps). DoNotPaceThrough restarts the clock even when no
// frame is left to skip.
TEST(SyntheticSourceTest, DoNotPaceThroughRestartsTheClockForTheNextFrame) {
  auto source = PacedAfterFirstFrame();
  ASSERT_TRUE(source);
  source->DoNotPaceThrough(0);  // seq 0 was delivered already: nothing left to skip
  StatusOr<std::optional<Frame>> second = absl::CancelledError("not read");
  {
    Watchdog watchdog(source.get());
    second = source->Next();
  }
  ASSERT_TRUE(second.ok() && second->has_value()) << "seq 1 waited for seq 0's clock: " << second.status();
  EXPECT_EQ((*second)->seq, 1u);
}

// live=1: a camera. Live before it is opened (IsLiveUri, so the edge numbers it as one), its picture 0 at
// once, the next one only when due (by the clock, without realtime), a StreamReader of it drops.
TEST(SyntheticSourceTest, LiveIsACameraPacedByTheClock) {
  EXPECT_TRUE(IsLiveUri("synthetic:8x6?live=1"));
  EXPECT_TRUE(IsLiveUri("synthetic:8x6?fps=5&live=1&frames=3"));
  EXPECT_FALSE(IsLiveUri("synthetic:8x6?live=0"));
  EXPECT_FALSE(IsLiveUri("synthetic:8x6"));
  EXPECT_FALSE(IsLiveUri("synthetic:8x6?live=2"));  // does not parse: OpenSource says why
  EXPECT_TRUE(IsLiveUri("rtsp://cam/1"));
  EXPECT_FALSE(IsLiveUri("/videos/door.mp4"));
  auto source = MustOpen(Options("synthetic:8x6?fps=0.1&live=1"));
  ASSERT_TRUE(source);
  EXPECT_TRUE(source->live());
  StatusOr<std::optional<Frame>> first = source->Next();
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
  EXPECT_EQ((*first)->bgr.size(), 8u * 6 * 3);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    source->Interrupt();
  });
  StatusOr<std::optional<Frame>> second = source->Next();
  stopper.join();
  EXPECT_TRUE(absl::IsCancelled(second.status())) << (second.ok() ? "a frame came before it was due" : "")
                                                  << second.status();
}

TEST(SyntheticSourceTest, HwaccelIsIgnoredAndSaidSo) {
  SourceOptions options = Options("synthetic:64x48?frames=2");
  options.hwaccel = "cuda:0";
  options.deliver_device_frames = true;
  auto source = MustOpen(options);
  ASSERT_TRUE(source);
  const std::vector<Frame> frames = ReadAll(*source);
  ASSERT_EQ(frames.size(), 2u);
  for (const Frame& f : frames) {
    EXPECT_FALSE(f.device);
    EXPECT_EQ(f.bgr.size(), 64u * 48 * 3);
  }
  EXPECT_EQ(source->Stats().hwaccel, "cpu (synthetic frames are generated in host memory)");
}

TEST(SyntheticSourceTest, BadUrisNameTheStreamTheUriAndTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"synthetic:", "size '' is not WIDTHxHEIGHT; expected synthetic:WIDTHxHEIGHT[?fps=F&frames=N&live=0|1]"},
      {"synthetic:640", "size '640' is not WIDTHxHEIGHT"},
      {"synthetic:640X480", "size '640X480' is not WIDTHxHEIGHT"},
      {"synthetic:?fps=5", "size '' is not WIDTHxHEIGHT"},
      {"synthetic://640x480", "width '//640' is not a whole number"},
      {"synthetic:640x", "height '' is not a whole number"},
      {"synthetic:axb", "width 'a' is not a whole number"},
      {"synthetic:-1x5", "width '-1' is not a whole number"},
      {"synthetic: 64x48", "width ' 64' is not a whole number"},
      {"synthetic:64x48x2", "height '48x2' is not a whole number"},
      {"synthetic:0x480", "width 0 is not in 1..16384 pixels"},
      {"synthetic:640x0", "height 0 is not in 1..16384 pixels"},
      {"synthetic:16385x480", "width 16385 is not in 1..16384 pixels"},
      {"synthetic:640x99999999999999999999", "height 99999999999999999999 is not in 1..16384 pixels"},
      {"synthetic:640x480?fps=0", "fps '0' is not a number in [0.001, 1000]"},
      {"synthetic:640x480?fps=-5", "fps '-5' is not a number in [0.001, 1000]"},
      {"synthetic:640x480?fps=1000.5", "fps '1000.5' is not a number in [0.001, 1000]"},
      {"synthetic:640x480?fps=0.0001", "fps '0.0001' is not a number in [0.001, 1000]"},
      {"synthetic:640x480?fps=abc", "fps 'abc' is not a number"},
      {"synthetic:640x480?fps=30fps", "fps '30fps' is not a number"},
      {"synthetic:640x480?fps=nan", "fps 'nan' is not a number"},
      {"synthetic:640x480?fps=inf", "fps 'inf' is not a number"},
      {"synthetic:640x480?fps=30&fps=25", "parameter fps is given twice"},
      {"synthetic:640x480?frames=0", "frames '0' is not a whole number >= 1 (leave it out for an endless stream)"},
      {"synthetic:640x480?frames=-3", "frames '-3' is not a whole number >= 1"},
      {"synthetic:640x480?frames=1.5", "frames '1.5' is not a whole number >= 1"},
      {"synthetic:640x480?frames=2&frames=3", "parameter frames is given twice"},
      {"synthetic:640x480?loop=1", "unknown parameter 'loop' (known: fps, frames, live)"},
      {"synthetic:640x480?FPS=30", "unknown parameter 'FPS' (known: fps, frames, live)"},
      {"synthetic:640x480?live=yes", "live 'yes' is not 0 or 1"},
      {"synthetic:640x480?live=1&live=0", "parameter live is given twice"},
      {"synthetic:640x480?", "parameter '' is not key=value"},
      {"synthetic:640x480?fps", "parameter 'fps' is not key=value"},
      {"synthetic:640x480?fps=", "parameter 'fps=' is not key=value"},
      {"synthetic:640x480?=30", "parameter '=30' is not key=value"},
      {"synthetic:640x480?fps=30&", "parameter '' is not key=value"},
      {"synthetic:640x480?fps=30&&frames=2", "parameter '' is not key=value"},
  };
  for (const auto& [uri, reason] : cases) {
    SCOPED_TRACE(uri);
    SourceOptions options = Options(uri);
    options.stream_id = "cam7";
    StatusOr<std::unique_ptr<Source>> source = OpenSource(options);
    ASSERT_FALSE(source.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(source.status())) << source.status();
    EXPECT_EQ(std::string(source.status().message()).rfind("stream 'cam7': " + uri + ": ", 0), 0u) << source.status();
    EXPECT_NE(source.status().message().find(reason), absl::string_view::npos) << source.status();
  }
  // Without a stream id the URI names the stream.
  StatusOr<std::unique_ptr<Source>> source = OpenSource(Options("synthetic:0x1"));
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().message(), "stream 'synthetic:0x1': synthetic:0x1: width 0 is not in 1..16384 pixels");
}

TEST(SourceOptionsTest, ImpossibleValuesAreRejected) {
  SourceOptions options = Options("clip.mp4");
  options.target_fps = -1;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(options);
  ASSERT_FALSE(source.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(source.status()));
  EXPECT_NE(source.status().message().find("target_fps"), absl::string_view::npos) << source.status();
}

}  // namespace
}  // namespace vigil::video
