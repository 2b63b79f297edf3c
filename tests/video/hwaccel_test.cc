// GPU decode (SourceOptions::hwaccel): option parsing, the CPU fallback (what runs without an NVIDIA GPU),
// and, on a machine with one, device frames checked against the CPU decode (GpuDecode.*: skipped with a
// message where FFmpeg cannot open CUDA device 0). Clips are written with video::VideoWriter (libx264), so
// these tests need no ffmpeg CLI; vtest.avi comes from Debian's opencv-doc.
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "test_media.h"
#include "vigil/video/source.h"
#include "vigil/video/writer.h"

namespace vigil::video {
namespace {

using testing::ReadAll;
using testing::TempDir;

constexpr char kVtest[] = "/usr/share/doc/opencv-doc/examples/data/vtest.avi";

// Writes `frames` pictures of a moving colour pattern (every pixel changes from frame to frame, so the
// clip has real P/B-frames) as H.264 (libx264, yuv420p, BT.601 limited range as VideoWriter declares it).
std::string WritePatternClip(const std::string& path, int width, int height, int frames) {
  WriterOptions o;
  o.path = path;
  o.width = width;
  o.height = height;
  o.fps = 30;
  StatusOr<std::unique_ptr<VideoWriter>> writer = VideoWriter::Open(o);
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!writer.ok()) return path;
  std::vector<uint8_t> bgr(size_t(width) * height * 3);
  for (int t = 0; t < frames; ++t) {
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        uint8_t* p = &bgr[(size_t(y) * width + x) * 3];
        p[0] = uint8_t(x + 4 * t);
        p[1] = uint8_t(y + 2 * t);
        p[2] = uint8_t(((x / 8) ^ (y / 8)) * 16 + 8 * t);
      }
    }
    EXPECT_TRUE((*writer)->Write(bgr.data(), width * 3, int64_t(t) * 33'333'333).ok());
  }
  EXPECT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->codec_name(), "libx264");
  return path;
}

std::unique_ptr<Source> MustOpen(const std::string& uri, const std::string& hwaccel, bool device_frames = false,
                                 bool loop = false) {
  SourceOptions o;
  o.uri = uri;
  o.hwaccel = hwaccel;
  o.deliver_device_frames = device_frames;
  o.loop = loop;
  StatusOr<std::unique_ptr<Source>> source = OpenSource(std::move(o));
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}


// Counts the warnings logged while it lives that contain `text` (a sink on the default logger).
class WarningCounter {
 public:
  explicit WarningCounter(std::string text) : text_(std::move(text)) {
    sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    sink_->set_pattern("%l %v");
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~WarningCounter() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int count() const {
    std::istringstream lines(log_.str());
    int n = 0;
    for (std::string line; std::getline(lines, line);) n += line.rfind("warning ", 0) == 0 && line.find(text_) != std::string::npos;
    return n;
  }
  std::string log() const { return log_.str(); }

 private:
  std::string text_;
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// Why CUDA device 0 cannot decode here ("" when it can), from a Source on a tiny H.264 clip.
std::string CudaUnavailable() {
  static const std::string why = [] {
    TempDir dir;
    SourceOptions o;
    o.uri = WritePatternClip(dir / "probe.mp4", 64, 64, 2);
    o.hwaccel = "cuda";
    StatusOr<std::unique_ptr<Source>> source = OpenSource(o);
    if (!source.ok()) {
      ADD_FAILURE() << source.status();
      return std::string("the probe clip did not open");
    }
    const std::string where = (*source)->Stats().hwaccel;
    return where.rfind("cpu (cannot open CUDA device", 0) == 0 ? where : std::string();
  }();
  return why;
}

void ExpectSamePixels(const Frame& got, const Frame& want, size_t i) {
  ASSERT_FALSE(got.device) << "frame " << i;
  ASSERT_EQ(got.width, want.width) << "frame " << i;
  ASSERT_EQ(got.height, want.height) << "frame " << i;
  ASSERT_EQ(got.stride, want.stride) << "frame " << i;
  ASSERT_EQ(got.pts_ns, want.pts_ns) << "frame " << i;
  ASSERT_EQ(got.bgr.size(), want.bgr.size()) << "frame " << i;
  size_t differing = 0;
  for (size_t b = 0; b < got.bgr.size(); ++b) differing += got.bgr[b] != want.bgr[b];
  ASSERT_EQ(differing, 0u) << "frame " << i << ": bytes differing from the CPU decode";
}

TEST(Hwaccel, ParsesCpuCudaAndCudaN) {
  EXPECT_EQ(*ParseHwaccel(""), std::nullopt);
  EXPECT_EQ(*ParseHwaccel("cpu"), std::nullopt);
  EXPECT_EQ(*ParseHwaccel("cuda"), 0);
  EXPECT_EQ(*ParseHwaccel("cuda:0"), 0);
  EXPECT_EQ(*ParseHwaccel("cuda:3"), 3);
  EXPECT_EQ(*ParseHwaccel("cuda:1023"), 1023);
  for (const char* bad : {"cuda:x", "vulkan", "cuda:", "cuda:-1", "cuda:1024", "cuda:99999", "CUDA", " cuda", "cuda:1 ",
                          "cuda:0x1", "nvdec"}) {
    StatusOr<std::optional<int>> parsed = ParseHwaccel(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    const std::string message(parsed.status().message());
    EXPECT_NE(message.find(StrCat("hwaccel '", bad, "'")), std::string::npos) << message;
  }
}

TEST(Hwaccel, OpenSourceRejectsABadValueNamingTheOption) {
  for (const char* bad : {"cuda:x", "vulkan"}) {
    SourceOptions o;
    o.uri = "/videos/door.mp4";  // validated before anything is opened
    o.hwaccel = bad;
    StatusOr<std::unique_ptr<Source>> source = OpenSource(o);
    ASSERT_FALSE(source.ok()) << bad;
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(source.status().message());
    EXPECT_NE(message.find("/videos/door.mp4"), std::string::npos) << message;
    EXPECT_NE(message.find(StrCat("hwaccel '", bad, "'")), std::string::npos) << message;
  }
}

// MS-MPEG4 v3 has no NVDEC support: every machine decodes vtest.avi on the CPU, frames as without hwaccel.
TEST(Hwaccel, CodecWithoutCudaFallsBackToIdenticalCpuFrames) {
  if (!std::filesystem::exists(kVtest)) GTEST_SKIP() << kVtest << " is missing (Debian package opencv-doc)";
  WarningCounter warnings("hwaccel cuda");
  auto plain = MustOpen(kVtest, "");
  auto gpu = MustOpen(kVtest, "cuda", /*device_frames=*/true);
  ASSERT_TRUE(plain && gpu);
  EXPECT_EQ(plain->Stats().hwaccel, "") << "not requested";
  EXPECT_EQ(gpu->Stats().hwaccel, "cpu (the msmpeg4 decoder has no CUDA hwaccel in this FFmpeg)");
  const std::vector<Frame> want = ReadAll(*plain, 40), got = ReadAll(*gpu, 40);
  ASSERT_EQ(got.size(), 40u);
  ASSERT_EQ(want.size(), 40u);
  for (size_t i = 0; i < got.size(); ++i) ExpectSamePixels(got[i], want[i], i);
  EXPECT_EQ(gpu->Stats().decode_errors, 0u);
  EXPECT_EQ(warnings.count(), 1) << warnings.log();
  EXPECT_NE(warnings.log().find("stream '" + std::string(kVtest) + "': hwaccel cuda: decoding on the CPU: the msmpeg4"),
            std::string::npos)
      << warnings.log();
}

// H.264, looped over three passes (three opens), frames delivered in host memory: on a machine without a
// GPU the device cannot be opened (one warning for the whole Source, the reason in the stats); with one,
// NVDEC decodes and every picture is downloaded. Either way the pixels equal the CPU decode's exactly:
// H.264 decoding is bit-exact (ITU-T H.264 specifies the decoded samples, NVDEC and libavcodec both conform)
// and the host copy is converted to BGR by the same libswscale call.
TEST(Hwaccel, H264HostFramesEqualCpuDecodeAcrossLoops) {
  TempDir dir;
  const std::string clip = WritePatternClip(dir / "pattern.mp4", 320, 240, 12);
  WarningCounter warnings("hwaccel cuda:0");
  auto plain = MustOpen(clip, "", false, /*loop=*/true);
  auto gpu = MustOpen(clip, "cuda:0", /*device_frames=*/false, /*loop=*/true);
  ASSERT_TRUE(plain && gpu);
  const std::vector<Frame> want = ReadAll(*plain, 36), got = ReadAll(*gpu, 36);
  ASSERT_EQ(got.size(), 36u);
  ASSERT_EQ(want.size(), 36u);
  for (size_t i = 0; i < got.size(); ++i) ExpectSamePixels(got[i], want[i], i);
  const std::string where = gpu->Stats().hwaccel;
  if (where == "cuda:0") {
    EXPECT_EQ(warnings.count(), 0) << warnings.log();
  } else {
    EXPECT_EQ(where.rfind("cpu (cannot open CUDA device 0: ", 0), 0u) << where;
    EXPECT_EQ(warnings.count(), 1) << warnings.log();
  }
  EXPECT_EQ(gpu->Stats().decode_errors, 0u);
}

TEST(Hwaccel, DownloadBgrLeavesHostFramesAlone) {
  Frame f;
  f.width = 2;
  f.height = 1;
  f.stride = 6;
  f.bgr = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(DownloadBgr(f).ok());
  EXPECT_EQ(f.bgr, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.stride, 6);
  Frame orphan;  // a device part without FFmpeg's frame behind it
  orphan.device = DeviceFrame{};
  EXPECT_EQ(DownloadBgr(orphan).code(), absl::StatusCode::kInvalidArgument);
}

// A device frame whose owner copies its planes (a hot standby's mirrored picture, not a Source's): DownloadBgr
// converts the packed NV12 it gives in the frame's matrix and range. Uniform chroma (no interpolation at play),
// luma 16..233 across the picture; expected values from BT.601 / BT.709 by hand (libswscale's fixed-point
// coefficients land within 3 levels of the exact formula).
TEST(Hwaccel, DownloadBgrConvertsAnOwnersPlanes) {
  const int w = 8, h = 4;
  const uint8_t cb = 90, cr = 200;
  auto make = [&](YuvMatrix matrix, bool full) {
    Frame f;
    f.width = w;
    f.height = h;
    DeviceFrame d;
    d.matrix = matrix;
    d.full_range = full;
    d.copy_to_host = [&](uint8_t* dst) {
      for (int i = 0; i < w * h; ++i) dst[i] = static_cast<uint8_t>(16 + (i % w) * 31);  // 16..233
      for (int i = 0; i < w * h / 2; i += 2) {
        dst[w * h + i] = cb;
        dst[w * h + i + 1] = cr;
      }
      return absl::OkStatus();
    };
    f.device = d;
    return f;
  };
  for (const auto& [matrix, kr, kb] : {std::tuple{YuvMatrix::kBt601, 0.299, 0.114},
                                       std::tuple{YuvMatrix::kBt709, 0.2126, 0.0722}}) {
    for (bool full : {false, true}) {
      Frame f = make(matrix, full);
      ASSERT_TRUE(DownloadBgr(f).ok());
      ASSERT_FALSE(f.device);
      ASSERT_EQ(f.stride, w * 3);
      const double kg = 1 - kr - kb;
      for (int x = 0; x < w; ++x) {
        const int yv = 16 + x * 31;
        const double y = full ? yv / 255.0 : (yv - 16) / 219.0;
        const double pb = full ? (cb - 128) / 255.0 : (cb - 128) / 224.0;
        const double pr = full ? (cr - 128) / 255.0 : (cr - 128) / 224.0;
        const double r = y + 2 * (1 - kr) * pr, b = y + 2 * (1 - kb) * pb;
        const double g = y - (2 * kb * (1 - kb) * pb + 2 * kr * (1 - kr) * pr) / kg;
        auto clamp = [](double v) { return std::clamp(static_cast<int>(std::lround(v * 255)), 0, 255); };
        for (int row = 0; row < h; ++row) {
          const uint8_t* px = f.bgr.data() + row * f.stride + x * 3;
          EXPECT_NEAR(px[0], clamp(b), 3) << "x " << x << " full " << full << " kr " << kr;
          EXPECT_NEAR(px[1], clamp(g), 3) << "x " << x << " full " << full << " kr " << kr;
          EXPECT_NEAR(px[2], clamp(r), 3) << "x " << x << " full " << full << " kr " << kr;
        }
      }
    }
  }
  Frame failing = make(YuvMatrix::kBt601, false);
  failing.device->copy_to_host = [](uint8_t*) { return absl::InternalError("the GPU is gone"); };
  const Status st = DownloadBgr(failing);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("the GPU is gone"), std::string_view::npos) << st;
  EXPECT_TRUE(failing.device.has_value()) << "left unchanged";
}

// GPU machine only: 1080p H.264 decoded by NVDEC into device frames. All 40 frames are held until the end,
// so each picture must survive the decoding of up to 39 later ones (keepalive; more frames than NVDEC has
// decode surfaces for H.264), then DownloadBgr must give exactly the CPU decode's pixels (see above).
// RetainCudaDecodeDevice agrees with what a Source finds: where a Source falls back because the device
// does not open, so does it, with the same reason; where a Source decodes on the GPU, it holds the device.
TEST(Hwaccel, RetainCudaDecodeDeviceSaysWhatASourceSays) {
  const std::string why = CudaUnavailable();
  StatusOr<std::shared_ptr<void>> device = RetainCudaDecodeDevice(0);
  if (why.empty()) {
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_NE(device->get(), nullptr);
    return;
  }
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kUnavailable);
  // The Source says "cpu (cannot open CUDA device 0: <FFmpeg's words>)".
  EXPECT_EQ(why, StrCat("cpu (", device.status().message(), ")"));
}

TEST(GpuDecode, DeviceFramesMatchCpuDecode) {
  if (const std::string why = CudaUnavailable(); !why.empty()) GTEST_SKIP() << "no usable CUDA device: " << why;
  TempDir dir;
  const std::string clip = WritePatternClip(dir / "pattern1080.mp4", 1920, 1080, 40);
  auto gpu = MustOpen(clip, "cuda", /*device_frames=*/true);
  ASSERT_TRUE(gpu);
  std::vector<Frame> frames = ReadAll(*gpu, 40);
  EXPECT_EQ(gpu->Stats().hwaccel, "cuda:0");
  ASSERT_EQ(frames.size(), 40u);
  for (size_t i = 0; i < frames.size(); ++i) {
    const Frame& f = frames[i];
    ASSERT_TRUE(f.device) << "frame " << i << " came in host memory";
    EXPECT_TRUE(f.bgr.empty());
    EXPECT_EQ(f.stride, 0);
    EXPECT_EQ(f.width, 1920);
    EXPECT_EQ(f.height, 1080);
    EXPECT_EQ(f.rotation, 0);
    EXPECT_EQ(f.device->device, 0);
    EXPECT_NE(f.device->y, nullptr);
    EXPECT_NE(f.device->uv, nullptr);
    EXPECT_GE(f.device->y_pitch, 1920);
    EXPECT_GE(f.device->uv_pitch, 1920);
    EXPECT_EQ(f.device->matrix, YuvMatrix::kBt601) << "the clip declares SMPTE 170M (VideoWriter)";
    EXPECT_FALSE(f.device->full_range);
    EXPECT_TRUE(f.device->keepalive);
  }
  EXPECT_NE(frames[0].device->y, frames[1].device->y) << "two held frames share a surface";
  auto cpu = MustOpen(clip, "");
  ASSERT_TRUE(cpu);
  const std::vector<Frame> want = ReadAll(*cpu, 40);
  ASSERT_EQ(want.size(), 40u);
  for (size_t i = 0; i < frames.size(); ++i) {
    const int64_t decode_ns = frames[i].decode_ns;
    ASSERT_TRUE(DownloadBgr(frames[i]).ok()) << "frame " << i;
    EXPECT_GT(frames[i].decode_ns, decode_ns) << "the download is timed into decode_ns";
    ExpectSamePixels(frames[i], want[i], i);
  }
  EXPECT_EQ(gpu->Stats().decode_errors, 0u);
}

// GPU machine only: a copy of a device frame keeps the surface after the Source that decoded it is gone.
TEST(GpuDecode, DeviceFrameOutlivesItsSource) {
  if (const std::string why = CudaUnavailable(); !why.empty()) GTEST_SKIP() << "no usable CUDA device: " << why;
  TempDir dir;
  const std::string clip = WritePatternClip(dir / "pattern.mp4", 320, 240, 12);
  auto gpu = MustOpen(clip, "cuda", /*device_frames=*/true);
  ASSERT_TRUE(gpu);
  std::vector<Frame> frames = ReadAll(*gpu, 12);
  ASSERT_EQ(frames.size(), 12u);
  gpu.reset();
  Frame copy = frames[11];
  frames.clear();
  ASSERT_TRUE(copy.device);
  ASSERT_TRUE(DownloadBgr(copy).ok());
  auto cpu = MustOpen(clip, "");
  ASSERT_TRUE(cpu);
  const std::vector<Frame> want = ReadAll(*cpu, 12);
  ASSERT_EQ(want.size(), 12u);
  ExpectSamePixels(copy, want[11], 11);
}

}  // namespace
}  // namespace vigil::video
