// Letterbox geometry against hand-computed values (Ultralytics LetterBox and YOLOX preproc
// rules), pixel placement and channel order, and mapping boxes back to the source.
#include "vigil/detect/letterbox.h"

#include <random>

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

namespace vigil::detect {
namespace {

Image Solid(int w, int h, uint8_t b, uint8_t g, uint8_t r) {
  Image im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < im.bgr.size(); i += 3) {
    im.bgr[i] = b;
    im.bgr[i + 1] = g;
    im.bgr[i + 2] = r;
  }
  return im;
}

TEST(ComputeLetterbox, UltralyticsPortrait) {
  // 810×1080 → 640²: r = min(640/1080, 640/810) = 0.5926; 810·r = 480, 1080·r = 640;
  // dw = (640−480)/2 = 80 → left = round(79.9) = 80; dh = 0 → top = round(−0.1) = 0.
  const LetterboxInfo i = ComputeLetterbox(810, 1080, 640, 640, LetterboxStyle::kUltralytics);
  EXPECT_DOUBLE_EQ(i.ratio, 640.0 / 1080.0);
  EXPECT_EQ(i.resized_width, 480);
  EXPECT_EQ(i.resized_height, 640);
  EXPECT_EQ(i.pad_left, 80);
  EXPECT_EQ(i.pad_top, 0);
  EXPECT_EQ(i.source_width, 810);
  EXPECT_EQ(i.source_height, 1080);
}

TEST(ComputeLetterbox, UltralyticsOddPaddingGoesToTheBottom) {
  // 500×332 → 640²: r = 1.28; 332·1.28 = 424.96 → 425; dh = 215/2 = 107.5 → top = round(107.4) = 107
  // (bottom would be round(107.6) = 108).
  const LetterboxInfo i = ComputeLetterbox(500, 332, 640, 640, LetterboxStyle::kUltralytics);
  EXPECT_EQ(i.resized_width, 640);
  EXPECT_EQ(i.resized_height, 425);
  EXPECT_EQ(i.pad_left, 0);
  EXPECT_EQ(i.pad_top, 107);
}

TEST(ComputeLetterbox, UltralyticsRoundsHalfToEven) {
  // 1280×5 → 640²: r = 0.5, 5·0.5 = 2.5 → Python round gives 2 (not 3); dh = 319 → top = 319.
  const LetterboxInfo i = ComputeLetterbox(1280, 5, 640, 640, LetterboxStyle::kUltralytics);
  EXPECT_EQ(i.resized_height, 2);
  EXPECT_EQ(i.pad_top, 319);
}

TEST(ComputeLetterbox, YoloxTruncatesAndStaysTopLeft) {
  // 768×576 → 416²: r = min(416/576, 416/768) = 0.541667; 768·r = 416, 576·r = 312; no pad offsets.
  const LetterboxInfo i = ComputeLetterbox(768, 576, 416, 416, LetterboxStyle::kYolox);
  EXPECT_DOUBLE_EQ(i.ratio, 416.0 / 768.0);
  EXPECT_EQ(i.resized_width, 416);
  EXPECT_EQ(i.resized_height, 312);
  EXPECT_EQ(i.pad_left, 0);
  EXPECT_EQ(i.pad_top, 0);
  // 600×451 → 416²: r = 416/600 = 0.69333; 451·r = 312.69 → YOLOX truncates to 312, Ultralytics rounds to 313.
  const LetterboxInfo k = ComputeLetterbox(600, 451, 416, 416, LetterboxStyle::kYolox);
  const LetterboxInfo ku = ComputeLetterbox(600, 451, 416, 416, LetterboxStyle::kUltralytics);
  EXPECT_EQ(k.resized_height, 312);   // 451·0.69333 = 312.69 truncated
  EXPECT_EQ(ku.resized_height, 313);  // rounded
  EXPECT_EQ(ku.pad_top, 51);          // (416−313)/2 = 51.5 → round(51.4) = 51
}

TEST(Letterbox, UltralyticsPixelsAreRgbOver255WithGreyPadding) {
  const Image im = Solid(810, 1080, 10, 20, 30);
  Tensor t(DType::kFloat32, {2, 3, 640, 640});
  auto info = Letterbox(im, LetterboxStyle::kUltralytics, t, 1);
  ASSERT_TRUE(info.ok()) << info.status();
  const float* slot0 = t.data<float>();
  const float* slot1 = slot0 + 3 * 640 * 640;
  for (int64_t i = 0; i < 3 * 640 * 640; ++i) ASSERT_EQ(slot0[i], 0.0f) << "slot 0 must stay untouched";
  const auto at = [&](int c, int y, int x) { return slot1[(c * 640 + y) * 640 + x]; };
  for (int y : {0, 320, 639}) {
    EXPECT_FLOAT_EQ(at(0, y, 79), 114.0f / 255) << y;  // left padding
    EXPECT_FLOAT_EQ(at(0, y, 80), 30.0f / 255) << y;   // plane 0 = red
    EXPECT_FLOAT_EQ(at(1, y, 300), 20.0f / 255) << y;
    EXPECT_FLOAT_EQ(at(2, y, 559), 10.0f / 255) << y;  // plane 2 = blue, last image column
    EXPECT_FLOAT_EQ(at(2, y, 560), 114.0f / 255) << y; // right padding
  }
}

TEST(Letterbox, YoloxPixelsAreBgrZeroTo255AtTopLeft) {
  const Image im = Solid(768, 576, 10, 20, 30);
  Tensor t(DType::kFloat32, {1, 3, 416, 416});
  auto info = Letterbox(im, LetterboxStyle::kYolox, t, 0);
  ASSERT_TRUE(info.ok()) << info.status();
  const auto at = [&](int c, int y, int x) { return t.data<float>()[(c * 416 + y) * 416 + x]; };
  EXPECT_FLOAT_EQ(at(0, 0, 0), 10.0f);  // plane 0 = blue
  EXPECT_FLOAT_EQ(at(2, 311, 415), 30.0f);
  EXPECT_FLOAT_EQ(at(1, 312, 0), 114.0f);  // padding below the image
  EXPECT_FLOAT_EQ(at(1, 415, 415), 114.0f);
}

TEST(Letterbox, ContentMatchesAResizeOfTheSourceAndSkipsResizeWhenSizesMatch) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Image im{300, 200, std::vector<uint8_t>(300 * 200 * 3)};
  for (auto& v : im.bgr) v = static_cast<uint8_t>(rng() & 0xFF);

  // 300×200 → 640²: r = 2.1333; 640×427 (426.67 rounded); dh = 213/2 = 106.5 → top = 106.
  Tensor t(DType::kFloat32, {1, 3, 640, 640});
  auto info = Letterbox(im, LetterboxStyle::kUltralytics, t, 0);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->resized_height, 427);
  ASSERT_EQ(info->pad_top, 106);
  cv::Mat expected;
  cv::resize(cv::Mat(200, 300, CV_8UC3, im.bgr.data()), expected, cv::Size(640, 427), 0, 0, cv::INTER_LINEAR);
  for (int y = 0; y < 427; y += 7) {
    for (int x = 0; x < 640; x += 5) {
      const cv::Vec3b px = expected.at<cv::Vec3b>(y, x);
      for (int c = 0; c < 3; ++c) {
        ASSERT_FLOAT_EQ(t.data<float>()[(c * 640 + y + 106) * 640 + x], px[2 - c] / 255.0f) << x << "," << y;
      }
    }
  }

  // Same size: the pixels are copied unchanged (YOLOX: BGR order, 0..255).
  Tensor same(DType::kFloat32, {1, 3, 200, 300});
  auto s = Letterbox(im, LetterboxStyle::kYolox, same, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->ratio, 1.0);
  for (int y = 0; y < 200; ++y) {
    for (int x = 0; x < 300; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(same.data<float>()[(c * 200 + y) * 300 + x], im.bgr[(y * 300 + x) * 3 + c]);
      }
    }
  }
}

TEST(Letterbox, Float16AndGrayInputs) {
  const Image im = Solid(64, 32, 10, 20, 30);
  Tensor half(DType::kFloat16, {1, 3, 64, 64});
  ASSERT_TRUE(Letterbox(im, LetterboxStyle::kUltralytics, half, 0).ok());
  // 64×32 → 64²: top = round(16 − 0.1) = 16.
  EXPECT_EQ(half.data<uint16_t>()[0], FloatToHalf(114.0f / 255));
  EXPECT_EQ(half.data<uint16_t>()[16 * 64], FloatToHalf(30.0f / 255));

  // BGR (10, 20, 30) → gray 0.114·10 + 0.587·20 + 0.299·30 = 21.85 → 22.
  Tensor gray(DType::kFloat32, {1, 1, 64, 64});
  ASSERT_TRUE(Letterbox(im, LetterboxStyle::kUltralytics, gray, 0).ok());
  EXPECT_FLOAT_EQ(gray.data<float>()[20 * 64 + 10], 22.0f / 255);
  EXPECT_FLOAT_EQ(gray.data<float>()[0], 114.0f / 255);
}

TEST(Letterbox, RejectsBadTargetsAndImages) {
  const Image im = Solid(8, 8, 1, 2, 3);
  Tensor nhwc(DType::kFloat32, {1, 64, 64, 3});
  EXPECT_EQ(Letterbox(im, LetterboxStyle::kUltralytics, nhwc, 0).status().code(), absl::StatusCode::kInvalidArgument);
  Tensor ints(DType::kUInt8, {1, 3, 64, 64});
  EXPECT_EQ(Letterbox(im, LetterboxStyle::kUltralytics, ints, 0).status().code(), absl::StatusCode::kInvalidArgument);
  Tensor ok(DType::kFloat32, {2, 3, 64, 64});
  EXPECT_EQ(Letterbox(im, LetterboxStyle::kUltralytics, ok, 2).status().code(), absl::StatusCode::kInvalidArgument);
  Image broken = im;
  broken.bgr.pop_back();
  EXPECT_EQ(Letterbox(broken, LetterboxStyle::kUltralytics, ok, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Letterbox(Image{}, LetterboxStyle::kUltralytics, ok, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MapToSource, RoundTripAndClipping) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ux(0, 810), uy(0, 1080);
  for (auto style : {LetterboxStyle::kUltralytics, LetterboxStyle::kYolox}) {
    const LetterboxInfo info = ComputeLetterbox(810, 1080, 640, 640, style);
    for (int n = 0; n < 100; ++n) {
      float xa = ux(rng), xb = ux(rng), ya = uy(rng), yb = uy(rng);
      const Detection src{std::min(xa, xb), std::min(ya, yb), std::max(xa, xb), std::max(ya, yb), 0.5f, 3};
      const auto fwd = [&](float v, int pad) { return static_cast<float>(v * info.ratio + pad); };
      Detection d{fwd(src.x1, info.pad_left), fwd(src.y1, info.pad_top), fwd(src.x2, info.pad_left),
                  fwd(src.y2, info.pad_top), src.score, src.class_id};
      MapToSource(info, {&d, 1});
      EXPECT_NEAR(d.x1, src.x1, 1e-3);
      EXPECT_NEAR(d.y1, src.y1, 1e-3);
      EXPECT_NEAR(d.x2, src.x2, 1e-3);
      EXPECT_NEAR(d.y2, src.y2, 1e-3);
    }
  }
  // A box reaching into the padding is clipped to the image: Ultralytics, pad_left 80, r = 640/1080.
  const LetterboxInfo info = ComputeLetterbox(810, 1080, 640, 640, LetterboxStyle::kUltralytics);
  Detection d{40, -5, 600, 700, 0.9f, 0};
  MapToSource(info, {&d, 1});
  EXPECT_FLOAT_EQ(d.x1, 0);
  EXPECT_FLOAT_EQ(d.y1, 0);
  EXPECT_FLOAT_EQ(d.x2, 810);
  EXPECT_FLOAT_EQ(d.y2, 1080);
  Detection inside{80 + 48, 64, 80 + 96, 128, 0.9f, 0};  // ×1080/640 = 1.6875
  MapToSource(info, {&inside, 1});
  EXPECT_FLOAT_EQ(inside.x1, 81);
  EXPECT_FLOAT_EQ(inside.y1, 108);
  EXPECT_FLOAT_EQ(inside.x2, 162);
  EXPECT_FLOAT_EQ(inside.y2, 216);
}

}  // namespace
}  // namespace vigil::detect
