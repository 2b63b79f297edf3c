// Decoding of every output model on small hand-built tensors (64×64 input: cells = 8·8 + 4·4 +
// 2·2 = 84 for strides 8, 16, 32).
#include "vigil/detect/decode.h"

#include <cmath>

#include <gtest/gtest.h>

namespace vigil::detect {
namespace {

StatusOr<ModelInfo> Describe(Shape input, Shape output) {
  const std::vector<infer::TensorInfo> in = {{"images", DType::kFloat32, std::move(input)}};
  const std::vector<infer::TensorInfo> out = {{"output0", DType::kFloat32, std::move(output)}};
  return DescribeModel(infer::ModelSummary{}, in, out);
}

// Writes one image's box (fields in output order) into the [B, 4+nc, N] (channels_first) or
// [B, N, 5+nc] tensor `t` at image `b`, box `i`.
void SetBox(Tensor& t, int64_t b, int64_t i, const std::vector<float>& fields, bool channels_first) {
  const int64_t d1 = t.dim(1), d2 = t.dim(2);
  for (size_t f = 0; f < fields.size(); ++f) {
    const int64_t k = static_cast<int64_t>(f);
    t.data<float>()[b * d1 * d2 + (channels_first ? k * d2 + i : i * d2 + k)] = fields[f];
  }
}

TEST(DecodeOutput, UltralyticsAnchorFree) {
  auto model = Describe({2, 3, 64, 64}, {2, 6, 84});
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor out(DType::kFloat32, {2, 6, 84});
  SetBox(out, 1, 5, {20, 30, 10, 8, 0.1f, 0.9f}, true);
  SetBox(out, 1, 7, {40, 40, 4, 6, 0.3f, 0.2f}, true);
  SetBox(out, 0, 9, {1, 1, 1, 1, 0.99f, 0}, true);  // the other image
  auto d = DecodeOutput(out, 1, *model, 0.25f, {});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_FLOAT_EQ((*d)[0].x1, 15);
  EXPECT_FLOAT_EQ((*d)[0].y1, 26);
  EXPECT_FLOAT_EQ((*d)[0].x2, 25);
  EXPECT_FLOAT_EQ((*d)[0].y2, 34);
  EXPECT_FLOAT_EQ((*d)[0].score, 0.9f);
  EXPECT_EQ((*d)[0].class_id, 1);
  EXPECT_FLOAT_EQ((*d)[1].x1, 38);
  EXPECT_FLOAT_EQ((*d)[1].y2, 43);
  EXPECT_FLOAT_EQ((*d)[1].score, 0.3f);
  EXPECT_EQ((*d)[1].class_id, 0);

  EXPECT_EQ(DecodeOutput(out, 1, *model, 0.3f, {})->size(), 1u);  // score must exceed conf
  // The class filter applies to the best class: box 7 (best class 0) is dropped, not re-labelled.
  const std::vector<int> only1 = {1};
  auto f = DecodeOutput(out, 1, *model, 0.1f, only1);
  ASSERT_EQ(f->size(), 1u);
  EXPECT_EQ((*f)[0].class_id, 1);

  // float16 output gives the same boxes (values exactly representable in half precision).
  Tensor half(DType::kFloat16, {2, 6, 84});
  for (int64_t i = 0; i < out.numel(); ++i) half.data<uint16_t>()[i] = FloatToHalf(out.data<float>()[i]);
  auto h = DecodeOutput(half, 1, *model, 0.25f, {});
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_FLOAT_EQ((*h)[0].x2, 25);
  EXPECT_NEAR((*h)[0].score, 0.9f, 1e-3);

  EXPECT_FALSE(DecodeOutput(out, 2, *model, 0.25f, {}).ok());  // index out of range
  EXPECT_FALSE(DecodeOutput(Tensor(DType::kFloat32, {2, 6, 83}), 0, *model, 0.25f, {}).ok());
}

TEST(DecodeOutput, YoloV5MultipliesObjectness) {
  auto model = Describe({1, 3, 64, 64}, {1, 252, 7});
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor out(DType::kFloat32, {1, 252, 7});
  SetBox(out, 0, 200, {32, 32, 16, 8, 0.5f, 0.6f, 0.8f}, false);  // 0.5 · 0.8 = 0.4, class 1
  SetBox(out, 0, 100, {10, 10, 4, 4, 0.3f, 0.9f, 0.1f}, false);   // 0.27
  SetBox(out, 0, 50, {10, 10, 4, 4, 0.2f, 1.0f, 0.0f}, false);    // 0.2 < 0.25
  auto d = DecodeOutput(out, 0, *model, 0.25f, {});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_FLOAT_EQ((*d)[0].score, 0.3f * 0.9f);
  EXPECT_EQ((*d)[0].class_id, 0);
  EXPECT_FLOAT_EQ((*d)[1].x1, 24);
  EXPECT_FLOAT_EQ((*d)[1].y1, 28);
  EXPECT_FLOAT_EQ((*d)[1].x2, 40);
  EXPECT_FLOAT_EQ((*d)[1].y2, 36);
  EXPECT_FLOAT_EQ((*d)[1].score, 0.5f * 0.8f);
  EXPECT_EQ((*d)[1].class_id, 1);
}

TEST(DecodeOutput, YoloxRawGridAndStride) {
  // 64 high × 96 wide: level 0 (stride 8) 8×12 = 96 cells, level 1 (16) 4×6 = 24, level 2 (32) 2×3 = 6.
  auto model = Describe({1, 3, 64, 96}, {1, 126, 7});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->raw_boxes);
  Tensor out(DType::kFloat32, {1, 126, 7});
  // Box 96 + 7: level 1, cell 7 → x = 7 % 6 = 1, y = 7 / 6 = 1. cx = (0.5 + 1)·16 = 24,
  // cy = (0.25 + 1)·16 = 20, w = e^ln2·16 = 32, h = e^0·16 = 16 → [8, 12, 40, 28].
  SetBox(out, 0, 103, {0.5f, 0.25f, std::log(2.0f), 0, 0.9f, 0.5f, 0.2f}, false);
  // Box 125 (the last): level 2, cell 5 → x = 2, y = 1; p = 0 → cx = 64, cy = 32, w = h = 32.
  SetBox(out, 0, 125, {0, 0, 0, 0, 1.0f, 0.1f, 0.6f}, false);
  // Box 13: level 0, cell 13 → x = 1, y = 1; p = (−0.5, 0.5, 0, ln 0.5) → cx = 4, cy = 12, w = 8, h = 4.
  SetBox(out, 0, 13, {-0.5f, 0.5f, 0, std::log(0.5f), 0.5f, 0.8f, 0}, false);
  auto d = DecodeOutput(out, 0, *model, 0.25f, {});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  const auto expect_box = [](const Detection& b, float x1, float y1, float x2, float y2, float score, int cls) {
    EXPECT_NEAR(b.x1, x1, 1e-4);
    EXPECT_NEAR(b.y1, y1, 1e-4);
    EXPECT_NEAR(b.x2, x2, 1e-4);
    EXPECT_NEAR(b.y2, y2, 1e-4);
    EXPECT_FLOAT_EQ(b.score, score);
    EXPECT_EQ(b.class_id, cls);
  };
  expect_box((*d)[0], 0, 10, 8, 14, 0.5f * 0.8f, 0);
  expect_box((*d)[1], 8, 12, 40, 28, 0.9f * 0.5f, 0);
  expect_box((*d)[2], 48, 16, 80, 48, 0.6f, 1);
}

TEST(DecodeOutput, End2EndThresholdOnly) {
  auto model = Describe({1, 3, 640, 640}, {1, 300, 6});
  ASSERT_TRUE(model.ok()) << model.status();
  Tensor out(DType::kFloat32, {1, 300, 6});
  SetBox(out, 0, 0, {10, 20, 110, 220, 0.9f, 16}, false);
  SetBox(out, 0, 1, {12, 22, 112, 222, 0.8f, 16}, false);  // overlaps box 0: no NMS, both kept
  SetBox(out, 0, 2, {0, 0, 5, 5, 0.2f, 2}, false);
  auto d = DecodeOutput(out, 0, *model, 0.25f, {});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_FLOAT_EQ((*d)[1].x1, 12);
  EXPECT_FLOAT_EQ((*d)[1].y2, 222);
  EXPECT_EQ((*d)[1].class_id, 16);
  const std::vector<int> cars = {2};
  EXPECT_EQ(DecodeOutput(out, 0, *model, 0.1f, cars)->size(), 1u);
}

}  // namespace
}  // namespace vigil::detect
