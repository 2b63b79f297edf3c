// Sources on files and images: real-file handling, timing options, errors. Media are generated with the
// ffmpeg CLI into a temporary folder (test_media.h); vtest.avi comes from Debian's opencv-doc.
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
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
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].seq, 20 + i);
    EXPECT_EQ(resumed[i].pts_ns, full[20 + i].pts_ns);
    EXPECT_EQ(resumed[i].bgr, full[20 + i].bgr);
  }
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
