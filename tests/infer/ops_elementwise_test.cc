// Reference kernels of ops/elementwise.cc: hand-computed cases from the ONNX operator spec,
// randomized broadcasting checks against a naive index computation, and error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A node "n_<op>" with inputs x0.. (an empty name where `inputs` holds an undefined tensor).
Node MakeNode(const std::string& op, const std::vector<Tensor>& inputs, size_t outputs = 1,
              std::map<std::string, AttrValue> attrs = {}) {
  Node n;
  n.name = "n_" + op;
  n.op_type = op;
  for (size_t i = 0; i < inputs.size(); ++i)
    n.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
  for (size_t i = 0; i < outputs; ++i) n.outputs.push_back("y" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

// Runs `op` and returns its outputs (or the error status).
StatusOr<std::vector<Tensor>> RunOp(const std::string& op, const std::vector<Tensor>& inputs,
                                    int64_t opset = 17, std::map<std::string, AttrValue> attrs = {},
                                    size_t outputs = 1) {
  std::vector<Tensor> out;
  VIGIL_RETURN_IF_ERROR(RunReference(MakeNode(op, inputs, outputs, std::move(attrs)), opset, inputs, &out));
  return out;
}

Tensor F32(std::vector<float> v, Shape s) { return Tensor::FromVector<float>(v, std::move(s)); }
Tensor I32(std::vector<int32_t> v, Shape s) { return Tensor::FromVector<int32_t>(v, std::move(s)); }
Tensor Bool(std::vector<bool> v, Shape s) {
  Tensor t(DType::kBool, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i];
  return t;
}
Tensor F16(const std::vector<float>& v, Shape s) {
  Tensor t(DType::kFloat16, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<uint16_t>()[i] = FloatToHalf(v[i]);
  return t;
}
template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// The single output of `op` (test fails on error).
Tensor Run1(const std::string& op, const std::vector<Tensor>& inputs, int64_t opset = 17,
            std::map<std::string, AttrValue> attrs = {}) {
  auto out = RunOp(op, inputs, opset, std::move(attrs));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0] : Tensor();
}

TEST(OpsElementwise, AddBroadcastsNumpyStyle) {
  // [2,1,3] + [4,1] → [2,4,3]: y[i,j,k] = a[i,0,k] + b[j,0].
  const Tensor y = Run1("Add", {F32({0, 1, 2, 10, 11, 12}, {2, 1, 3}), F32({100, 200, 300, 400}, {4, 1})});
  EXPECT_EQ(y.shape(), (Shape{2, 4, 3}));
  EXPECT_THAT(Values<float>(y),
              ElementsAreArray<float>({100, 101, 102, 200, 201, 202, 300, 301, 302, 400, 401, 402,
                                       110, 111, 112, 210, 211, 212, 310, 311, 312, 410, 411, 412}));
}

TEST(OpsElementwise, ArithmeticHandCases) {
  EXPECT_THAT(Values<float>(Run1("Sub", {F32({5, 7}, {2}), F32({2}, {})})), ElementsAre(3, 5));
  EXPECT_THAT(Values<float>(Run1("Mul", {F32({1.5f, -2}, {2}), F32({2, 3}, {2})})), ElementsAre(3, -6));
  EXPECT_THAT(Values<float>(Run1("Div", {F32({1, -3}, {2}), F32({4, 2}, {2})})), ElementsAre(0.25f, -1.5f));
  // Integer division truncates; division by zero gives 0 (vigil's choice: the spec leaves it undefined).
  EXPECT_THAT(Values<int32_t>(Run1("Div", {I32({7, 9, 5}, {3}), I32({2, 3, 0}, {3})})), ElementsAre(3, 3, 0));
  // Pow with an exponent of another dtype (YOLOv5's wh decode: (2·sigmoid)^2).
  EXPECT_THAT(Values<float>(Run1("Pow", {F32({3, 0.5f, -2}, {3}), I32({2}, {1})})), ElementsAre(9, 0.25f, 4));
  EXPECT_THAT(Values<int32_t>(Run1("Pow", {I32({3, -2}, {2}), I32({3, 2}, {2})})), ElementsAre(27, 4));
}

TEST(OpsElementwise, VariadicMaxMinSumMean) {
  const std::vector<Tensor> in = {F32({1, 5, 3, 7}, {2, 2}), F32({4, 2}, {2}), F32({3}, {})};
  EXPECT_THAT(Values<float>(Run1("Max", in)), ElementsAre(4, 5, 4, 7));
  EXPECT_THAT(Values<float>(Run1("Min", in)), ElementsAre(1, 2, 3, 2));
  EXPECT_THAT(Values<float>(Run1("Sum", in)), ElementsAre(8, 10, 10, 12));
  EXPECT_THAT(Values<float>(Run1("Mean", in)), ElementsAre(8.f / 3, 10.f / 3, 10.f / 3, 4));
  EXPECT_THAT(Values<float>(Run1("Max", {F32({-1, 2}, {2})})), ElementsAre(-1, 2));  // one input: a copy
  EXPECT_THAT(Values<int32_t>(Run1("Max", {I32({1, -5}, {2}), I32({0}, {1})})), ElementsAre(1, 0));
}

TEST(OpsElementwise, ComparisonsAndLogic) {
  const Tensor a = F32({1, 2, 3}, {3}), b = F32({2}, {});
  EXPECT_THAT(Values<bool>(Run1("Equal", {a, b})), ElementsAre(false, true, false));
  EXPECT_THAT(Values<bool>(Run1("Less", {a, b})), ElementsAre(true, false, false));
  EXPECT_THAT(Values<bool>(Run1("Greater", {a, b})), ElementsAre(false, false, true));
  EXPECT_THAT(Values<bool>(Run1("LessOrEqual", {a, b})), ElementsAre(true, true, false));
  EXPECT_THAT(Values<bool>(Run1("GreaterOrEqual", {a, b})), ElementsAre(false, true, true));
  EXPECT_EQ(Run1("Equal", {a, b}).dtype(), DType::kBool);
  const Tensor p = Bool({true, true, false, false}, {4}), q = Bool({true, false, true, false}, {4});
  EXPECT_THAT(Values<bool>(Run1("And", {p, q})), ElementsAre(true, false, false, false));
  EXPECT_THAT(Values<bool>(Run1("Or", {p, q})), ElementsAre(true, true, true, false));
  EXPECT_THAT(Values<bool>(Run1("Not", {p})), ElementsAre(false, false, true, true));
}

TEST(OpsElementwise, WhereBroadcastsAllThree) {
  // cond [2,1], X [1,3], Y scalar → [2,3].
  const Tensor y = Run1("Where", {Bool({true, false}, {2, 1}), F32({1, 2, 3}, {1, 3}), F32({-1}, {})});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_THAT(Values<float>(y), ElementsAre(1, 2, 3, -1, -1, -1));
  const Tensor h = Run1("Where", {Bool({false, true}, {2}), F16({0.5f, 1}, {2}), F16({2, 3}, {2})});
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_THAT(h.ToFloatVector(), ElementsAre(2, 1));
}

TEST(OpsElementwise, UnaryHandCases) {
  EXPECT_THAT(Values<float>(Run1("Sigmoid", {F32({0, std::log(3.f), -std::log(3.f)}, {3})})),
              ElementsAre(0.5f, testing::FloatNear(0.75f, 1e-7f), testing::FloatNear(0.25f, 1e-7f)));
  EXPECT_THAT(Values<float>(Run1("Relu", {F32({-1, 0, 2}, {3})})), ElementsAre(0, 0, 2));
  EXPECT_THAT(Values<int32_t>(Run1("Relu", {I32({-1, 4}, {2})})), ElementsAre(0, 4));
  EXPECT_THAT(Values<float>(Run1("LeakyRelu", {F32({-2, 3}, {2})}, 17, {{"alpha", 0.1f}})),
              ElementsAre(testing::FloatEq(-0.2f), 3));
  EXPECT_THAT(Values<float>(Run1("LeakyRelu", {F32({-2}, {1})})), ElementsAre(testing::FloatEq(-0.02f)));
  // HardSigmoid: max(0, min(1, 0.2x + 0.5)); HardSwish: x·max(0, min(1, x/6 + 0.5)).
  EXPECT_THAT(Values<float>(Run1("HardSigmoid", {F32({1, -3, 3}, {3})})),
              ElementsAre(testing::FloatEq(0.7f), 0, 1));
  EXPECT_THAT(Values<float>(Run1("HardSwish", {F32({1, -4, 4, -1}, {4})})),
              ElementsAre(testing::FloatEq(2.f / 3), 0, 4, testing::FloatEq(-1.f / 3)));
  EXPECT_THAT(Values<float>(Run1("Tanh", {F32({0, 1}, {2})})),
              ElementsAre(0, testing::FloatEq(0.7615941559f)));
  EXPECT_THAT(Values<float>(Run1("Exp", {F32({0, 1}, {2})})), ElementsAre(1, testing::FloatEq(2.718281828f)));
  EXPECT_THAT(Values<float>(Run1("Log", {F32({1, 0}, {2})})),
              ElementsAre(0, -std::numeric_limits<float>::infinity()));
  EXPECT_THAT(Values<float>(Run1("Sqrt", {F32({4, 2.25f}, {2})})), ElementsAre(2, 1.5f));
  EXPECT_THAT(Values<float>(Run1("Neg", {F32({1, -2}, {2})})), ElementsAre(-1, 2));
  EXPECT_THAT(Values<int32_t>(Run1("Abs", {I32({-3, 4}, {2})})), ElementsAre(3, 4));
  EXPECT_THAT(Values<float>(Run1("Reciprocal", {F32({4, -0.5f}, {2})})), ElementsAre(0.25f, -2));
  EXPECT_THAT(Values<float>(Run1("Floor", {F32({-1.5f, 1.5f}, {2})})), ElementsAre(-2, 1));
  EXPECT_THAT(Values<float>(Run1("Ceil", {F32({-1.5f, 1.5f}, {2})})), ElementsAre(-1, 2));
  EXPECT_THAT(Values<float>(Run1("Erf", {F32({0, 1}, {2})})),
              ElementsAre(0, testing::FloatEq(0.8427007929f)));
}

TEST(OpsElementwise, RoundHalfToEven) {
  EXPECT_THAT(Values<float>(Run1("Round", {F32({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.4f, 2.6f, -2.5f}, {8})})),
              ElementsAre(0, 2, 2, -0.f, -2, 2, 3, -2));
}

// The reference Sigmoid is ONNX Runtime's (MLAS's) rational logistic (elementwise.cc Logistic): absolutely within
// 1.8e-7 of the exact value across the range, 0 and 1 at the ends, NaN kept. (Bit equality with ONNX Runtime:
// tests/models/test_int8_exact.py.)
TEST(OpsElementwise, SigmoidMatchesExpAcrossRange) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-120.f, 120.f);
  std::vector<float> x(100000);  // large enough for the OpenMP path
  for (float& v : x) v = dist(rng) * (rng() % 4 == 0 ? 1.f : 0.05f);
  x[0] = std::numeric_limits<float>::infinity();
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = std::numeric_limits<float>::quiet_NaN();
  const Tensor y = Run1("Sigmoid", {F32(x, {static_cast<int64_t>(x.size())})});
  const float* py = y.data<float>();
  EXPECT_EQ(py[0], 1.f);
  EXPECT_EQ(py[1], 0.f);
  EXPECT_TRUE(std::isnan(py[2]));
  for (size_t i = 3; i < x.size(); ++i) {
    const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
    ASSERT_NEAR(py[i], ref, 1.8e-7) << "x = " << x[i];
    if (x[i] <= -18.f) ASSERT_EQ(py[i], 0.f) << "x = " << x[i];
  }
}

TEST(OpsElementwise, ClipAttributesBeforeOpset11InputsAfter) {
  const Tensor x = F32({-2, 0.5f, 3}, {3});
  EXPECT_THAT(Values<float>(Run1("Clip", {x}, 6, {{"min", -1.f}, {"max", 1.f}})), ElementsAre(-1, 0.5f, 1));
  EXPECT_THAT(Values<float>(Run1("Clip", {x}, 6, {{"min", 0.f}})), ElementsAre(0, 0.5f, 3));
  EXPECT_THAT(Values<float>(Run1("Clip", {x, F32({-1}, {}), F32({1}, {})}, 11)), ElementsAre(-1, 0.5f, 1));
  EXPECT_THAT(Values<float>(Run1("Clip", {x, Tensor(), F32({0}, {})}, 13)),
              ElementsAre(-2, 0, 0));  // max only
  EXPECT_THAT(Values<float>(Run1("Clip", {x}, 13)), ElementsAre(-2, 0.5f, 3));
  // Opset 11+ ignores the old attributes.
  EXPECT_THAT(Values<float>(Run1("Clip", {x}, 11, {{"min", 0.f}})), ElementsAre(-2, 0.5f, 3));
  EXPECT_THAT(Values<int32_t>(Run1("Clip", {I32({-5, 5, 50}, {3}), I32({0}, {}), I32({10}, {})}, 12)),
              ElementsAre(0, 5, 10));
  // Clip-6 has no min/max inputs.
  EXPECT_FALSE(RunOp("Clip", {x, F32({-1}, {})}, 6).ok());
}

TEST(OpsElementwise, CastConversions) {
  constexpr int64_t kFloat = 1, kUInt8 = 2, kInt32 = 6, kInt64 = 7, kBool = 9, kFloat16 = 10;  // onnx.proto
  const Tensor x = F32({1.7f, -1.7f, 2.5f, 0}, {4});
  EXPECT_THAT(Values<int32_t>(Run1("Cast", {x}, 13, {{"to", kInt32}})),
              ElementsAre(1, -1, 2, 0));  // truncation
  EXPECT_THAT(Values<bool>(Run1("Cast", {x}, 13, {{"to", kBool}})), ElementsAre(true, true, true, false));
  EXPECT_THAT(Values<float>(Run1("Cast", {Bool({true, false}, {2})}, 13, {{"to", kFloat}})),
              ElementsAre(1, 0));
  EXPECT_THAT(Values<uint8_t>(Run1("Cast", {F32({3.9f, 255}, {2})}, 13, {{"to", kUInt8}})),
              ElementsAre(3, 255));
  EXPECT_THAT(Values<int64_t>(Run1("Cast", {I32({-7, 1 << 30}, {2})}, 13, {{"to", kInt64}})),
              ElementsAre(-7, int64_t{1} << 30));
  // float32 → float16 → float32: exact for representable values, round-to-nearest-even otherwise
  // (1/3 → 0x3555 = 0.333251953125; 2049 → 2048, a tie between 2048 and 2050 that goes to even).
  const Tensor h = Run1("Cast", {F32({1, 0.5f, -2, 65504, 1.f / 3, 2049}, {6})}, 13, {{"to", kFloat16}});
  ASSERT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.data<uint16_t>()[4], 0x3555);
  EXPECT_THAT(Values<float>(Run1("Cast", {h}, 13, {{"to", kFloat}})),
              ElementsAre(1, 0.5f, -2, 65504, 0.333251953125f, 2048));
  EXPECT_THAT(Values<int32_t>(Run1("Cast", {h}, 13, {{"to", kInt32}})),
              ElementsAre(1, 0, -2, 65504, 0, 2048));
  EXPECT_THAT(Run1("Cast", {I32({3}, {1})}, 13, {{"to", kFloat16}}).ToFloatVector(), ElementsAre(3));
}

TEST(OpsElementwise, Float16ComputesInFloat32) {
  // 1 + 2^-11 is not a float16: the sum of the halves 1 and 2^-11 rounds to even (1).
  const Tensor y = Run1("Add", {F16({1, 2, 1000}, {3}), F16({0.00048828125f, 0.5f, 0.25f}, {3})});
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  EXPECT_THAT(y.ToFloatVector(), ElementsAre(1, 2.5f, 1000));  // 1000.25 rounds to 1000 (spacing 0.5)
  const Tensor s = Run1("Sigmoid", {F16({0}, {1})});
  EXPECT_THAT(s.ToFloatVector(), ElementsAre(0.5f));
  EXPECT_THAT(Values<bool>(Run1("Less", {F16({1, 3}, {2}), F16({2}, {1})})), ElementsAre(true, false));
}

TEST(OpsElementwise, IdentityAndDropout) {
  EXPECT_THAT(Values<int32_t>(Run1("Identity", {I32({4, 5}, {2})})), ElementsAre(4, 5));
  auto d = RunOp("Dropout", {F32({1, 2}, {2}), F32({0.3f}, {})}, 13, {}, 2);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(Values<float>((*d)[0]), ElementsAre(1, 2));
  ASSERT_EQ((*d)[1].dtype(), DType::kBool);
  EXPECT_THAT(Values<bool>((*d)[1]), ElementsAre(true, true));
  EXPECT_THAT(Values<float>(Run1("Dropout", {F32({3}, {1})}, 7, {{"ratio", 0.5f}})), ElementsAre(3));
  auto training = RunOp("Dropout", {F32({1}, {1}), F32({0.5f}, {}), Bool({true}, {})}, 13);
  EXPECT_EQ(training.status().code(), absl::StatusCode::kUnimplemented);
}

// Naive broadcast: the flat index into `in` for output multi-index `idx` (right-aligned).
int64_t NaiveIndex(const Shape& in, const Shape& out, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t i = idx[out.size() - in.size() + d];
    flat = flat * in[d] + (in[d] == 1 ? 0 : i);
  }
  return flat;
}

TEST(OpsElementwise, RandomBroadcastingMatchesNaiveIndexing) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-4.f, 4.f);
  for (int iter = 0; iter < 60; ++iter) {
    // An output shape of rank 0..5 with dims 1..5 (plus a large one now and then for the
    // parallel path); each operand drops leading dims and turns some dims into 1.
    const int rank = static_cast<int>(rng() % 6);
    Shape out(rank);
    for (int64_t& d : out) d = 1 + rng() % 5;
    if (rank > 0 && iter % 10 == 0) {  // one long row (≥ 20000 elements) for the parallel path
      for (size_t d = 0; d + 1 < out.size(); ++d) out[d] = d == 0 ? 2 : 1;
      out.back() = 20000 + rng() % 1000;
    }
    auto operand = [&] {
      Shape s(out.begin() + (rank ? rng() % (rank + 1) : 0), out.end());
      for (int64_t& d : s) d = rng() % 3 == 0 ? 1 : d;
      return s;
    };
    const Shape sa = operand(), sb = operand();
    Shape expected_shape;
    ASSERT_TRUE(BroadcastShapes(sa, sb, &expected_shape));
    Tensor a(DType::kFloat32, sa), b(DType::kFloat32, sb);
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = value(rng);
    for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = value(rng) + 5.f;  // nonzero divisor
    SCOPED_TRACE(ShapeToString(sa) + " op " + ShapeToString(sb));
    const Tensor add = Run1("Add", {a, b}), div = Run1("Div", {a, b}), max = Run1("Max", {a, b});
    const Tensor less = Run1("Less", {a, b}), where = Run1("Where", {Run1("Less", {a, F32({0}, {})}), a, b});
    ASSERT_EQ(add.shape(), expected_shape);
    ASSERT_EQ(where.shape(), expected_shape);
    std::vector<int64_t> idx(expected_shape.size(), 0);
    for (int64_t flat = 0; flat < add.numel(); ++flat) {
      const float x = a.data<float>()[NaiveIndex(sa, expected_shape, idx)];
      const float y = b.data<float>()[NaiveIndex(sb, expected_shape, idx)];
      ASSERT_EQ(add.data<float>()[flat], x + y) << "flat index " << flat;
      ASSERT_EQ(div.data<float>()[flat], x / y);
      ASSERT_EQ(max.data<float>()[flat], std::max(x, y));
      ASSERT_EQ(less.data<bool>()[flat], x < y);
      ASSERT_EQ(where.data<float>()[flat], x < 0 ? x : y);
      for (size_t d = idx.size(); d-- > 0;) {  // next multi-index
        if (++idx[d] < expected_shape[d]) break;
        idx[d] = 0;
      }
    }
  }
}

TEST(OpsElementwise, ErrorsNameNodeAndShapes) {
  auto r = RunOp("Add", {F32({1, 2, 3}, {1, 3}), F32({1, 2, 3, 4}, {1, 4})});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("node 'n_Add' (Add)"));
  EXPECT_THAT(r.status().message(), HasSubstr("inputs [1,3] and [1,4] do not broadcast"));
  EXPECT_EQ(RunOp("Add", {F32({1}, {1})}).status().code(), absl::StatusCode::kInvalidArgument);  // one input
  auto mixed = RunOp("Add", {F32({1}, {1}), I32({1}, {1})});
  EXPECT_THAT(mixed.status().message(), HasSubstr("different dtypes (float32, int32)"));
  auto sig = RunOp("Sigmoid", {I32({1}, {1})});
  EXPECT_EQ(sig.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sig.status().message(), HasSubstr("input 0 has dtype int32"));
  EXPECT_EQ(RunOp("Cast", {F32({1}, {1})}).status().code(), absl::StatusCode::kInvalidArgument);  // no 'to'
  EXPECT_EQ(RunOp("Cast", {F32({1}, {1})}, 13, {{"to", int64_t{8}}}).status().code(),             // string
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(RunOp("Where", {F32({1}, {1}), F32({1}, {1}), F32({1}, {1})}).status().code(),  // cond not bool
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp("Clip", {F32({1}, {1}), F32({0, 1}, {2})}, 13).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp("Relu", {F32({1}, {1})}, 13, {}, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

// Mod-13 by hand: fmod=0 takes the divisor's sign (Python: -7 % 3 == 2, 7 % -3 == -2);
// fmod=1 the dividend's (C: fmod(-7, 3) == -1). YOLO26 exports use int64 Mod for class ids.
TEST(ModOpTest, IntegerAndFmodSigns) {
  const Tensor a = Tensor::FromVector<int64_t>({-7, 7, 7, -7, 6, 5}, {6});
  const Tensor b = Tensor::FromVector<int64_t>({3, -3, 3, -3, 3, 0}, {6});
  EXPECT_EQ(Values<int64_t>(Run1("Mod", {a, b}, 13)), (std::vector<int64_t>{2, -2, 1, -1, 0, 0}));
  EXPECT_EQ(Values<int64_t>(Run1("Mod", {a, b}, 13, {{"fmod", int64_t{1}}})),
            (std::vector<int64_t>{-1, 1, 1, -1, 0, 0}));
  const Tensor fa = F32({-7.5f, 7.5f}, {2});
  const Tensor fb = F32({2.f, -2.f}, {2});
  EXPECT_THAT(Values<float>(Run1("Mod", {fa, fb}, 13, {{"fmod", int64_t{1}}})), ElementsAre(-1.5f, 1.5f));
  const auto st = RunOp("Mod", {fa, fb}, 13, {{"fmod", int64_t{0}}});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("fmod=1"));
}

}  // namespace
}  // namespace vigil::infer

