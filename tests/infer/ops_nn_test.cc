// Tests of the neural-network reference kernels (ops/nn.cc): hand-computed cases, randomized
// comparisons against naive double-precision loops written here, and error cases.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using Attrs = std::map<std::string, AttrValue>;
using Ints = std::vector<int64_t>;

template <typename T>
Tensor Make(const Shape& shape, const std::vector<T>& values) {
  Tensor t(DTypeOf<T>(), shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel()) << "test data for " << ShapeToString(shape);
  std::copy_n(values.begin(), std::min<int64_t>(t.numel(), static_cast<int64_t>(values.size())), t.data<T>());
  return t;
}
Tensor F(const Shape& shape, const std::vector<float>& v) { return Make<float>(shape, v); }
Tensor Iota(const Shape& shape, float start = 0.0f) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  std::iota(v.begin(), v.end(), start);
  return F(shape, v);
}
Tensor Random(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}
Tensor ToHalf(const Tensor& f) {
  Tensor h(DType::kFloat16, f.shape());
  for (int64_t i = 0; i < f.numel(); ++i) h.data<uint16_t>()[i] = FloatToHalf(f.data<float>()[i]);
  return h;
}
std::vector<float> Values(const Tensor& t) { return t.ToFloatVector(); }

StatusOr<std::vector<Tensor>> RunOp(const std::string& op, int64_t opset, const std::vector<Tensor>& inputs,
                                    const Attrs& attrs = {}, size_t outputs = 1,
                                    const std::string& domain = "") {
  Node node;
  node.name = "test_" + op;
  node.op_type = op;
  node.domain = domain;
  node.attrs = attrs;
  for (size_t i = 0; i < inputs.size(); ++i)
    node.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
  for (size_t i = 0; i < outputs; ++i) node.outputs.push_back("y" + std::to_string(i));
  std::vector<Tensor> out;
  VIGIL_RETURN_IF_ERROR(RunReference(node, opset, inputs, &out));
  return out;
}

Tensor RunOp1(const std::string& op, int64_t opset, const std::vector<Tensor>& inputs,
              const Attrs& attrs = {}, const std::string& domain = "") {
  auto out = RunOp(op, opset, inputs, attrs, 1, domain);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0] : Tensor();
}

MATCHER_P(HasCode, code, "") { return arg.code() == code; }

uint32_t FreshSeed() { return std::random_device{}(); }

// ---- Conv --------------------------------------------------------------------------------------

struct ConvCase {
  int64_t n, c, h, w, m, kh, kw, group, sh, sw, dh, dw, pt, pl, pb, pr;
};

// Naive 2-D convolution in double, straight from the definition (7 nested loops).
std::vector<double> NaiveConv(const ConvCase& k, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& b, int64_t* oh, int64_t* ow) {
  *oh = (k.h + k.pt + k.pb - ((k.kh - 1) * k.dh + 1)) / k.sh + 1;
  *ow = (k.w + k.pl + k.pr - ((k.kw - 1) * k.dw + 1)) / k.sw + 1;
  const int64_t cg = k.c / k.group, mg = k.m / k.group;
  std::vector<double> y;
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t m = 0; m < k.m; ++m) {
      for (int64_t i = 0; i < *oh; ++i) {
        for (int64_t j = 0; j < *ow; ++j) {
          double s = b.empty() ? 0.0 : b[m];
          for (int64_t ic = 0; ic < cg; ++ic) {
            for (int64_t r = 0; r < k.kh; ++r) {
              for (int64_t q = 0; q < k.kw; ++q) {
                const int64_t ih = i * k.sh - k.pt + r * k.dh, iw = j * k.sw - k.pl + q * k.dw;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                const int64_t c = (m / mg) * cg + ic;
                s += double{x[((n * k.c + c) * k.h + ih) * k.w + iw]} *
                     double{w[((m * cg + ic) * k.kh + r) * k.kw + q]};
              }
            }
          }
          y.push_back(s);
        }
      }
    }
  }
  return y;
}

Attrs ConvAttrs(const ConvCase& k) {
  return {{"group", k.group},
          {"strides", Ints{k.sh, k.sw}},
          {"dilations", Ints{k.dh, k.dw}},
          {"pads", Ints{k.pt, k.pl, k.pb, k.pr}}};
}

// Runs the case through the kernel in float32 (and float16 when `half`) and checks it against NaiveConv.
void CheckConv(const ConvCase& k, std::mt19937& rng, bool half) {
  SCOPED_TRACE(testing::Message() << "N=" << k.n << " C=" << k.c << " H=" << k.h << " W=" << k.w
                                  << " M=" << k.m << " k=" << k.kh << "x" << k.kw << " group=" << k.group
                                  << " stride=" << k.sh << "," << k.sw << " dilation=" << k.dh << "," << k.dw
                                  << " pads=" << k.pt << "," << k.pl << "," << k.pb << "," << k.pr
                                  << (half ? " float16" : " float32"));
  Tensor x = Random({k.n, k.c, k.h, k.w}, rng), w = Random({k.m, k.c / k.group, k.kh, k.kw}, rng),
         b = Random({k.m}, rng);
  if (half) {  // compare on the values the float16 kernel actually sees
    x = ToHalf(x);
    w = ToHalf(w);
    b = ToHalf(b);
  }
  int64_t oh = 0, ow = 0;
  const std::vector<double> ref = NaiveConv(k, Values(x), Values(w), Values(b), &oh, &ow);
  Tensor y = RunOp1("Conv", 13, {x, w, b}, ConvAttrs(k));
  ASSERT_EQ(y.shape(), (Shape{k.n, k.m, oh, ow}));
  const std::vector<float> got = Values(y);
  // float32: accumulation-order rounding only; float16: one rounding of the output (2^-11 relative).
  const double rel = half ? 1e-3 : 1e-5;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref[i], rel * (1.0 + std::abs(ref[i]))) << "element " << i;
  }
}

TEST(ConvOp, HandComputedPaddingAndStride) {
  // X = [[1,2,3],[4,5,6],[7,8,9]], W = [[1,2],[3,4]], pads 1, stride 2, bias 0.5. Padded input is
  // 5x5; the four 2x2 windows start at padded rows/cols 0 and 2:
  //   (0,0): 4·1 = 4;  (0,1): 3·2 + 4·3 = 18;  (1,0): 2·4 + 4·7 = 36;  (1,1): 5 + 2·6 + 3·8 + 4·9 = 77.
  Tensor y = RunOp1("Conv", 11, {Iota({1, 1, 3, 3}, 1), F({1, 1, 2, 2}, {1, 2, 3, 4}), F({1}, {0.5f})},
                    {{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}, {"kernel_shape", Ints{2, 2}}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(Values(y), (std::vector<float>{4.5f, 18.5f, 36.5f, 77.5f}));
}

TEST(ConvOp, DepthwiseGroups) {
  // group = C = 2, one 1x1 filter per channel: channel 0 times 2, channel 1 times -1.
  Tensor y = RunOp1("Conv", 11, {Iota({1, 2, 2, 2}, 1), F({2, 1, 1, 1}, {2, -1})}, {{"group", int64_t{2}}});
  EXPECT_EQ(Values(y), (std::vector<float>{2, 4, 6, 8, -5, -6, -7, -8}));
}

TEST(ConvOp, DilationAndAutoPad1D) {
  // x = [1..5], w = [1, 1] with dilation 2 taps x[i] and x[i+2].
  EXPECT_EQ(Values(RunOp1("Conv", 11, {Iota({1, 1, 5}, 1), F({1, 1, 2}, {1, 1})}, {{"dilations", Ints{2}}})),
            (std::vector<float>{4, 6, 8}));
  // x = [1,2,3,4], w = [1, 10]: SAME_UPPER pads the one extra column at the end, SAME_LOWER at the start.
  const Tensor x = Iota({1, 1, 4}, 1), w = F({1, 1, 2}, {1, 10});
  EXPECT_EQ(Values(RunOp1("Conv", 11, {x, w}, {{"auto_pad", std::string("SAME_UPPER")}})),
            (std::vector<float>{21, 32, 43, 4}));
  EXPECT_EQ(Values(RunOp1("Conv", 11, {x, w}, {{"auto_pad", std::string("SAME_LOWER")}})),
            (std::vector<float>{10, 21, 32, 43}));
  EXPECT_EQ(Values(RunOp1("Conv", 11, {x, w}, {{"auto_pad", std::string("VALID")}, {"pads", Ints{3, 3}}})),
            (std::vector<float>{21, 32, 43}));
  // SAME with stride 2: out = ceil(4/2) = 2, total padding (2-1)·2 + 2 - 4 = 0.
  EXPECT_EQ(
      Values(RunOp1("Conv", 11, {x, w}, {{"auto_pad", std::string("SAME_UPPER")}, {"strides", Ints{2}}})),
      (std::vector<float>{21, 43}));
}

TEST(ConvOp, RandomOddShapesMatchNaive) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  CheckConv({1, 5, 7, 9, 5, 3, 3, 5, 2, 2, 1, 1, 1, 1, 1, 1}, rng, false);    // depthwise, stride 2, pad 1
  CheckConv({1, 5, 7, 9, 10, 3, 3, 5, 2, 2, 1, 1, 1, 1, 1, 1}, rng, false);   // 2 filters per group
  CheckConv({2, 3, 9, 11, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}, rng, false);  // 17 = 2 blocks of 8 + 1
  CheckConv({1, 8, 40, 41, 12, 3, 3, 1, 2, 2, 1, 1, 1, 1, 1, 1}, rng,
            false);  // large enough for several threads
  CheckConv({1, 16, 33, 30, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1, 1, 1}, rng, false);  // depthwise, several threads
  std::uniform_int_distribution<int64_t> d(1, 3), hw(1, 12), pad(0, 2);
  for (int iter = 0; iter < 30; ++iter) {
    ConvCase k{};
    k.group = d(rng);
    k.c = k.group * d(rng);
    k.m = k.group * std::uniform_int_distribution<int64_t>(1, 10)(rng);
    k.n = std::uniform_int_distribution<int64_t>(1, 2)(rng);
    k.h = hw(rng), k.w = hw(rng), k.kh = d(rng), k.kw = d(rng);
    k.sh = d(rng), k.sw = d(rng), k.dh = d(rng) % 2 + 1, k.dw = d(rng) % 2 + 1;
    k.pt = pad(rng), k.pl = pad(rng), k.pb = pad(rng), k.pr = pad(rng);
    if (k.h + k.pt + k.pb < (k.kh - 1) * k.dh + 1 || k.w + k.pl + k.pr < (k.kw - 1) * k.dw + 1) continue;
    CheckConv(k, rng, iter % 5 == 0);
  }
}

TEST(ConvOp, Float16ComputesInFloat32) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  CheckConv({1, 4, 6, 5, 6, 3, 3, 2, 1, 2, 1, 1, 1, 0, 2, 1}, rng, true);
}

TEST(FusedConvOp, AppliesActivationToConvOutput) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Tensor x = Random({1, 3, 6, 7}, rng), w = Random({4, 3, 3, 3}, rng), b = Random({4}, rng);
  const Attrs conv_attrs = {{"pads", Ints{1, 1, 1, 1}}};
  const std::vector<float> conv = Values(RunOp1("Conv", 13, {x, w, b}, conv_attrs));
  struct Case {
    std::string name;
    float alpha;
    double (*f)(double, double);
  };
  const Case cases[] = {
      {"SiLU", 0.0f, [](double v, double) { return v / (1.0 + std::exp(-v)); }},
      {"Relu", 0.0f, [](double v, double) { return std::max(v, 0.0); }},
      {"LeakyRelu", 0.2f, [](double v, double a) { return v >= 0 ? v : a * v; }},
  };
  for (const Case& c : cases) {
    Attrs attrs = conv_attrs;
    attrs["activation"] = c.name;
    if (c.alpha != 0.0f) attrs["alpha"] = c.alpha;
    const std::vector<float> fused = Values(RunOp1("FusedConv", 13, {x, w, b}, attrs, "vigil"));
    ASSERT_EQ(fused.size(), conv.size());
    for (size_t i = 0; i < conv.size(); ++i) {
      ASSERT_NEAR(fused[i], c.f(conv[i], c.alpha), 1e-6 * (1.0 + std::abs(conv[i])))
          << c.name << " element " << i;
    }
  }
  Attrs bad = conv_attrs;
  bad["activation"] = std::string("Gelu");
  EXPECT_THAT(RunOp("FusedConv", 13, {x, w, b}, bad, 1, "vigil").status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(ConvOp, ChannelMismatchNamesNodeAndShapes) {
  const auto st =
      RunOp("Conv", 13, {Tensor(DType::kFloat32, {1, 3, 8, 8}), Tensor(DType::kFloat32, {16, 4, 3, 3})})
          .status();
  EXPECT_THAT(st, HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(st.message().find("node 'test_Conv' (Conv)"), std::string::npos) << st;
  EXPECT_NE(st.message().find("[1,3,8,8]"), std::string::npos) << st;
  EXPECT_NE(st.message().find("[16,4,3,3]"), std::string::npos) << st;
}

TEST(ConvOp, RejectsInconsistentInputs) {
  const Tensor x(DType::kFloat32, {1, 4, 8, 8}), w(DType::kFloat32, {6, 2, 3, 3});
  auto code = [](const StatusOr<std::vector<Tensor>>& r) { return r.status().code(); };
  EXPECT_EQ(code(RunOp("Conv", 13, {x, Tensor(DType::kFloat32, {6, 4, 3})})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13, {x, w, Tensor(DType::kFloat32, {5})}, {{"group", int64_t{2}}})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13, {x, Tensor(DType::kFloat32, {5, 2, 3, 3})}, {{"group", int64_t{2}}})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13, {x, w}, {{"group", int64_t{2}}, {"strides", Ints{1}}})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13, {x, w}, {{"group", int64_t{2}}, {"kernel_shape", Ints{5, 5}}})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13, {x, Tensor(DType::kFloat32, {6, 4, 9, 9})})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13, {x, Tensor(DType::kFloat16, {6, 4, 3, 3})})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Conv", 13,
                       {Tensor(DType::kFloat32, {1, 1, 2, 2, 2}), Tensor(DType::kFloat32, {1, 1, 1, 1, 1})})),
            absl::StatusCode::kUnimplemented);
}

// ---- Pooling -----------------------------------------------------------------------------------

TEST(MaxPoolOp, CeilModeKeepsPartialWindows) {
  // 4x4 input 1..16, kernel 3, stride 2: floor mode has one window (max 11); ceil mode adds
  // windows clipped to rows/cols 2..3.
  const Tensor x = Iota({1, 1, 4, 4}, 1);
  const Attrs attrs = {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{2, 2}}};
  EXPECT_EQ(Values(RunOp1("MaxPool", 12, {x}, attrs)), std::vector<float>{11});
  Attrs ceil = attrs;
  ceil["ceil_mode"] = int64_t{1};
  EXPECT_EQ(Values(RunOp1("MaxPool", 12, {x}, ceil)), (std::vector<float>{11, 12, 15, 16}));
}

TEST(MaxPoolOp, CeilModeDropsWindowStartingInRightPadding) {
  // Length 5, kernel 2, stride 2, pads 1/1: ceil((5+2-2)/2)+1 = 4 windows, but the 4th would start
  // at padded position 6 (inside the right padding), so 3 remain: {pad,1}, {2,3}, {4,5}.
  Tensor y = RunOp1(
      "MaxPool", 12, {Iota({1, 1, 5}, 1)},
      {{"kernel_shape", Ints{2}}, {"strides", Ints{2}}, {"pads", Ints{1, 1}}, {"ceil_mode", int64_t{1}}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 3}));
  EXPECT_EQ(Values(y), (std::vector<float>{1, 3, 5}));
}

TEST(MaxPoolOp, DilationSamePaddingAndIndicesRejected) {
  // Dilation 2 over [1,5,2,4,3]: windows {x0,x2}, {x1,x3}, {x2,x4}.
  EXPECT_EQ(Values(RunOp1("MaxPool", 12, {F({1, 1, 5}, {1, 5, 2, 4, 3})},
                          {{"kernel_shape", Ints{2}}, {"dilations", Ints{2}}})),
            (std::vector<float>{2, 5, 3}));
  // YOLO SPPF: kernel 5, stride 1, pads 2 keeps the size; SAME_UPPER gives the same windows.
  const Tensor x = Iota({1, 2, 3, 3});
  const Tensor a = RunOp1("MaxPool", 12, {x}, {{"kernel_shape", Ints{5, 5}}, {"pads", Ints{2, 2, 2, 2}}});
  const Tensor b =
      RunOp1("MaxPool", 12, {x}, {{"kernel_shape", Ints{5, 5}}, {"auto_pad", std::string("SAME_UPPER")}});
  std::vector<float> expect(9, 8.0f);  // every window covers its whole 3x3 channel
  expect.resize(18, 17.0f);
  EXPECT_EQ(Values(a), expect);
  EXPECT_EQ(Values(a), Values(b));
  EXPECT_THAT(RunOp("MaxPool", 12, {x}, {{"kernel_shape", Ints{2, 2}}}, 2).status(),
              HasCode(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(RunOp("MaxPool", 12, {x}).status(), HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(AveragePoolOp, CountIncludePad) {
  // 2x2 input [1,2;3,4], kernel 2, pads 1: corner windows hold one element, edges two, centre four.
  const Tensor x = Iota({1, 1, 2, 2}, 1);
  const Attrs attrs = {{"kernel_shape", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}};
  EXPECT_EQ(Values(RunOp1("AveragePool", 11, {x}, attrs)),
            (std::vector<float>{1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4}));
  Attrs include = attrs;
  include["count_include_pad"] = int64_t{1};
  EXPECT_EQ(Values(RunOp1("AveragePool", 11, {x}, include)),
            (std::vector<float>{0.25f, 0.75f, 0.5f, 1, 2.5f, 1.5f, 0.75f, 1.75f, 1}));
  // Ceil mode, no pads: the clipped last window [3,4] divides by its 2 elements either way.
  EXPECT_EQ(Values(RunOp1("AveragePool", 11, {Iota({1, 1, 4}, 1)},
                          {{"kernel_shape", Ints{3}},
                           {"strides", Ints{2}},
                           {"ceil_mode", int64_t{1}},
                           {"count_include_pad", int64_t{1}}})),
            (std::vector<float>{2, 3.5f}));
}

TEST(GlobalPoolOps, ReduceSpatialAxes) {
  const Tensor x = F({1, 2, 2, 2}, {1, 2, 3, 6, -1, -2, -3, -4});
  Tensor avg = RunOp1("GlobalAveragePool", 13, {x});
  EXPECT_EQ(avg.shape(), (Shape{1, 2, 1, 1}));
  EXPECT_EQ(Values(avg), (std::vector<float>{3, -2.5f}));
  EXPECT_EQ(Values(RunOp1("GlobalMaxPool", 13, {x})), (std::vector<float>{6, -1}));
  EXPECT_EQ(Values(RunOp1("GlobalAveragePool", 13, {ToHalf(x)})), (std::vector<float>{3, -2.5f}));
}

// ---- Resize / Upsample -------------------------------------------------------------------------

Tensor Resize(const Tensor& x, const std::vector<float>& scales, const Attrs& attrs, int64_t opset = 13) {
  return RunOp1("Resize", opset, {x, Tensor(), F({static_cast<int64_t>(scales.size())}, scales)}, attrs);
}
Attrs Nearest(const std::string& coord, const std::string& rounding) {
  return {{"mode", std::string("nearest")},
          {"coordinate_transformation_mode", coord},
          {"nearest_mode", rounding}};
}

TEST(ResizeOp, NearestTimesTwoReplicates) {
  const Tensor x = Iota({1, 1, 2, 2}, 1);
  const std::vector<float> replicated = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  // asymmetric + floor: x_in = x_out / 2 → 0,0,1,1 (YOLO necks).
  Tensor y = Resize(x, {1, 1, 2, 2}, Nearest("asymmetric", "floor"));
  EXPECT_EQ(y.shape(), (Shape{1, 1, 4, 4}));
  EXPECT_EQ(Values(y), replicated);
  // half_pixel + round_prefer_floor (the defaults): x_in = (x + 0.5)/2 - 0.5 = -0.25, 0.25, 0.75, 1.25 →
  // 0,0,1,1.
  EXPECT_EQ(Values(Resize(x, {1, 1, 2, 2}, {})), replicated);
  // asymmetric + round_prefer_ceil: 0, 0.5, 1, 1.5 → 0, 1, 1, 2→1 (clamped).
  EXPECT_EQ(Values(Resize(x, {1, 1, 2, 2}, Nearest("asymmetric", "round_prefer_ceil"))),
            (std::vector<float>{1, 2, 2, 2, 3, 4, 4, 4, 3, 4, 4, 4, 3, 4, 4, 4}));
}

TEST(ResizeOp, NearestDownsampleCoordinateModes) {
  // [1,2,3,4] with scale 0.5: half_pixel maps out 0,1 to 0.5, 2.5 (ties), asymmetric to 0, 2,
  // tf_half_pixel_for_nearest to 1, 3.
  const Tensor x = Iota({1, 1, 1, 4}, 1);
  const std::vector<float> s = {1, 1, 1, 0.5f};
  EXPECT_EQ(Values(Resize(x, s, Nearest("half_pixel", "round_prefer_floor"))), (std::vector<float>{1, 3}));
  EXPECT_EQ(Values(Resize(x, s, Nearest("half_pixel", "round_prefer_ceil"))), (std::vector<float>{2, 4}));
  EXPECT_EQ(Values(Resize(x, s, Nearest("asymmetric", "floor"))), (std::vector<float>{1, 3}));
  EXPECT_EQ(Values(Resize(x, s, Nearest("tf_half_pixel_for_nearest", "floor"))), (std::vector<float>{2, 4}));
  EXPECT_EQ(Values(Resize(x, s, Nearest("half_pixel", "ceil"))), (std::vector<float>{2, 4}));
}

TEST(ResizeOp, BilinearHalfPixelAndAlignCorners) {
  const Tensor x = Iota({1, 1, 2, 2}, 1);
  EXPECT_EQ(Values(Resize(x, {1, 1, 2, 2}, {{"mode", std::string("linear")}})),
            (std::vector<float>{1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3,
                                3.25f, 3.75f, 4}));
  // align_corners to 3x3 via sizes: corners kept, midpoints averaged.
  Tensor y = RunOp1(
      "Resize", 13, {x, Tensor(), Tensor(), Make<int64_t>({4}, {1, 1, 3, 3})},
      {{"mode", std::string("linear")}, {"coordinate_transformation_mode", std::string("align_corners")}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(Values(y), (std::vector<float>{1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4}));
  // pytorch_half_pixel with an output length of 1 samples coordinate 0.
  Tensor p =
      RunOp1("Resize", 13, {Iota({1, 1, 1, 4}, 1), Tensor(), Tensor(), Make<int64_t>({4}, {1, 1, 1, 1})},
             {{"mode", std::string("linear")},
              {"coordinate_transformation_mode", std::string("pytorch_half_pixel")}});
  EXPECT_EQ(Values(p), std::vector<float>{1});
  EXPECT_EQ(Values(Resize(ToHalf(x), {1, 1, 2, 2}, {{"mode", std::string("linear")}}))[1], 1.25f);
}

TEST(ResizeOp, OpsetVariants) {
  const Tensor x = Iota({1, 1, 2, 2}, 1);
  // Resize-10 (X, scales) and Upsample-9 (X, scales): asymmetric coordinates, floor when enlarging.
  const Tensor s = F({4}, {1, 1, 2, 3});
  const std::vector<float> expect = {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4};
  EXPECT_EQ(Values(RunOp1("Resize", 10, {x, s})), expect);
  EXPECT_EQ(Values(RunOp1("Upsample", 9, {x, s})), expect);
  EXPECT_EQ(Values(RunOp1("Upsample", 7, {x}, {{"scales", std::vector<float>{1, 1, 2, 3}}})), expect);
  // Resize-10 linear: asymmetric, so output 1 of a ×2 row sits at input 0.5.
  EXPECT_EQ(Values(RunOp1("Resize", 10, {Iota({1, 1, 1, 2}, 1), F({4}, {1, 1, 1, 2})},
                          {{"mode", std::string("linear")}})),
            (std::vector<float>{1, 1.5f, 2, 2}));
  // Opset 18 axes: scales only for the listed axes.
  EXPECT_EQ(Values(RunOp1("Resize", 18, {x, Tensor(), F({2}, {2, 2})},
                          {{"axes", Ints{2, 3}},
                           {"coordinate_transformation_mode", std::string("asymmetric")},
                           {"nearest_mode", std::string("floor")}})),
            (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // Integer tensors resize with nearest by copying elements.
  Tensor xi = Make<int32_t>({1, 2}, {7, 9});
  EXPECT_EQ(Values(RunOp1("Resize", 13, {xi, Tensor(), F({2}, {1, 2})}, Nearest("asymmetric", "floor"))),
            (std::vector<float>{7, 7, 9, 9}));
}

TEST(ResizeOp, RejectsUnsupportedAndInconsistent) {
  const Tensor x = Iota({1, 1, 2, 2});
  const Tensor s = F({4}, {1, 1, 2, 2});
  auto code = [](const StatusOr<std::vector<Tensor>>& r) { return r.status().code(); };
  EXPECT_EQ(code(RunOp("Resize", 18, {x, Tensor(), s}, {{"antialias", int64_t{1}}})),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code(RunOp("Resize", 13, {x, Tensor(), s}, {{"mode", std::string("cubic")}})),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code(RunOp("Resize", 13, {x, Tensor(), s, Make<int64_t>({4}, {1, 1, 4, 4})})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Resize", 13, {x, Tensor(), F({3}, {1, 2, 2})})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Resize", 13, {x, Tensor(), F({4}, {1, 1, -2, 2})})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RunOp("Resize", 13, {x, Tensor(), F({4}, {1, 2, 2, 2})}, {{"mode", std::string("linear")}})),
            absl::StatusCode::kUnimplemented);
  // antialias=0 is accepted.
  EXPECT_TRUE(RunOp("Resize", 18, {x, Tensor(), s}, {{"antialias", int64_t{0}}}).ok());
}

// ---- BatchNormalization, DepthToSpace, SpaceToDepth --------------------------------------------

TEST(BatchNormalizationOp, InferenceFormula) {
  // y = scale·(x - mean)/sqrt(var + eps) + B with eps = 0: channel 0 → x - 1, channel 1 → 2(x - 3) + 1.
  const Tensor x = F({1, 2, 1, 2}, {1, 2, 3, 4});
  const std::vector<Tensor> in = {x, F({2}, {2, 1}), F({2}, {0, 1}), F({2}, {1, 3}), F({2}, {4, 0.25f})};
  EXPECT_EQ(Values(RunOp1("BatchNormalization", 15, in, {{"epsilon", 0.0f}})),
            (std::vector<float>{0, 1, 1, 3}));
  std::vector<Tensor> half = in;
  half[0] = ToHalf(x);
  EXPECT_EQ(Values(RunOp1("BatchNormalization", 15, half, {{"epsilon", 0.0f}})),
            (std::vector<float>{0, 1, 1, 3}));
  std::vector<Tensor> bad = in;
  bad[3] = F({3}, {0, 0, 0});
  EXPECT_THAT(RunOp("BatchNormalization", 15, bad).status(), HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("BatchNormalization", 15, in, {}, 3).status(), HasCode(absl::StatusCode::kUnimplemented));
  Node node;  // omitted optional outputs are fine
  node.name = "bn";
  node.op_type = "BatchNormalization";
  node.inputs = {"x", "s", "b", "m", "v"};
  node.outputs = {"y", "", ""};
  std::vector<Tensor> out;
  ASSERT_TRUE(RunReference(node, 9, in, &out).ok());
  EXPECT_EQ(out.size(), 3u);
  EXPECT_FALSE(out[1].defined());
}

TEST(DepthToSpaceOp, DcrAndCrdOrders) {
  // C = 8, blocksize 2 → 2 output channels. DCR takes channel (i·2 + j)·2 + c, CRD c·4 + i·2 + j.
  const Tensor x = Iota({1, 8, 1, 1});
  Tensor dcr = RunOp1("DepthToSpace", 13, {x}, {{"blocksize", int64_t{2}}});
  EXPECT_EQ(dcr.shape(), (Shape{1, 2, 2, 2}));
  EXPECT_EQ(Values(dcr), (std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(
      Values(RunOp1("DepthToSpace", 13, {x}, {{"blocksize", int64_t{2}}, {"mode", std::string("CRD")}})),
      (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_THAT(RunOp("DepthToSpace", 13, {Iota({1, 6, 1, 1})}, {{"blocksize", int64_t{2}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

// SpaceToDepth against the spec's reshape/transpose definition, evaluated by index arithmetic:
// y = transpose(reshape(x, [N, C, H/b, b, W/b, b]), [0, 3, 5, 1, 2, 4]) reshaped to [N, C·b², H/b, W/b];
// DepthToSpace (DCR) must invert it.
TEST(SpaceToDepthOp, MatchesSpecDefinitionAndInvertsDepthToSpace) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t b = std::uniform_int_distribution<int64_t>(1, 3)(rng);
  const int64_t n = 2, c = std::uniform_int_distribution<int64_t>(1, 3)(rng);
  const int64_t h = b * std::uniform_int_distribution<int64_t>(1, 3)(rng),
                w = b * std::uniform_int_distribution<int64_t>(1, 3)(rng);
  const Tensor x = Random({n, c, h, w}, rng);
  Tensor y = RunOp1("SpaceToDepth", 13, {x}, {{"blocksize", b}});
  ASSERT_EQ(y.shape(), (Shape{n, c * b * b, h / b, w / b}));
  const int64_t t[6] = {n, c, h / b, b, w / b, b};  // the reshaped input
  const int perm[6] = {0, 3, 5, 1, 2, 4};
  for (int64_t i = 0; i < y.numel(); ++i) {
    int64_t o[6], rem = i;  // index in the transposed [N, b, b, C, H/b, W/b]
    for (int d = 5; d >= 0; --d) {
      o[d] = rem % t[perm[d]];
      rem /= t[perm[d]];
    }
    int64_t src[6];
    for (int d = 0; d < 6; ++d) src[perm[d]] = o[d];
    int64_t off = 0;
    for (int d = 0; d < 6; ++d) off = off * t[d] + src[d];
    ASSERT_EQ(y.data<float>()[i], x.data<float>()[off]) << "element " << i;
  }
  EXPECT_EQ(Values(RunOp1("DepthToSpace", 13, {y}, {{"blocksize", b}})), Values(x));
}

}  // namespace
}  // namespace vigil::infer
