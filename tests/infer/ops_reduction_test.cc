// Reference kernels of ops/reduction.cc: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax — hand cases
// from the ONNX spec (including the opset 13 changes), randomized checks against naive loops in
// double, and error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

Node MakeNode(const std::string& op, const std::vector<Tensor>& inputs,
              std::map<std::string, AttrValue> attrs) {
  Node n;
  n.name = "n_" + op;
  n.op_type = op;
  for (size_t i = 0; i < inputs.size(); ++i)
    n.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
  n.outputs = {"y"};
  n.attrs = std::move(attrs);
  return n;
}

StatusOr<Tensor> RunOp(const std::string& op, const std::vector<Tensor>& inputs, int64_t opset,
                       std::map<std::string, AttrValue> attrs = {}) {
  std::vector<Tensor> out;
  VIGIL_RETURN_IF_ERROR(RunReference(MakeNode(op, inputs, std::move(attrs)), opset, inputs, &out));
  return out[0];
}

Tensor Run1(const std::string& op, const std::vector<Tensor>& inputs, int64_t opset,
            std::map<std::string, AttrValue> attrs = {}) {
  auto out = RunOp(op, inputs, opset, std::move(attrs));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : Tensor(DType::kFloat32, {0});
}

Tensor F32(std::vector<float> v, Shape s) { return Tensor::FromVector<float>(v, std::move(s)); }
Tensor I64(std::vector<int64_t> v, Shape s) { return Tensor::FromVector<int64_t>(v, std::move(s)); }
template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// x = [[1, 2, 3], [4, 5, 6]]
const Tensor& X23() {
  static const Tensor x = F32({1, 2, 3, 4, 5, 6}, {2, 3});
  return x;
}

TEST(OpsReduction, ReduceSumAxesAttributeThenInput) {
  // Opset 11: axes attribute; opset 13: axes input (ReduceSum only).
  Tensor y = Run1("ReduceSum", {X23()}, 11, {{"axes", std::vector<int64_t>{1}}});
  EXPECT_EQ(y.shape(), (Shape{2, 1}));
  EXPECT_THAT(Values<float>(y), ElementsAre(6, 15));
  y = Run1("ReduceSum", {X23(), I64({0}, {1})}, 13, {{"keepdims", int64_t{0}}});
  EXPECT_EQ(y.shape(), (Shape{3}));
  EXPECT_THAT(Values<float>(y), ElementsAre(5, 7, 9));
  y = Run1("ReduceSum", {X23(), I64({-1}, {1})}, 13);
  EXPECT_THAT(Values<float>(y), ElementsAre(6, 15));
  // No axes: reduce everything, unless noop_with_empty_axes.
  y = Run1("ReduceSum", {X23()}, 13);
  EXPECT_EQ(y.shape(), (Shape{1, 1}));
  EXPECT_THAT(Values<float>(y), ElementsAre(21));
  y = Run1("ReduceSum", {X23(), I64({}, {0})}, 13, {{"noop_with_empty_axes", int64_t{1}}});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_THAT(Values<float>(y), ElementsAre(1, 2, 3, 4, 5, 6));
  // At opset 13 the attribute is gone (an axes attribute is ignored).
  y = Run1("ReduceSum", {X23()}, 13, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}});
  EXPECT_EQ(y.shape(), (Shape{}));
}

TEST(OpsReduction, OtherReductionsHandCases) {
  const auto attr0 =
      std::map<std::string, AttrValue>{{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}};
  EXPECT_THAT(Values<float>(Run1("ReduceMean", {X23()}, 13, attr0)), ElementsAre(2.5f, 3.5f, 4.5f));
  EXPECT_THAT(Values<float>(Run1("ReduceMax", {X23()}, 13, attr0)), ElementsAre(4, 5, 6));
  EXPECT_THAT(Values<float>(Run1("ReduceMin", {X23()}, 13, attr0)), ElementsAre(1, 2, 3));
  EXPECT_THAT(Values<float>(Run1("ReduceProd", {X23()}, 13, attr0)), ElementsAre(4, 10, 18));
  EXPECT_THAT(Values<float>(Run1("ReduceL2", {X23()}, 13, attr0)),
              ElementsAre(FloatNear(std::sqrt(17.f), 1e-6f), FloatNear(std::sqrt(29.f), 1e-6f),
                          FloatNear(std::sqrt(45.f), 1e-6f)));
  // Opset 18: axes is an input for every Reduce*.
  EXPECT_THAT(Values<float>(Run1("ReduceMax", {X23(), I64({1}, {1})}, 18)), ElementsAre(3, 6));
  EXPECT_THAT(Values<float>(Run1("ReduceMean", {X23(), I64({0, 1}, {2})}, 18)), ElementsAre(3.5f));
  EXPECT_THAT(Values<int64_t>(Run1("ReduceSum", {I64({1, 2, 3, 4}, {2, 2}), I64({1}, {1})}, 13)),
              ElementsAre(3, 7));
  // Reduction over 3-D middle axis: [2,2,2] → [2,1,2].
  const Tensor y = Run1("ReduceSum", {F32({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}), I64({1}, {1})}, 13);
  EXPECT_EQ(y.shape(), (Shape{2, 1, 2}));
  EXPECT_THAT(Values<float>(y), ElementsAre(4, 6, 12, 14));
}

TEST(OpsReduction, ArgMaxArgMinWithTies) {
  const Tensor x = F32({1, 3, 3, 2, 2, 0}, {2, 3});
  Tensor y = Run1("ArgMax", {x}, 13, {{"axis", int64_t{1}}});
  EXPECT_EQ(y.dtype(), DType::kInt64);
  EXPECT_EQ(y.shape(), (Shape{2, 1}));
  EXPECT_THAT(Values<int64_t>(y), ElementsAre(1, 0));
  y = Run1("ArgMax", {x}, 13,
           {{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}, {"keepdims", int64_t{0}}});
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_THAT(Values<int64_t>(y), ElementsAre(2, 1));
  EXPECT_THAT(Values<int64_t>(Run1("ArgMin", {x}, 13, {{"axis", int64_t{-1}}})), ElementsAre(0, 2));
  EXPECT_THAT(Values<int64_t>(Run1("ArgMin", {x}, 13)), ElementsAre(0, 1, 1));  // axis 0 by default
}

TEST(OpsReduction, SoftmaxOpset11CoercesTo2DOpset13UsesOneAxis) {
  // exp(x) = [[1, 2, 3], [4, 1, 2]].
  const Tensor x = F32({0, std::log(2.f), std::log(3.f), std::log(4.f), 0, std::log(2.f)}, {2, 3});
  // Opset 11, axis 0: the input is one row of 6 → each exp / 13.
  EXPECT_THAT(Values<float>(Run1("Softmax", {x}, 11, {{"axis", int64_t{0}}})),
              Pointwise(FloatNear(1e-6f),
                        std::vector<float>{1.f / 13, 2.f / 13, 3.f / 13, 4.f / 13, 1.f / 13, 2.f / 13}));
  // Opset 13, axis 0: each column normalised.
  EXPECT_THAT(Values<float>(Run1("Softmax", {x}, 13, {{"axis", int64_t{0}}})),
              Pointwise(FloatNear(1e-6f), std::vector<float>{0.2f, 2.f / 3, 0.6f, 0.8f, 1.f / 3, 0.4f}));
  EXPECT_THAT(
      Values<float>(Run1("LogSoftmax", {x}, 13, {{"axis", int64_t{0}}})),
      Pointwise(FloatNear(1e-6f), std::vector<float>{std::log(0.2f), std::log(2.f / 3), std::log(0.6f),
                                                     std::log(0.8f), std::log(1.f / 3), std::log(0.4f)}));
  // Default axes differ: [1,2,2] with exp = [[[1,3],[2,2]]]. Opset 11 (axis 1): one row of 4 → /8;
  // opset 13 (axis -1): pairs → [1/4, 3/4, 1/2, 1/2].
  const Tensor x3 = F32({0, std::log(3.f), std::log(2.f), std::log(2.f)}, {1, 2, 2});
  EXPECT_THAT(Values<float>(Run1("Softmax", {x3}, 11)),
              Pointwise(FloatNear(1e-6f), std::vector<float>{0.125f, 0.375f, 0.25f, 0.25f}));
  EXPECT_THAT(Values<float>(Run1("Softmax", {x3}, 13)),
              Pointwise(FloatNear(1e-6f), std::vector<float>{0.25f, 0.75f, 0.5f, 0.5f}));
  EXPECT_THAT(Values<float>(Run1("LogSoftmax", {x3}, 11)),
              Pointwise(FloatNear(1e-6f), std::vector<float>{std::log(0.125f), std::log(0.375f),
                                                             std::log(0.25f), std::log(0.25f)}));
  // Large logits do not overflow (the row maximum is subtracted first).
  EXPECT_THAT(Values<float>(Run1("Softmax", {F32({1000, 1000}, {2})}, 13)), ElementsAre(0.5f, 0.5f));
}

TEST(OpsReduction, RandomReductionsAndSoftmaxMatchNaiveDouble) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-3.f, 3.f);
  for (int iter = 0; iter < 30; ++iter) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    Shape shape(rank);
    for (int64_t& d : shape) d = 1 + rng() % 6;
    Tensor x(DType::kFloat32, shape);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rng);
    const int64_t axis = rng() % rank;
    SCOPED_TRACE(ShapeToString(shape) + " axis " + std::to_string(axis));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
    const int64_t n = shape[axis];
    const float* px = x.data<float>();
    const Tensor sum = Run1("ReduceSum", {x, I64({axis}, {1})}, 13, {{"keepdims", int64_t{0}}});
    const Tensor mx = Run1("ReduceMax", {x}, 13, {{"axes", std::vector<int64_t>{axis}}});
    const Tensor am = Run1("ArgMax", {x}, 13, {{"axis", axis}});
    const Tensor sm = Run1("Softmax", {x}, 13, {{"axis", axis}});
    const Tensor lsm = Run1("LogSoftmax", {x}, 13, {{"axis", axis}});
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < inner; ++j) {
        double s = 0, m = -1e30, es = 0;
        int64_t arg = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double v = px[(o * n + i) * inner + j];
          s += v;
          if (v > m) {
            m = v;
            arg = i;
          }
        }
        for (int64_t i = 0; i < n; ++i) es += std::exp(px[(o * n + i) * inner + j] - m);
        const int64_t r = o * inner + j;
        ASSERT_NEAR(sum.data<float>()[r], s, 1e-5);
        ASSERT_EQ(mx.data<float>()[r], static_cast<float>(m));
        ASSERT_EQ(am.data<int64_t>()[r], arg);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = (o * n + i) * inner + j;
          ASSERT_NEAR(sm.data<float>()[k], std::exp(px[k] - m) / es, 1e-6);
          ASSERT_NEAR(lsm.data<float>()[k], px[k] - m - std::log(es), 1e-5);
        }
      }
    }
  }
}

TEST(OpsReduction, Errors) {
  auto r = RunOp("ReduceSum", {X23(), I64({2}, {1})}, 13);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("node 'n_ReduceSum' (ReduceSum): axis 2 is out of range for rank 2"));
  EXPECT_EQ(RunOp("ReduceMax", {X23()}, 13, {{"axes", std::vector<int64_t>{0, -2}}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // repeated axis
  EXPECT_EQ(RunOp("Softmax", {X23()}, 13, {{"axis", int64_t{2}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp("Softmax", {I64({1}, {1})}, 13).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunOp("ArgMax", {F32({}, {2, 0})}, 13, {{"axis", int64_t{1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // empty axis
  EXPECT_EQ(RunOp("ReduceSum", {X23(), F32({1}, {1})}, 13).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Axes as a non-constant input cannot be typed at load.
  Node node = MakeNode("ReduceSum", {X23(), I64({1}, {1})}, {});
  std::vector<TensorType> types;
  const Status st =
      FindOp("", "ReduceSum")
          ->infer(
              ShapeContext{node, 13, {{DType::kFloat32, {2, 3}}, {DType::kInt64, {1}}}, {nullptr, nullptr}},
              &types);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace vigil::infer
