// Reference kernels of ops/matrix.cc and ops/quant.cc: MatMul, Gemm, MatMulInteger,
// QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, ConvInteger — hand-computed cases from
// the ONNX spec, randomized checks against naive loops in double, and error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Node MakeNode(const std::string& op, const std::vector<Tensor>& inputs, size_t outputs,
              std::map<std::string, AttrValue> attrs) {
  Node n;
  n.name = "n_" + op;
  n.op_type = op;
  for (size_t i = 0; i < inputs.size(); ++i)
    n.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
  for (size_t i = 0; i < outputs; ++i) n.outputs.push_back("y" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

StatusOr<std::vector<Tensor>> RunOp(const std::string& op, const std::vector<Tensor>& inputs,
                                    int64_t opset = 13, std::map<std::string, AttrValue> attrs = {},
                                    size_t outputs = 1) {
  std::vector<Tensor> out;
  VIGIL_RETURN_IF_ERROR(RunReference(MakeNode(op, inputs, outputs, std::move(attrs)), opset, inputs, &out));
  return out;
}

Tensor Run1(const std::string& op, const std::vector<Tensor>& inputs, int64_t opset = 13,
            std::map<std::string, AttrValue> attrs = {}) {
  auto out = RunOp(op, inputs, opset, std::move(attrs));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0] : Tensor(DType::kFloat32, {0});
}

template <typename T>
Tensor T_(std::vector<T> v, Shape s) {
  return Tensor::FromVector<T>(v, std::move(s));
}
Tensor F32(std::vector<float> v, Shape s) { return T_<float>(std::move(v), std::move(s)); }
template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// ---- MatMul / Gemm -----------------------------------------------------------------------------

TEST(OpsMatrix, MatMul2DAnd1DPromotion) {
  const Tensor a = F32({1, 2, 3, 4}, {2, 2}), b = F32({5, 6, 7, 8}, {2, 2});
  EXPECT_THAT(Values<float>(Run1("MatMul", {a, b})), ElementsAre(19, 22, 43, 50));
  // [K]·[K,N] → [N]; [M,K]·[K] → [M]; [K]·[K] → scalar.
  const Tensor v = F32({1, -1}, {2});
  Tensor y = Run1("MatMul", {v, b});
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_THAT(Values<float>(y), ElementsAre(-2, -2));
  y = Run1("MatMul", {a, v});
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_THAT(Values<float>(y), ElementsAre(-1, -1));
  y = Run1("MatMul", {v, F32({3, 4}, {2})});
  EXPECT_EQ(y.shape(), (Shape{}));
  EXPECT_THAT(Values<float>(y), ElementsAre(-1));
  EXPECT_THAT(Values<int64_t>(Run1("MatMul", {T_<int64_t>({1, 2}, {1, 2}), T_<int64_t>({3, 4}, {2, 1})})),
              ElementsAre(11));
}

TEST(OpsMatrix, MatMulBatchedBroadcast) {
  // A [2,1,1,2] (rows [1,2] and [3,4]) × B [3,2,1] (columns [5,6], [7,8], [9,10]) → [2,3,1,1].
  const Tensor y = Run1("MatMul", {F32({1, 2, 3, 4}, {2, 1, 1, 2}), F32({5, 6, 7, 8, 9, 10}, {3, 2, 1})});
  EXPECT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
  EXPECT_THAT(Values<float>(y), ElementsAre(17, 23, 29, 39, 53, 67));
}

TEST(OpsMatrix, GemmTransBWithBroadcastC) {
  // Y = 2·A·Bᵀ + 0.5·C with A [2,3], B [4,3], C [4].
  const Tensor a = F32({1, 0, 2, 0, 1, 0}, {2, 3});
  const Tensor b = F32({1, 1, 1, 0, 1, 0, 2, 0, 0, 0, 0, 1}, {4, 3});
  const Tensor c = F32({10, 20, 30, 40}, {4});
  const Tensor y = Run1("Gemm", {a, b, c}, 13, {{"transB", int64_t{1}}, {"alpha", 2.f}, {"beta", 0.5f}});
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_THAT(Values<float>(y), ElementsAre(11, 10, 19, 24, 7, 12, 15, 20));
  // transA, no C (optional from opset 11): Aᵀ [3,2] · [2,1].
  EXPECT_THAT(Values<float>(Run1("Gemm", {a, F32({1, 2}, {2, 1})}, 11, {{"transA", int64_t{1}}})),
              ElementsAre(1, 2, 2));
  // C of shape [2,1] broadcasts along columns.
  EXPECT_THAT(
      Values<float>(Run1("Gemm", {F32({1, 2}, {2, 1}), F32({3, 4}, {1, 2}), F32({100, 200}, {2, 1})})),
      ElementsAre(103, 104, 206, 208));
  EXPECT_FALSE(
      RunOp("Gemm", {a, F32({1, 2}, {2, 1})}, 9, {{"transA", int64_t{1}}}).ok());  // C required before 11
}

TEST(OpsMatrix, RandomMatMulAndGemmMatchNaiveDouble) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.f, 1.f);
  auto random = [&](Shape s) {
    Tensor t(DType::kFloat32, std::move(s));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value(rng);
    return t;
  };
  for (int iter = 0; iter < 20; ++iter) {
    const int64_t m = 1 + rng() % 9, k = 1 + rng() % 40, n = 1 + rng() % 9, b0 = 1 + rng() % 3;
    // A [b0,1,m,k] × B [2,k,n] → [b0,2,m,n] (batch broadcast both ways).
    const Tensor a = random({b0, 1, m, k}), b = random({2, k, n});
    SCOPED_TRACE(ShapeToString(a.shape()) + " x " + ShapeToString(b.shape()));
    const Tensor y = Run1("MatMul", {a, b});
    ASSERT_EQ(y.shape(), (Shape{b0, 2, m, n}));
    for (int64_t i0 = 0; i0 < b0; ++i0) {
      for (int64_t i1 = 0; i1 < 2; ++i1) {
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) {
              s += static_cast<double>(a.data<float>()[(i0 * m + i) * k + p]) *
                   b.data<float>()[(i1 * k + p) * n + j];
            }
            ASSERT_NEAR(y.data<float>()[((i0 * 2 + i1) * m + i) * n + j], s, 1e-5);
          }
        }
      }
    }
    // Gemm with transA and transB: Y = 0.5·Aᵀ·Bᵀ − C, A [k,m], B [n,k], C [m,n].
    const Tensor ga = random({k, m}), gb = random({n, k}), gc = random({m, n});
    const Tensor g = Run1("Gemm", {ga, gb, gc}, 13,
                          {{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.5f}, {"beta", -1.f}});
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += static_cast<double>(ga.data<float>()[p * m + i]) * gb.data<float>()[j * k + p];
        ASSERT_NEAR(g.data<float>()[i * n + j], 0.5 * s - gc.data<float>()[i * n + j], 1e-5);
      }
    }
  }
}

TEST(OpsMatrix, MatMulIntegerWithZeroPoints) {
  // (A − 1) · (B − [5,6]) = [[0,1],[2,3]] · [[0,0],[2,2]] = [[2,2],[6,6]].
  const Tensor a = T_<uint8_t>({1, 2, 3, 4}, {2, 2}), b = T_<uint8_t>({5, 6, 7, 8}, {2, 2});
  Tensor y = Run1("MatMulInteger", {a, b, T_<uint8_t>({1}, {}), T_<uint8_t>({5, 6}, {2})}, 10);
  EXPECT_EQ(y.dtype(), DType::kInt32);
  EXPECT_THAT(Values<int32_t>(y), ElementsAre(2, 2, 6, 6));
  // int8 with a per-row zero point for A ([1, -1]) and none for B.
  y = Run1(
      "MatMulInteger",
      {T_<int8_t>({-128, 127, 0, -1}, {2, 2}), T_<int8_t>({1, 2, 3, 4}, {2, 2}), T_<int8_t>({1, -1}, {2})},
      10);
  // rows: [-129, 126] and [1, 0]: [-129+378, -258+504] = [249, 246]; [1, 2].
  EXPECT_THAT(Values<int32_t>(y), ElementsAre(249, 246, 1, 2));
  EXPECT_EQ(RunOp("MatMulInteger", {a, F32({1, 2, 3, 4}, {2, 2})}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OpsMatrix, Errors) {
  auto r = RunOp("MatMul", {F32({1, 2, 3, 4, 5, 6}, {2, 3}), F32({1, 2, 3, 4}, {2, 2})});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("node 'n_MatMul' (MatMul): inner dimensions of [2,3] and [2,2]"));
  r = RunOp("MatMul", {F32({}, {2, 1, 3}), F32({}, {3, 3, 1})});
  EXPECT_THAT(r.status().message(), HasSubstr("batch dimensions of [2,1,3] and [3,3,1] do not broadcast"));
  EXPECT_FALSE(RunOp("MatMul", {F32({1}, {}), F32({1}, {1})}).ok());                   // rank 0
  EXPECT_FALSE(RunOp("Gemm", {F32({}, {2, 3}), F32({}, {2, 3})}).ok());                // K mismatch
  EXPECT_FALSE(RunOp("Gemm", {F32({}, {2, 3}), F32({}, {3, 2}), F32({}, {3})}).ok());  // C shape
  EXPECT_FALSE(RunOp("Gemm", {F32({}, {1, 2, 3}), F32({}, {3, 2})}).ok());             // rank 3
  EXPECT_FALSE(RunOp("MatMul", {F32({}, {2, 2}), T_<int32_t>({}, {2, 2})}).ok());      // dtypes
}

// ---- Quantization ------------------------------------------------------------------------------

TEST(OpsQuant, QuantizeLinearRoundsHalfToEvenAndSaturates) {
  // x / 0.5 = [0, 2.5, -0.5, 1.5, 400, -200] → round-even [0, 2, -0, 2, 400, -200] + 10, saturated.
  const Tensor x = F32({0, 1.25f, -0.25f, 0.75f, 200, -100}, {6});
  const Tensor y = Run1("QuantizeLinear", {x, F32({0.5f}, {}), T_<uint8_t>({10}, {})});
  EXPECT_EQ(y.dtype(), DType::kUInt8);
  EXPECT_THAT(Values<uint8_t>(y), ElementsAre(10, 12, 10, 12, 255, 0));
  // No zero point: uint8 with zero point 0.
  EXPECT_THAT(Values<uint8_t>(Run1("QuantizeLinear", {F32({-1, 3.5f}, {2}), F32({1}, {})}, 10)),
              ElementsAre(0, 4));
  // int8 per axis 0: scales [1, 2], zero points [0, -1].
  const Tensor q =
      Run1("QuantizeLinear", {F32({1.5f, -130, 3, 5}, {2, 2}), F32({1, 2}, {2}), T_<int8_t>({0, -1}, {2})},
           13, {{"axis", int64_t{0}}});
  EXPECT_EQ(q.dtype(), DType::kInt8);
  EXPECT_THAT(Values<int8_t>(q), ElementsAre(2, -128, 1, 1));
}

TEST(OpsQuant, DequantizeLinearPerTensorAndPerAxis) {
  EXPECT_THAT(Values<float>(Run1("DequantizeLinear", {T_<int8_t>({-128, 127}, {2}), F32({0.25f}, {})})),
              ElementsAre(-32, 31.75f));
  // x [2,3] uint8 along axis 1: scales [0.5, 1, 2], zero points [1, 2, 3].
  const Tensor y = Run1("DequantizeLinear", {T_<uint8_t>({1, 2, 3, 5, 0, 10}, {2, 3}), F32({0.5f, 1, 2}, {3}),
                                             T_<uint8_t>({1, 2, 3}, {3})});
  EXPECT_THAT(Values<float>(y), ElementsAre(0, 0, 0, 2, -2, 14));
  // Negative axis, [2,2,2] along axis -1 (= 2): scales [1, 10].
  EXPECT_THAT(Values<float>(Run1("DequantizeLinear",
                                 {T_<uint8_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}), F32({1, 10}, {2})}, 13,
                                 {{"axis", int64_t{-1}}})),
              ElementsAre(1, 20, 3, 40, 5, 60, 7, 80));
  EXPECT_THAT(Values<float>(Run1("DequantizeLinear", {T_<int32_t>({-3, 4}, {2}), F32({0.5f}, {})})),
              ElementsAre(-1.5f, 2));
}

TEST(OpsQuant, DynamicQuantizeLinearKnownVector) {
  // min −1, max 2.984375: scale = 3.984375 / 255 = 1/64 (exact), zero point = round(1 · 64) = 64;
  // x / scale = [−64, 0, 191, 32, 32.5, 1.5, −0.5] → round-even + 64 = [0, 64, 255, 96, 96, 66, 64].
  auto out = RunOp("DynamicQuantizeLinear",
                   {F32({-1, 0, 2.984375f, 0.5f, 0.5078125f, 0.0234375f, -0.0078125f}, {7})}, 11, {}, 3);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(Values<uint8_t>((*out)[0]), ElementsAre(0, 64, 255, 96, 96, 66, 64));
  EXPECT_EQ((*out)[1].shape(), (Shape{}));
  EXPECT_EQ((*out)[1].data<float>()[0], 0.015625f);
  EXPECT_EQ((*out)[2].data<uint8_t>()[0], 64);
  // An odd zero point: rounding happens before it is added. lo = −65/64, hi = 190/64 → scale 1/64,
  // zero point 65; 32.5 rounds to 32 (+65 = 97), not 97.5 → 98.
  out = RunOp("DynamicQuantizeLinear", {F32({-1.015625f, 2.96875f, 0.5078125f}, {3})}, 11, {}, 3);
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(Values<uint8_t>((*out)[0]), ElementsAre(0, 255, 97));
  EXPECT_EQ((*out)[2].data<uint8_t>()[0], 65);
  // All positive: min is taken as 0, so the zero point is 0; max 51 → scale 0.2.
  out = RunOp("DynamicQuantizeLinear", {F32({0.2f, 51, 25.5f}, {3})}, 11, {}, 3);
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(Values<uint8_t>((*out)[0]), ElementsAre(1, 255, 128));  // 127.5 → 128 (even)
  EXPECT_FLOAT_EQ((*out)[1].data<float>()[0], 0.2f);
  EXPECT_EQ((*out)[2].data<uint8_t>()[0], 0);
  // All zeros: scale falls back to 1/255 (ONNX reference), everything quantizes to 0.
  out = RunOp("DynamicQuantizeLinear", {F32({0, 0}, {2})}, 11, {}, 3);
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(Values<uint8_t>((*out)[0]), ElementsAre(0, 0));
  EXPECT_FLOAT_EQ((*out)[1].data<float>()[0], 1.f / 255);
}

// vigil DynamicFakeQuantize = DynamicQuantizeLinear, then (q − zp) · scale: the known vector above gives
// (q − 64) / 64 = [−1, 0, 2.984375, 0.5, 0.5, 0.03125, 0] (32.5 rounds to 32, 1.5 to 2, −0.5 to −0).
TEST(OpsQuant, DynamicFakeQuantizeIsDynamicQuantizeLinearDequantized) {
  Node n = MakeNode("DynamicFakeQuantize", {F32({0}, {1})}, 1, {});
  n.domain = "vigil";
  std::vector<Tensor> out;
  const Tensor x = F32({-1, 0, 2.984375f, 0.5f, 0.5078125f, 0.0234375f, -0.0078125f}, {7});
  ASSERT_TRUE(RunReference(n, 1, {x}, &out).ok());
  EXPECT_THAT(Values<float>(out[0]), ElementsAre(-1.f, 0.f, 2.984375f, 0.5f, 0.5f, 0.03125f, 0.f));
  // Random tensors: equal, value by value, to DequantizeLinear(DynamicQuantizeLinear(x)); float16 too.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-3.f, 7.f);
  std::vector<float> v(1000);
  for (float& e : v) e = dist(rng);
  const Tensor r = F32(v, {10, 100});
  auto q = RunOp("DynamicQuantizeLinear", {r}, 11, {}, 3);
  ASSERT_TRUE(q.ok());
  const Tensor dq = Run1("DequantizeLinear", {(*q)[0], (*q)[1], (*q)[2]}, 13);
  ASSERT_TRUE(RunReference(n, 1, {r}, &out).ok());
  EXPECT_EQ(Values<float>(out[0]), Values<float>(dq));
  Tensor h(DType::kFloat16, r.shape());
  for (int64_t i = 0; i < r.numel(); ++i) h.data<uint16_t>()[i] = FloatToHalf(r.data<float>()[i]);
  ASSERT_TRUE(RunReference(n, 1, {h}, &out).ok());
  EXPECT_EQ(out[0].dtype(), DType::kFloat16);
}

TEST(OpsQuant, ConvIntegerTinyWithZeroPoints) {
  // x' = x − 1 = [[0,1,2],[3,4,5],[6,7,8]], w' = w − 2 = [[0,1],[2,3]].
  const Tensor x = T_<uint8_t>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const Tensor w = T_<uint8_t>({2, 3, 4, 5}, {1, 1, 2, 2});
  const Tensor xz = T_<uint8_t>({1}, {}), wz = T_<uint8_t>({2}, {});
  Tensor y = Run1("ConvInteger", {x, w, xz, wz}, 10);
  EXPECT_EQ(y.dtype(), DType::kInt32);
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_THAT(Values<int32_t>(y), ElementsAre(19, 25, 37, 43));
  // Padding 1 and stride 2: windows start at (−1,−1), (−1,1), (1,−1), (1,1); padding adds 0.
  y = Run1("ConvInteger", {x, w, xz, wz}, 10,
           {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"strides", std::vector<int64_t>{2, 2}}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_THAT(Values<int32_t>(y), ElementsAre(0, 8, 21, 43));
  // SAME_UPPER keeps 3×3 at stride 1 (pad 0 before, 1 after).
  y = Run1("ConvInteger", {x, w, xz, wz}, 10, {{"auto_pad", std::string("SAME_UPPER")}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 3, 3}));
  // out(r,c) = x'(r,c+1) + 2·x'(r+1,c) + 3·x'(r+1,c+1), zero outside.
  EXPECT_THAT(Values<int32_t>(y), ElementsAre(19, 25, 10, 37, 43, 16, 7, 8, 0));
}

// Naive grouped 2-D convolution in int64 with per-channel weight zero points.
std::vector<int64_t> NaiveConv(const Tensor& x, const Tensor& w, int64_t xz, const std::vector<int64_t>& wz,
                               int64_t group, int64_t stride, int64_t pad, int64_t dil, Shape* out_shape) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3), m = w.dim(0), kh = w.dim(2),
                kw = w.dim(3);
  const int64_t oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1,
                ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
  *out_shape = {n, m, oh, ow};
  std::vector<int64_t> y;
  const std::vector<int64_t> xv = x.ToInt64Vector(), wv = w.ToInt64Vector();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t s = 0;
          const int64_t g = o / (m / group);
          for (int64_t ci = 0; ci < c / group; ++ci)
            for (int64_t p = 0; p < kh; ++p)
              for (int64_t q = 0; q < kw; ++q) {
                const int64_t yy = i * stride - pad + p * dil, xx = j * stride - pad + q * dil;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                const int64_t xi = ((b * c + g * (c / group) + ci) * h + yy) * wd + xx;
                s += (xv[xi] - xz) * (wv[((o * (c / group) + ci) * kh + p) * kw + q] - wz[o]);
              }
          y.push_back(s);
        }
  return y;
}

TEST(OpsQuant, RandomConvIntegerMatchesNaive) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 10; ++iter) {
    const int64_t group = 1 + rng() % 2, c = group * (1 + rng() % 3), m = group * (1 + rng() % 3);
    const int64_t k = 1 + rng() % 3, stride = 1 + rng() % 2, pad = rng() % 2, dil = 1 + rng() % 2;
    const int64_t h = dil * (k - 1) + 1 + rng() % 5, w = dil * (k - 1) + 1 + rng() % 5;
    Tensor x(DType::kUInt8, {2, c, h, w}), wt(DType::kInt8, {m, c / group, k, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < wt.numel(); ++i) wt.data<int8_t>()[i] = static_cast<int8_t>(rng());
    Tensor wz(DType::kInt8, {m});
    std::vector<int64_t> wzv;
    for (int64_t i = 0; i < m; ++i)
      wzv.push_back(wz.data<int8_t>()[i] = static_cast<int8_t>(rng() % 21) - 10);
    const int64_t xz = rng() % 256;
    SCOPED_TRACE(testing::Message() << "x " << ShapeToString(x.shape()) << " w " << ShapeToString(wt.shape())
                                    << " group " << group << " stride " << stride << " pad " << pad << " dil "
                                    << dil);
    const Tensor y = Run1("ConvInteger", {x, wt, T_<uint8_t>({static_cast<uint8_t>(xz)}, {}), wz}, 10,
                          {{"group", group},
                           {"strides", std::vector<int64_t>{stride, stride}},
                           {"pads", std::vector<int64_t>{pad, pad, pad, pad}},
                           {"dilations", std::vector<int64_t>{dil, dil}}});
    Shape shape;
    const std::vector<int64_t> ref = NaiveConv(x, wt, xz, wzv, group, stride, pad, dil, &shape);
    ASSERT_EQ(y.shape(), shape);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(y.data<int32_t>()[i], ref[i]) << "element " << i;
  }
}

TEST(OpsQuant, Errors) {
  // Per-axis scale of the wrong length.
  auto r = RunOp("DequantizeLinear", {T_<uint8_t>({1, 2, 3, 4}, {2, 2}), F32({1, 2, 3}, {3})});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("node 'n_DequantizeLinear' (DequantizeLinear)"));
  EXPECT_THAT(r.status().message(), HasSubstr("[3]"));
  EXPECT_FALSE(
      RunOp("QuantizeLinear", {F32({1}, {1}), F32({1}, {}), T_<int32_t>({0}, {})}).ok());  // zp dtype
  EXPECT_FALSE(RunOp("DequantizeLinear", {T_<uint8_t>({1}, {1}), F32({1}, {}), T_<int8_t>({0}, {})}).ok());
  EXPECT_FALSE(RunOp("DynamicQuantizeLinear", {T_<int32_t>({1}, {1})}, 11, {}, 3).ok());
  // ConvInteger: channels do not match the weights; kernel larger than the input; 3-D unsupported.
  const Tensor x = T_<uint8_t>({}, {1, 2, 3, 3});
  EXPECT_EQ(RunOp("ConvInteger", {x, T_<uint8_t>({}, {1, 3, 2, 2})}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp("ConvInteger", {x, T_<uint8_t>({}, {1, 2, 4, 4})}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp("ConvInteger", {T_<uint8_t>({}, {1, 1, 2, 2, 2}), T_<uint8_t>({}, {1, 1, 1, 1, 1})}, 10)
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(
      RunOp("ConvInteger", {x, T_<uint8_t>({}, {2, 2, 2, 2}), Tensor(), T_<uint8_t>({1, 2, 3}, {3})}, 10)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);  // w_zero_point count
}

}  // namespace
}  // namespace vigil::infer
