#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "vigil/common/npy.h"
#include "vigil/common/tensor.h"

namespace vigil {
namespace {

TEST(HalfTest, KnownBitPatterns) {
  // IEEE 754 binary16 reference values.
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);           // largest finite half
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);           // rounds to +inf
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001);     // smallest subnormal, 2^-24
  EXPECT_EQ(FloatToHalf(2.9802322e-08f), 0x0000);     // exactly half of it: ties to even (0)
  EXPECT_EQ(FloatToHalf(1.0009765625f), 0x3c01);      // 1 + 2^-10
  EXPECT_EQ(FloatToHalf(1.00048828125f), 0x3c00);     // 1 + 2^-11: tie, rounds to even
  EXPECT_EQ(FloatToHalf(1.00146484375f), 0x3c02);     // 1 + 3·2^-11: tie, rounds to even (up)
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.33325195f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x0001), 5.9604645e-08f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x03ff), 6.0975552e-05f);  // largest subnormal
  EXPECT_TRUE(std::isinf(HalfToFloat(0xfc00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
}

TEST(HalfTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(HalfTest, RandomFloatsRoundToNearest) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  for (int i = 0; i < 20000; ++i) {
    const float f = dist(rng) * std::pow(2.0f, static_cast<float>(static_cast<int>(rng() % 40) - 30));
    const uint16_t h = FloatToHalf(f);
    const float back = HalfToFloat(h);
    if (std::isinf(back)) {
      ASSERT_GE(std::fabs(f), 65504.0f);
      continue;
    }
    // No other half is strictly closer to f than the chosen one.
    const float up = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float down = HalfToFloat(static_cast<uint16_t>(h - 1));
    ASSERT_LE(std::fabs(back - f), std::fabs(up - f) + 0.0f) << f;
    if ((h & 0x7fff) != 0) {
      ASSERT_LE(std::fabs(back - f), std::fabs(down - f)) << f;
    }
  }
}

TEST(TensorTest, ShapesAndConversions) {
  Tensor t = Tensor::FromVector<int64_t>({1, -2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_EQ(ShapeToString(t.shape()), "[2,3]");
  Tensor r = t.Reshaped({3, 2});
  EXPECT_EQ(r.data<int64_t>(), t.data<int64_t>());  // shares storage
  Tensor c = t.Clone();
  c.data<int64_t>()[0] = 42;
  EXPECT_EQ(t.data<int64_t>()[0], 1);
  EXPECT_EQ(t.ToFloat32().data<float>()[1], -2.0f);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(Tensor::Scalar<float>(2.5f).rank(), 0);
  EXPECT_FALSE(Tensor().defined());
}

TEST(NpyTest, RoundTripAndErrors) {
  const auto dir = std::filesystem::temp_directory_path() / ("vigil_npy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Tensor t(DType::kFloat32, {2, 3, 5});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i) * 0.5f - 3.0f;
  const std::string path = (dir / "a.npy").string();
  ASSERT_TRUE(WriteNpy(path, t).ok());
  StatusOr<Tensor> back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape(), t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(back->data<float>()[i], t.data<float>()[i]);
  // rank 1 keeps the trailing comma form "(5,)".
  ASSERT_TRUE(WriteNpy(path, Tensor::FromVector<int64_t>({1, 2, 3, 4, 5}, {5})).ok());
  back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape(), Shape{5});
  EXPECT_EQ(back->data<int64_t>()[4], 5);

  EXPECT_EQ(ReadNpy((dir / "missing.npy").string()).status().code(), absl::StatusCode::kNotFound);
  std::FILE* f = std::fopen((dir / "junk.npy").c_str(), "wb");
  std::fputs("not numpy at all", f);
  std::fclose(f);
  StatusOr<Tensor> junk = ReadNpy((dir / "junk.npy").string());
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(junk.status().message().find("junk.npy"), std::string_view::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vigil
