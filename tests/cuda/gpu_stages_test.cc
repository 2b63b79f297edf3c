// The detector's GPU stages against the host stages (issue #4 items 4–5):
//  - the letterbox kernel equals detect::Letterbox within 1 grey level (odd sizes, both styles, grey
//    inputs, float16, row pitch, blank slots);
//  - GPU decode + NMS keeps exactly the boxes the host's DecodeOutput + NonMaxSuppression (or
//    TopByScore) + MapToSource keep, on the same raw outputs, for every family — with deliberate score
//    ties (resolved by box index on both sides), overlapping clusters, class filters, agnostic NMS,
//    max_det, and the 30000-candidate cut;
//  - a Detector on a real model gives the same detections with the GPU stages as with the host
//    stages, for host, page-locked and device frames.
// Every test skips with a message where no GPU is visible; scripts/gpu-check.sh runs them on one.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "detect/cuda/detect_kernels.h"
#include "detect/cuda/gpu_stages.h"
#include "vigil/infer/cuda_util.h"
#include "vigil/infer/cuda_device.h"
#include "testing/require_gpu.h"
#include "testing/graph_builder.h"
#include "vigil/common/npy.h"
#include "vigil/detect/decode.h"
#include "vigil/detect/detector.h"
#include "vigil/detect/letterbox.h"
#include "vigil/detect/nms.h"

namespace vigil::detect {
namespace {

namespace fs = std::filesystem;
using vigil::cuda::DeviceBuffer;

DeviceBuffer Upload(const void* data, size_t bytes) {
  auto b = DeviceBuffer::Allocate(bytes, "test");
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(cudaMemcpy(b->get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return std::move(*b);
}

cuda::SlotGeometry Geometry(const LetterboxInfo& info, const uint8_t* bgr, int64_t pitch) {
  return {.bgr = bgr, .pitch = pitch, .source_width = info.source_width, .source_height = info.source_height,
          .resized_width = info.resized_width, .resized_height = info.resized_height, .pad_left = info.pad_left,
          .pad_top = info.pad_top, .ratio = info.ratio};
}

Image RandomImage(std::mt19937& rng, int w, int h) {
  // Smooth gradients plus noise: bilinear weights matter, and rounding ties are common.
  Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  std::uniform_int_distribution<int> noise(0, 40);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const int v = (x * (c + 1) * 7 + y * (3 - c) * 5) % 216 + noise(rng);
        img.bgr[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::min(v, 255));
      }
    }
  }
  return img;
}

struct LetterboxCase {
  const char* name;
  std::vector<std::pair<int, int>> sources;  // width, height of each slot's frame
  int height, width, channels;
  LetterboxStyle style;
  bool half;
  int extra_pitch;  // bytes of row padding in the device frames
};

std::ostream& operator<<(std::ostream& os, const LetterboxCase& c) { return os << c.name; }

class GpuLetterbox : public ::testing::TestWithParam<LetterboxCase> {};

TEST_P(GpuLetterbox, EqualsHostLetterboxWithinOneGreyLevel) {
  VIGIL_REQUIRE_GPU();
  const LetterboxCase& c = GetParam();
  const uint32_t seed = infer::testing::FreshSeed();
  SCOPED_TRACE(StrCat(c.name, " seed ", seed));
  std::mt19937 rng(seed);
  const int batch = static_cast<int>(c.sources.size()) + 1;  // the last slot stays blank
  const DType dtype = c.half ? DType::kFloat16 : DType::kFloat32;
  Tensor host(dtype, {batch, c.channels, c.height, c.width});
  std::vector<DeviceBuffer> frames;
  std::vector<cuda::SlotGeometry> slots(static_cast<size_t>(batch));
  for (size_t i = 0; i < c.sources.size(); ++i) {
    const auto [w, h] = c.sources[i];
    const Image img = RandomImage(rng, w, h);
    auto info = Letterbox(img, c.style, host, static_cast<int64_t>(i));
    ASSERT_TRUE(info.ok()) << info.status();
    const int64_t pitch = static_cast<int64_t>(w) * 3 + c.extra_pitch;
    std::vector<uint8_t> padded(static_cast<size_t>(pitch) * h, 0xEE);
    for (int y = 0; y < h; ++y) {
      std::copy_n(img.bgr.data() + static_cast<size_t>(y) * w * 3, w * 3, padded.data() + y * pitch);
    }
    frames.push_back(Upload(padded.data(), padded.size()));
    slots[i] = Geometry(*info, static_cast<const uint8_t*>(frames.back().get()), pitch);
  }
  DeviceBuffer slots_dev = Upload(slots.data(), slots.size() * sizeof(slots[0]));
  auto out = DeviceBuffer::Allocate(host.nbytes(), "test");
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(cudaMemset(out->get(), 0x7F, host.nbytes()), cudaSuccess);  // blank slots must be written
  const bool ultralytics = c.style == LetterboxStyle::kUltralytics;
  const cuda::LetterboxParams p{.batch = batch, .channels = c.channels, .height = c.height, .width = c.width,
                                .half = c.half, .rgb = ultralytics, .scale = ultralytics ? 1.0f / 255 : 1.0f};
  ASSERT_EQ(cuda::Letterbox(static_cast<const cuda::SlotGeometry*>(slots_dev.get()), p, out->get(), nullptr),
            cudaSuccess);
  Tensor gpu(dtype, host.shape());
  ASSERT_EQ(cudaMemcpy(gpu.raw(), out->get(), gpu.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  const Tensor a = gpu.ToFloat32(), b = host.ToFloat32();
  const float level = ultralytics ? 1.0f / 255 : 1.0f;
  // One grey level, plus float16's rounding of the normalised value.
  const float tolerance = level * (c.half && ultralytics ? 1.15f : 1.0f) + 1e-6f;
  double worst = 0;
  int64_t off = 0;
  const int64_t per_slot = b.numel() / batch;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const float d = std::fabs(a.data<float>()[i] - b.data<float>()[i]);
    worst = std::max<double>(worst, d / level);
    if (d > 1e-6f) ++off;
    if (i >= per_slot * (batch - 1)) {
      ASSERT_EQ(a.data<float>()[i], 0.0f) << "blank slot element " << i - per_slot * (batch - 1);
    }
    ASSERT_LE(d, tolerance) << "element " << i << ": gpu " << a.data<float>()[i] << " host " << b.data<float>()[i];
  }
  std::printf("[ INFO     ] %s: largest difference %.3f grey levels, %.2f%% of values differ\n", c.name, worst,
              100.0 * static_cast<double>(off) / static_cast<double>(b.numel()));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuLetterbox,
    ::testing::Values(
        LetterboxCase{"hd_to_640_ultralytics", {{1920, 1080}, {1280, 720}}, 640, 640, 3, LetterboxStyle::kUltralytics,
                      false, 0},
        LetterboxCase{"hd_to_640_fp16", {{1920, 1080}}, 640, 640, 3, LetterboxStyle::kUltralytics, true, 0},
        LetterboxCase{"odd_sizes", {{37, 53}, {641, 479}, {999, 1}, {1, 777}}, 640, 640, 3,
                      LetterboxStyle::kUltralytics, false, 0},
        LetterboxCase{"upscale_and_same_size", {{200, 150}, {640, 640}, {320, 640}}, 640, 640, 3,
                      LetterboxStyle::kUltralytics, false, 0},
        LetterboxCase{"non_square_target", {{768, 576}, {1920, 1080}}, 384, 640, 3, LetterboxStyle::kUltralytics,
                      false, 0},
        LetterboxCase{"yolox_style", {{768, 576}, {416, 416}, {123, 457}}, 416, 416, 3, LetterboxStyle::kYolox, false,
                      0},
        LetterboxCase{"yolox_fp16", {{1920, 1080}}, 416, 416, 3, LetterboxStyle::kYolox, true, 0},
        LetterboxCase{"grey_input", {{768, 576}, {333, 222}}, 320, 320, 1, LetterboxStyle::kUltralytics, false, 0},
        LetterboxCase{"pitched_rows", {{1920, 1080}, {767, 575}}, 640, 640, 3, LetterboxStyle::kUltralytics, false,
                      256}),
    [](const ::testing::TestParamInfo<LetterboxCase>& i) { return std::string(i.param.name); });

// ---- NV12 (NVDEC's output) ---------------------------------------------------------------------------

struct Nv12 {
  int width = 0, height = 0;
  std::vector<uint8_t> y, uv;  // compact planes
};

// The conversion detect_kernels.h documents, in double: the reference for the kernel's float version.
Image Nv12ToBgr(const Nv12& f, double kr, double kb, bool full_range) {
  Image img{f.width, f.height, std::vector<uint8_t>(static_cast<size_t>(f.width) * f.height * 3)};
  const double kg = 1 - kr - kb;
  auto byte = [](double v) { return static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0, 255.0)); };
  for (int y = 0; y < f.height; ++y) {
    for (int x = 0; x < f.width; ++x) {
      double l = f.y[static_cast<size_t>(y) * f.width + x];
      const size_t c = static_cast<size_t>(y / 2) * f.width + (x / 2) * 2;
      double cb = f.uv[c] - 128.0, cr = f.uv[c + 1] - 128.0;
      if (!full_range) {
        l = (l - 16) * 255 / 219;
        cb *= 255.0 / 224;
        cr *= 255.0 / 224;
      }
      uint8_t* px = img.bgr.data() + (static_cast<size_t>(y) * f.width + x) * 3;
      px[2] = byte(l + 2 * (1 - kr) * cr);
      px[0] = byte(l + 2 * (1 - kb) * cb);
      px[1] = byte(l - 2 * kb * (1 - kb) / kg * cb - 2 * kr * (1 - kr) / kg * cr);
    }
  }
  return img;
}

// BGR → NV12 (BT.601 limited range, chroma of the top-left pixel of each 2×2 block), for feeding real
// pictures through the NV12 path.
Nv12 BgrToNv12(const Image& img) {
  Nv12 f{img.width & ~1, img.height & ~1, {}, {}};
  f.y.resize(static_cast<size_t>(f.width) * f.height);
  f.uv.resize(static_cast<size_t>(f.width) * f.height / 2);
  for (int y = 0; y < f.height; ++y) {
    for (int x = 0; x < f.width; ++x) {
      const uint8_t* px = img.bgr.data() + (static_cast<size_t>(y) * img.width + x) * 3;
      const double b = px[0], g = px[1], r = px[2];
      const double l = 0.299 * r + 0.587 * g + 0.114 * b;
      f.y[static_cast<size_t>(y) * f.width + x] = static_cast<uint8_t>(std::nearbyint(16 + l * 219 / 255));
      if (x % 2 == 0 && y % 2 == 0) {
        const size_t c = static_cast<size_t>(y / 2) * f.width + x;
        f.uv[c] = static_cast<uint8_t>(std::clamp(std::nearbyint(128 + (b - l) / 1.772 * 224 / 255), 0.0, 255.0));
        f.uv[c + 1] = static_cast<uint8_t>(std::clamp(std::nearbyint(128 + (r - l) / 1.402 * 224 / 255), 0.0, 255.0));
      }
    }
  }
  return f;
}

TEST(GpuLetterboxNv12, EqualsHostLetterboxOfTheConvertedFrame) {
  VIGIL_REQUIRE_GPU();
  const uint32_t seed = infer::testing::FreshSeed();
  SCOPED_TRACE(StrCat("seed ", seed));
  std::mt19937 rng(seed);
  struct Case {
    int w, h;
    bool bt709, full_range;
  };
  for (const Case& c : {Case{1920, 1080, true, false}, Case{640, 640, false, false}, Case{1280, 720, false, true},
                        Case{318, 242, true, true}}) {
    SCOPED_TRACE(StrCat(c.w, "x", c.h, c.bt709 ? " bt709" : " bt601", c.full_range ? " full" : " limited"));
    // Smooth luma and chroma with noise, covering the whole code range (clamping included).
    const Image src = RandomImage(rng, c.w, c.h);
    Nv12 f{c.w, c.h, std::vector<uint8_t>(static_cast<size_t>(c.w) * c.h), std::vector<uint8_t>(static_cast<size_t>(c.w) * c.h / 2)};
    for (size_t i = 0; i < f.y.size(); ++i) f.y[i] = src.bgr[i * 3 + 1];
    for (size_t i = 0; i < f.uv.size(); ++i) f.uv[i] = src.bgr[i * 3 + (i % 2 == 0 ? 0 : 2)];
    const double kr = c.bt709 ? 0.2126 : 0.299, kb = c.bt709 ? 0.0722 : 0.114;
    const Image ref = Nv12ToBgr(f, kr, kb, c.full_range);
    Tensor host(DType::kFloat32, {1, 3, 640, 640});
    auto info = Letterbox(ref, LetterboxStyle::kUltralytics, host, 0);
    ASSERT_TRUE(info.ok()) << info.status();
    // Device planes with padded rows, as NVDEC surfaces have.
    const int64_t pitch = c.w + 128;
    std::vector<uint8_t> y_rows(static_cast<size_t>(pitch) * c.h, 7), uv_rows(static_cast<size_t>(pitch) * c.h / 2, 9);
    for (int r = 0; r < c.h; ++r) std::copy_n(f.y.data() + static_cast<size_t>(r) * c.w, c.w, y_rows.data() + r * pitch);
    for (int r = 0; r < c.h / 2; ++r) std::copy_n(f.uv.data() + static_cast<size_t>(r) * c.w, c.w, uv_rows.data() + r * pitch);
    DeviceBuffer y_dev = Upload(y_rows.data(), y_rows.size()), uv_dev = Upload(uv_rows.data(), uv_rows.size());
    cuda::SlotGeometry g = Geometry(*info, static_cast<const uint8_t*>(y_dev.get()), pitch);
    g.uv = static_cast<const uint8_t*>(uv_dev.get());
    g.uv_pitch = pitch;
    g.kr = static_cast<float>(kr);
    g.kb = static_cast<float>(kb);
    g.full_range = c.full_range;
    DeviceBuffer slot = Upload(&g, sizeof(g));
    auto out = DeviceBuffer::Allocate(host.nbytes(), "test");
    ASSERT_TRUE(out.ok());
    const cuda::LetterboxParams p{.batch = 1, .channels = 3, .height = 640, .width = 640};
    ASSERT_EQ(cuda::Letterbox(static_cast<const cuda::SlotGeometry*>(slot.get()), p, out->get(), nullptr), cudaSuccess);
    Tensor gpu(DType::kFloat32, host.shape());
    ASSERT_EQ(cudaMemcpy(gpu.raw(), out->get(), gpu.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    // The kernel converts in float32, the reference in double: a value at a .5 boundary may round the
    // other way (1 level), and the resize may add the one level of the BGR case: at most 2.
    double worst = 0;
    int64_t off = 0;
    for (int64_t i = 0; i < host.numel(); ++i) {
      const double d = std::fabs(gpu.data<float>()[i] - host.data<float>()[i]) * 255;
      worst = std::max(worst, d);
      off += d > 1e-3;
    }
    EXPECT_LE(worst, 2.0 + 1e-3);
    std::printf("[ INFO     ] NV12 %dx%d: largest difference %.3f grey levels, %.2f%% of values differ\n", c.w, c.h,
                worst, 100.0 * static_cast<double>(off) / static_cast<double>(host.numel()));
  }
}

// ---- decode + NMS -----------------------------------------------------------------------------------

struct NmsCase {
  const char* name;
  ModelFamily family;
  int64_t num_boxes;
  int64_t num_classes;
  bool half = false;
  float conf = 0.25f;
  float iou = 0.7f;
  int max_det = 300;
  bool agnostic = false;
  std::vector<int> classes = {};
  bool raw_boxes = false;
};

std::ostream& operator<<(std::ostream& os, const NmsCase& c) { return os << c.name; }

// Scores on a 1/64 grid (exact in float16 too): many equal scores, so the tie rule is exercised.
float Quantised(std::mt19937& rng, float hi) {
  return std::floor(std::uniform_real_distribution<float>(0.0f, hi)(rng) * 64.0f) / 64.0f;
}

// Raw outputs [batch, ...] of `m`'s layout with boxes in overlapping clusters.
Tensor RandomRawOutput(std::mt19937& rng, const ModelInfo& m, const NmsCase& c) {
  const int64_t n = m.num_boxes, nc = m.num_classes;
  Shape shape;
  switch (m.family) {
    case ModelFamily::kUltralytics: shape = {m.batch, 4 + nc, n}; break;
    case ModelFamily::kYoloV5:
    case ModelFamily::kYolox: shape = {m.batch, n, 5 + nc}; break;
    case ModelFamily::kEnd2End: shape = {m.batch, n, 6}; break;
  }
  Tensor t(DType::kFloat32, shape);
  float* p = t.data<float>();
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t b = 0; b < m.batch; ++b) {
    std::vector<std::array<float, 4>> clusters(24);
    for (auto& k : clusters) k = {u(rng) * 600 + 20, u(rng) * 600 + 20, u(rng) * 120 + 10, u(rng) * 120 + 10};
    float* img = p + b * (t.numel() / m.batch);
    for (int64_t i = 0; i < n; ++i) {
      const auto& k = clusters[static_cast<size_t>(i) % clusters.size()];
      const float cx = k[0] + (u(rng) - 0.5f) * k[2] * 0.4f, cy = k[1] + (u(rng) - 0.5f) * k[3] * 0.4f;
      const float w = k[2] * (0.8f + 0.4f * u(rng)), h = k[3] * (0.8f + 0.4f * u(rng));
      const int cls = static_cast<int>(rng() % static_cast<uint32_t>(std::min<int64_t>(nc, 4)));
      if (m.family == ModelFamily::kEnd2End) {
        float* r = img + i * 6;
        r[0] = cx - w / 2;
        r[1] = cy - h / 2;
        r[2] = cx + w / 2;
        r[3] = cy + h / 2;
        r[4] = Quantised(rng, 1.0f);
        r[5] = static_cast<float>(cls);
        continue;
      }
      const bool first = m.family == ModelFamily::kUltralytics;
      const int64_t fields = first ? 4 + nc : 5 + nc;
      auto at = [&](int64_t f) -> float& { return first ? img[f * n + i] : img[i * fields + f]; };
      if (m.raw_boxes) {  // grid offsets and log sizes
        at(0) = u(rng);
        at(1) = u(rng);
        at(2) = u(rng) * 3 - 1;
        at(3) = u(rng) * 3 - 1;
      } else {
        at(0) = cx;
        at(1) = cy;
        at(2) = w;
        at(3) = h;
      }
      const int64_t cls0 = first ? 4 : 5;
      if (!first) at(4) = Quantised(rng, 1.0f) + 1.0f / 64;
      for (int64_t j = 0; j < nc; ++j) at(cls0 + j) = Quantised(rng, 0.2f);
      at(cls0 + cls) = Quantised(rng, 1.0f);
      if (i % 7 == 0 && nc > 1) at(cls0 + (cls + 1) % nc) = at(cls0 + cls);  // tied best classes: first wins
    }
  }
  if (!c.half) return t;
  Tensor h(DType::kFloat16, shape);
  for (int64_t i = 0; i < t.numel(); ++i) h.data<uint16_t>()[i] = FloatToHalf(p[i]);
  return h;
}

class GpuNms : public ::testing::TestWithParam<NmsCase> {};

TEST_P(GpuNms, KeepsTheHostsBoxes) {
  VIGIL_REQUIRE_GPU();
  const NmsCase& c = GetParam();
  const uint32_t seed = infer::testing::FreshSeed();
  SCOPED_TRACE(StrCat(c.name, " seed ", seed));
  std::mt19937 rng(seed);
  ModelInfo m;
  m.family = c.family;
  m.batch = 3;
  m.height = m.width = 640;
  m.num_boxes = c.num_boxes;
  m.num_classes = c.num_classes;
  m.strides = {8, 16, 32};
  m.raw_boxes = c.raw_boxes;
  const Tensor raw = RandomRawOutput(rng, m, c);
  DetectorOptions options;
  options.conf = c.conf;
  options.max_det = c.max_det;
  options.agnostic = c.agnostic;
  options.classes = c.classes;
  const std::pair<int, int> sources[] = {{1920, 1080}, {500, 375}, {640, 640}};
  std::vector<LetterboxInfo> infos;
  std::vector<cuda::SlotGeometry> slots;
  for (const auto& [w, h] : sources) {
    infos.push_back(ComputeLetterbox(w, h, 640, 640, LetterboxStyle::kUltralytics));
    slots.push_back(Geometry(infos.back(), nullptr, 0));
  }
  // Host stages.
  std::vector<std::vector<Detection>> want;
  const NmsOptions nms{.iou = c.iou, .max_det = c.max_det, .agnostic = c.agnostic};
  size_t candidates = 0;
  for (int64_t b = 0; b < m.batch; ++b) {
    auto decoded = DecodeOutput(raw, b, m, c.conf, c.classes);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    candidates += decoded->size();
    std::vector<Detection> kept = c.family == ModelFamily::kEnd2End ? TopByScore(std::move(*decoded), c.max_det)
                                                                    : NonMaxSuppression(std::move(*decoded), nms);
    MapToSource(infos[static_cast<size_t>(b)], kept);
    want.push_back(std::move(kept));
  }
  // GPU stages.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto post = GpuPostprocess::Create(m, options, c.iou, 0);
  ASSERT_TRUE(post.ok()) << post.status();
  DeviceBuffer raw_dev = Upload(raw.raw(), raw.nbytes());
  DeviceBuffer slots_dev = Upload(slots.data(), slots.size() * sizeof(slots[0]));
  ASSERT_TRUE((*post)->Enqueue(raw_dev.get(), c.half, static_cast<int>(m.batch),
                               static_cast<const cuda::SlotGeometry*>(slots_dev.get()), nullptr).ok());
  ASSERT_TRUE((*post)->CopyToHost(nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = (*post)->HostDetections();
  ASSERT_EQ(got.size(), want.size());
  size_t kept_total = 0;
  for (size_t b = 0; b < want.size(); ++b) {
    ASSERT_EQ(got[b].size(), want[b].size()) << "image " << b;
    kept_total += want[b].size();
    for (size_t k = 0; k < want[b].size(); ++k) {
      const Detection &g = got[b][k], &w = want[b][k];
      SCOPED_TRACE(StrCat("image ", b, " detection ", k));
      ASSERT_EQ(g.class_id, w.class_id);
      ASSERT_EQ(g.score, w.score);
      if (c.raw_boxes) {  // expf on the GPU is within 2 ulp of the host's
        for (auto [x, y] : {std::pair{g.x1, w.x1}, {g.y1, w.y1}, {g.x2, w.x2}, {g.y2, w.y2}}) {
          ASSERT_NEAR(x, y, 1e-5f * std::max(1.0f, std::fabs(y)));
        }
      } else {
        ASSERT_EQ(g.x1, w.x1);
        ASSERT_EQ(g.y1, w.y1);
        ASSERT_EQ(g.x2, w.x2);
        ASSERT_EQ(g.y2, w.y2);
      }
    }
  }
  EXPECT_GT(kept_total, 0u) << "the case keeps nothing: it tests nothing";
  std::printf("[ INFO     ] %s: %zu candidates, %zu kept over %lld images, all equal\n", c.name, candidates,
              kept_total, static_cast<long long>(m.batch));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuNms,
    ::testing::Values(
        NmsCase{.name = "ultralytics", .family = ModelFamily::kUltralytics, .num_boxes = 8400, .num_classes = 80},
        NmsCase{.name = "ultralytics_fp16", .family = ModelFamily::kUltralytics, .num_boxes = 8400, .num_classes = 80,
                .half = true},
        NmsCase{.name = "ultralytics_low_conf_many_tiles", .family = ModelFamily::kUltralytics, .num_boxes = 8400,
                .num_classes = 80, .conf = 0.001f},
        NmsCase{.name = "ultralytics_agnostic", .family = ModelFamily::kUltralytics, .num_boxes = 2100,
                .num_classes = 80, .agnostic = true},
        NmsCase{.name = "ultralytics_class_filter", .family = ModelFamily::kUltralytics, .num_boxes = 2100,
                .num_classes = 80, .classes = {0, 2, 17}},
        NmsCase{.name = "ultralytics_max_det_5", .family = ModelFamily::kUltralytics, .num_boxes = 2100,
                .num_classes = 80, .max_det = 5},
        NmsCase{.name = "ultralytics_iou_0_3", .family = ModelFamily::kUltralytics, .num_boxes = 2100,
                .num_classes = 3, .iou = 0.3f},
        NmsCase{.name = "candidate_cut_30000", .family = ModelFamily::kUltralytics, .num_boxes = 40000,
                .num_classes = 2, .conf = 0.0f},
        NmsCase{.name = "yolov5", .family = ModelFamily::kYoloV5, .num_boxes = 6300, .num_classes = 80,
                .iou = 0.45f},
        NmsCase{.name = "yolox_raw", .family = ModelFamily::kYolox, .num_boxes = 8400, .num_classes = 80,
                .iou = 0.45f, .raw_boxes = true},
        NmsCase{.name = "yolox_decoded_fp16", .family = ModelFamily::kYolox, .num_boxes = 8400, .num_classes = 80,
                .half = true, .iou = 0.45f},
        NmsCase{.name = "end2end", .family = ModelFamily::kEnd2End, .num_boxes = 300, .num_classes = 80,
                .max_det = 100}),
    [](const ::testing::TestParamInfo<NmsCase>& i) { return std::string(i.param.name); });

// ---- the Detector end to end ------------------------------------------------------------------------

std::vector<std::string> Files(const char* env, const char* fallback, const std::string& ext, const std::string& has) {
  const char* dir = std::getenv(env);
  const fs::path d = dir ? fs::path(dir) : fs::path(fallback);
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(d, ec)) {
    std::printf("[ NOTE     ] %s (%s) is absent\n", d.c_str(), env);
    return out;
  }
  for (const auto& e : fs::directory_iterator(d)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ext && name.find(has) != std::string::npos) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Image> TestImages() {
  std::vector<Image> images;
  for (const std::string& f :
       Files("VIGIL_TEST_IMAGES", VIGIL_SOURCE_DIR "/../shared/images-npy", ".npy", "")) {  // HWC uint8 BGR
    auto t = ReadNpy(f);
    if (!t.ok() || t->dtype() != DType::kUInt8 || t->rank() != 3 || t->dim(2) != 3) continue;
    Image img{static_cast<int>(t->dim(1)), static_cast<int>(t->dim(0)), {}};
    img.bgr.assign(t->data<uint8_t>(), t->data<uint8_t>() + t->numel());
    images.push_back(std::move(img));
  }
  return images;
}

// Detections of `a` with score >= min_score that `b` has too (same class, IoU >= 0.9, |Δscore| <= 0.02),
// and how many of `a` had that score.
std::pair<size_t, size_t> Matched(const std::vector<Detection>& a, const std::vector<Detection>& b, float min_score) {
  size_t n = 0, considered = 0;
  for (const Detection& d : a) {
    if (d.score < min_score) continue;
    ++considered;
    n += std::any_of(b.begin(), b.end(), [&](const Detection& e) {
      return e.class_id == d.class_id && IoU(d, e) >= 0.9f && std::fabs(e.score - d.score) <= 0.02f;
    });
  }
  return {n, considered};
}

TEST(GpuDetector, SameDetectionsAsHostStagesOnRealModels) {
  VIGIL_REQUIRE_GPU();
  const auto models = Files("VIGIL_TEST_MODELS", VIGIL_TEST_MODELS_DIR, ".onnx", "coco");
  const auto images = TestImages();
  if (models.empty() || images.empty()) {
    GTEST_SKIP() << "needs real models (*coco*.onnx in $VIGIL_TEST_MODELS) and images (.npy in "
                    "$VIGIL_TEST_IMAGES): " << models.size() << " models, " << images.size() << " images";
  }
  for (const std::string& path : models) {
    SCOPED_TRACE(path);
    DetectorOptions gpu_options;
    gpu_options.engine.device = "cuda:0";
    auto gpu = Detector::Load(path, gpu_options);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ASSERT_TRUE((*gpu)->uses_gpu_stages());
    DetectorOptions host_options = gpu_options;
    host_options.gpu_stages = false;
    auto host = Detector::Load(path, host_options);
    ASSERT_TRUE(host.ok()) << host.status();
    ASSERT_FALSE((*host)->uses_gpu_stages());
    auto want = (*host)->Detect(images);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*gpu)->Detect(images);
    ASSERT_TRUE(got.ok()) << got.status();
    // The GPU letterbox may differ from OpenCV's by one grey level, which moves raw scores slightly: a
    // detection within 0.05 of the confidence threshold may appear on one side only. Every other one
    // must be on both sides.
    const float firm = gpu_options.conf + 0.05f;
    size_t total = 0, matched = 0, firm_total = 0, firm_matched = 0, back = 0, back_total = 0;
    for (size_t i = 0; i < images.size(); ++i) {
      const auto [m_all, n_all] = Matched((*want)[i], (*got)[i], 0.0f);
      const auto [m_firm, n_firm] = Matched((*want)[i], (*got)[i], firm);
      const auto [m_back, n_back] = Matched((*got)[i], (*want)[i], firm);
      total += n_all, matched += m_all, firm_total += n_firm, firm_matched += m_firm, back += m_back, back_total += n_back;
    }
    std::printf("[ INFO     ] %s: %zu of %zu host-stage detections matched by the GPU stages (%zu of %zu with score "
                ">= %.2f; %zu of %zu the other way)\n",
                path.c_str(), matched, total, firm_matched, firm_total, firm, back, back_total);
    EXPECT_GT(firm_total, 0u);
    EXPECT_EQ(firm_matched, firm_total);
    EXPECT_EQ(back, back_total);
    EXPECT_GE(static_cast<double>(matched), 0.95 * static_cast<double>(total));

    // The same frame from page-locked and device memory (with a row pitch) gives identical results.
    const Image& img = images[0];
    const int64_t row = static_cast<int64_t>(img.width) * 3, pitch = row + 64;
    void* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, img.bgr.size()), cudaSuccess);
    std::copy(img.bgr.begin(), img.bgr.end(), static_cast<uint8_t*>(pinned));
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, static_cast<size_t>(pitch) * img.height), cudaSuccess);
    ASSERT_EQ(cudaMemcpy2D(dev, pitch, img.bgr.data(), row, row, img.height, cudaMemcpyHostToDevice), cudaSuccess);
    const FrameRef frames[] = {
        {.bgr = img.bgr.data(), .width = img.width, .height = img.height},
        {.bgr = static_cast<uint8_t*>(pinned), .width = img.width, .height = img.height,
         .memory = FrameMemory::kPinnedHost},
        {.bgr = static_cast<uint8_t*>(dev), .width = img.width, .height = img.height, .pitch = pitch,
         .memory = FrameMemory::kDevice}};
    auto each = (*gpu)->DetectFrames(frames);
    ASSERT_TRUE(each.ok()) << each.status();
    for (size_t k = 1; k < 3; ++k) {
      ASSERT_EQ((*each)[k].size(), (*each)[0].size()) << "frame kind " << k;
      for (size_t j = 0; j < (*each)[0].size(); ++j) {
        EXPECT_EQ((*each)[k][j].x1, (*each)[0][j].x1);
        EXPECT_EQ((*each)[k][j].score, (*each)[0][j].score);
        EXPECT_EQ((*each)[k][j].class_id, (*each)[0][j].class_id);
      }
    }
    // DetectOnDevice leaves the same rows in device memory.
    auto on_device = (*gpu)->DetectOnDevice({frames, 1});
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    ASSERT_TRUE((*gpu)->Synchronize().ok());
    int count = -1;
    ASSERT_EQ(cudaMemcpy(&count, on_device->counts, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(static_cast<size_t>(count), (*each)[0].size());
    std::vector<float> rows(static_cast<size_t>(std::max(count, 1)) * 6);
    ASSERT_EQ(cudaMemcpy(rows.data(), on_device->rows, rows.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int j = 0; j < count; ++j) {
      EXPECT_EQ(rows[static_cast<size_t>(j) * 6 + 4], (*each)[0][static_cast<size_t>(j)].score);
    }
    // DetectFrames keeping the rows: each frame's device copy equals its host detections, row for row, and
    // outlives later batches (the pool hands out another buffer while one is held).
    {
      std::vector<DeviceRows> kept;
      auto again = (*gpu)->DetectFrames(frames, nullptr, &kept);
      ASSERT_TRUE(again.ok()) << again.status();
      ASSERT_EQ(kept.size(), 3u);
      ASSERT_TRUE((*gpu)->DetectFrames(frames).ok());  // overwrites the detector's own rows
      for (size_t k = 0; k < 3; ++k) {
        ASSERT_NE(kept[k].rows, nullptr);
        ASSERT_EQ(kept[k].count, (*again)[k].size());
        std::vector<float> copy(std::max<size_t>(kept[k].count, 1) * 6);
        ASSERT_TRUE(DownloadRows(kept[k], copy.data()).ok());
        for (size_t j = 0; j < kept[k].count; ++j) {
          const Detection& h = (*again)[k][j];
          EXPECT_EQ(copy[j * 6 + 0], h.x1);
          EXPECT_EQ(copy[j * 6 + 3], h.y2);
          EXPECT_EQ(copy[j * 6 + 4], h.score);
          EXPECT_EQ(copy[j * 6 + 5], static_cast<float>(h.class_id));
        }
      }
      const int batch = (*gpu)->model().batch;
      EXPECT_EQ(kept[0].memory == kept[2].memory, batch >= 3);  // one buffer per batch
      // The pool gives at most 64 buffers while all are held; then no rows are kept (host rows are used).
      const int first_buffers = (3 + batch - 1) / batch;
      std::vector<std::vector<DeviceRows>> held;
      for (int i = 0; i < 70; ++i) {
        std::vector<DeviceRows> k;
        ASSERT_TRUE((*gpu)->DetectFrames({frames, 1}, nullptr, &k).ok());
        EXPECT_EQ(k[0].rows != nullptr, first_buffers + i + 1 <= 64) << i;
        held.push_back(std::move(k));
      }
      held.clear();
      kept.clear();
      std::vector<DeviceRows> k;
      ASSERT_TRUE((*gpu)->DetectFrames({frames, 1}, nullptr, &k).ok());
      EXPECT_NE(k[0].rows, nullptr);  // released buffers are reused
    }
    cudaFreeHost(pinned);
    cudaFree(dev);

    // The same picture as an NV12 device frame (BT.601 limited range, as a decoder would deliver it):
    // chroma subsampling changes the pixels a little, so firm detections must survive (IoU >= 0.9 and a
    // score within 0.02 is the bar for the BGR paths; here the bar is IoU >= 0.8, score within 0.05).
    const Nv12 nv = BgrToNv12(img);
    void* planes = nullptr;
    ASSERT_EQ(cudaMalloc(&planes, nv.y.size() + nv.uv.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(planes, nv.y.data(), nv.y.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(planes) + nv.y.size(), nv.uv.data(), nv.uv.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    const FrameRef nv12{.bgr = static_cast<uint8_t*>(planes), .width = nv.width, .height = nv.height,
                        .memory = FrameMemory::kDevice, .format = PixelFormat::kNv12,
                        .uv = static_cast<uint8_t*>(planes) + nv.y.size()};
    auto from_nv12 = (*gpu)->DetectFrames({&nv12, 1});
    ASSERT_TRUE(from_nv12.ok()) << from_nv12.status();
    size_t firm_bgr = 0, kept = 0;
    for (const Detection& d : (*each)[0]) {
      if (d.score < firm) continue;
      ++firm_bgr;
      kept += std::any_of((*from_nv12)[0].begin(), (*from_nv12)[0].end(), [&](const Detection& e) {
        return e.class_id == d.class_id && IoU(d, e) >= 0.8f && std::fabs(e.score - d.score) <= 0.05f;
      });
    }
    std::printf("[ INFO     ] %s: NV12 frame keeps %zu of %zu firm detections of the BGR frame\n", path.c_str(), kept,
                firm_bgr);
    EXPECT_EQ(kept, firm_bgr);
    cudaFree(planes);
  }
}

TEST(GpuDetector, BadFramesAreRefusedByName) {
  VIGIL_REQUIRE_GPU();
  const auto models = Files("VIGIL_TEST_MODELS", VIGIL_TEST_MODELS_DIR, ".onnx", "coco");
  if (models.empty()) GTEST_SKIP() << "needs a real model (*coco*.onnx in $VIGIL_TEST_MODELS)";
  DetectorOptions options;
  options.engine.device = "cuda:0";
  auto det = Detector::Load(models[0], options);
  ASSERT_TRUE(det.ok()) << det.status();
  std::vector<uint8_t> pixels(64 * 48 * 3, 100);
  const FrameRef bad_pitch{.bgr = pixels.data(), .width = 64, .height = 48, .pitch = 100};
  auto r = (*det)->DetectFrames({&bad_pitch, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("pitch 100"), std::string::npos) << r.status();
  const FrameRef host_as_device{.bgr = pixels.data(), .width = 64, .height = 48, .memory = FrameMemory::kDevice};
  r = (*det)->DetectFrames({&host_as_device, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("frame 0"), std::string::npos) << r.status();
  const FrameRef host_nv12{.bgr = pixels.data(), .width = 64, .height = 48, .format = PixelFormat::kNv12,
                           .uv = pixels.data() + 64 * 48};
  r = (*det)->DetectFrames({&host_nv12, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NV12 frames are taken from device memory only"), std::string::npos) << r.status();
  // The detector still works after refusing them.
  const FrameRef good{.bgr = pixels.data(), .width = 64, .height = 48};
  EXPECT_TRUE((*det)->DetectFrames({&good, 1}).ok());
  // More frames than the batch in one DetectOnDevice call.
  std::vector<FrameRef> many(static_cast<size_t>((*det)->model().batch) + 1, good);
  auto d = (*det)->DetectOnDevice(many);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vigil::detect
