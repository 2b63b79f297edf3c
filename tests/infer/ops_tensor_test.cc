// Tests of the data-movement reference kernels (ops/tensor_ops.cc): hand-computed cases per op and
// opset variant, randomized comparisons against naive index mappings written here, error cases.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

using Attrs = std::map<std::string, AttrValue>;

template <typename T>
Tensor Make(const Shape& shape, const std::vector<T>& values) {
  Tensor t(DTypeOf<T>(), shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel()) << "test data for " << ShapeToString(shape);
  std::copy_n(values.begin(), std::min<int64_t>(t.numel(), static_cast<int64_t>(values.size())), t.data<T>());
  return t;
}
Tensor I64(const std::vector<int64_t>& v) { return Make<int64_t>({static_cast<int64_t>(v.size())}, v); }
Tensor Iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Make<float>(shape, v);
}

// Runs one node through RunReference. Undefined tensors become omitted ("") inputs.
StatusOr<std::vector<Tensor>> RunOp(const std::string& op, int64_t opset, const std::vector<Tensor>& inputs,
                                    const Attrs& attrs = {}, size_t outputs = 1) {
  Node node;
  node.name = "test_" + op;
  node.op_type = op;
  node.attrs = attrs;
  for (size_t i = 0; i < inputs.size(); ++i)
    node.inputs.push_back(inputs[i].defined() ? "x" + std::to_string(i) : "");
  for (size_t i = 0; i < outputs; ++i) node.outputs.push_back("y" + std::to_string(i));
  std::vector<Tensor> out;
  VIGIL_RETURN_IF_ERROR(RunReference(node, opset, inputs, &out));
  return out;
}

Tensor RunOp1(const std::string& op, int64_t opset, const std::vector<Tensor>& inputs,
              const Attrs& attrs = {}) {
  auto out = RunOp(op, opset, inputs, attrs);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0] : Tensor();
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  if (t.dtype() != DTypeOf<T>()) {
    ADD_FAILURE() << "dtype " << DTypeName(t.dtype());
    return {};
  }
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

MATCHER_P(HasCode, code, "") { return arg.code() == code; }

uint32_t FreshSeed() { return std::random_device{}(); }

TEST(ShapeOp, WholeShapeAndStartEndFromOpset15) {
  const Tensor x(DType::kFloat32, {2, 3, 4});
  Tensor y = RunOp1("Shape", 13, {x});
  EXPECT_EQ(y.shape(), Shape{3});
  EXPECT_EQ(Values<int64_t>(y), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(Values<int64_t>(RunOp1("Shape", 15, {x}, {{"start", int64_t{1}}})), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Values<int64_t>(RunOp1("Shape", 15, {x}, {{"start", int64_t{-2}}, {"end", int64_t{-1}}})),
            (std::vector<int64_t>{3}));
  EXPECT_EQ(Values<int64_t>(RunOp1("Shape", 15, {x}, {{"start", int64_t{-10}}, {"end", int64_t{10}}})),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(RunOp1("Shape", 15, {x}, {{"start", int64_t{2}}, {"end", int64_t{1}}}).shape(), Shape{0});
  // Before opset 15 the attributes do not exist.
  EXPECT_EQ(RunOp1("Shape", 13, {x}, {{"start", int64_t{1}}}).shape(), Shape{3});
}

TEST(SizeOp, CountsElements) {
  Tensor y = RunOp1("Size", 13, {Tensor(DType::kUInt8, {2, 3, 5})});
  EXPECT_EQ(y.shape(), Shape{});
  EXPECT_EQ(Values<int64_t>(y), std::vector<int64_t>{30});
}

TEST(ReshapeOp, ZeroCopiesDimensionAndMinusOneIsInferred) {
  const Tensor x = Iota({2, 3, 4});
  Tensor y = RunOp1("Reshape", 13, {x, I64({0, -1})});
  EXPECT_EQ(y.shape(), (Shape{2, 12}));
  EXPECT_EQ(Values<float>(y), Values<float>(x));
  EXPECT_EQ(RunOp1("Reshape", 13, {x, I64({-1, 0, 2})}).shape(), (Shape{4, 3, 2}));
  // allowzero=1 (opset 14): 0 is a real zero-size dimension.
  const Tensor empty(DType::kFloat32, {0, 3});
  EXPECT_EQ(RunOp1("Reshape", 14, {empty, I64({3, 0})}, {{"allowzero", int64_t{1}}}).shape(), (Shape{3, 0}));
  EXPECT_EQ(RunOp1("Reshape", 14, {empty, I64({0, 3})}).shape(), (Shape{0, 3}));
}

TEST(ReshapeOp, RejectsBadShapes) {
  const Tensor x = Iota({2, 3, 4});
  EXPECT_THAT(RunOp("Reshape", 13, {x, I64({-1, -1})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Reshape", 13, {x, I64({5, -1})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Reshape", 13, {x, I64({0, 0, 0, 0})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Reshape", 13, {x, I64({2, 3, 5})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  const auto st = RunOp("Reshape", 13, {x, I64({7, -1})}).status();
  EXPECT_NE(st.message().find("test_Reshape"), std::string::npos) << st;
  EXPECT_NE(st.message().find("[2,3,4]"), std::string::npos) << st;
}

TEST(FlattenOp, SplitsAtAxis) {
  const Tensor x = Iota({2, 3, 4});
  EXPECT_EQ(RunOp1("Flatten", 13, {x}).shape(), (Shape{2, 12}));
  EXPECT_EQ(RunOp1("Flatten", 13, {x}, {{"axis", int64_t{0}}}).shape(), (Shape{1, 24}));
  EXPECT_EQ(RunOp1("Flatten", 13, {x}, {{"axis", int64_t{3}}}).shape(), (Shape{24, 1}));
  EXPECT_EQ(RunOp1("Flatten", 13, {x}, {{"axis", int64_t{-1}}}).shape(), (Shape{6, 4}));
  EXPECT_THAT(RunOp("Flatten", 13, {x}, {{"axis", int64_t{4}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(SqueezeOp, AxesAttributeBefore13InputFrom13) {
  const Tensor x = Iota({1, 3, 1, 2});
  EXPECT_EQ(RunOp1("Squeeze", 11, {x}, {{"axes", std::vector<int64_t>{0}}}).shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(RunOp1("Squeeze", 13, {x, I64({-2})}).shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(RunOp1("Squeeze", 13, {x}).shape(), (Shape{3, 2}));
  EXPECT_EQ(RunOp1("Squeeze", 11, {x}).shape(), (Shape{3, 2}));
  EXPECT_THAT(RunOp("Squeeze", 13, {x, I64({1})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Squeeze", 13, {x, I64({4})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(UnsqueezeOp, AxesIndexTheOutput) {
  const Tensor x = Iota({3, 2});
  Tensor y = RunOp1("Unsqueeze", 11, {x}, {{"axes", std::vector<int64_t>{0, 3}}});
  EXPECT_EQ(y.shape(), (Shape{1, 3, 2, 1}));
  EXPECT_EQ(Values<float>(y), Values<float>(x));
  EXPECT_EQ(RunOp1("Unsqueeze", 13, {x, I64({-1})}).shape(), (Shape{3, 2, 1}));
  EXPECT_EQ(RunOp1("Unsqueeze", 13, {x, I64({1, -1})}).shape(), (Shape{3, 1, 2, 1}));
  EXPECT_THAT(RunOp("Unsqueeze", 13, {x, I64({0, 0})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Unsqueeze", 13, {x, I64({4})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(ConcatOp, NegativeAxisAndMismatch) {
  const Tensor a = Make<float>({2, 2}, {1, 2, 3, 4});
  const Tensor b = Make<float>({2, 1}, {5, 6});
  Tensor y = RunOp1("Concat", 13, {a, b}, {{"axis", int64_t{-1}}});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(Values<float>(y), (std::vector<float>{1, 2, 5, 3, 4, 6}));
  Tensor z = RunOp1("Concat", 13, {a, Make<float>({1, 2}, {7, 8})}, {{"axis", int64_t{0}}});
  EXPECT_EQ(Values<float>(z), (std::vector<float>{1, 2, 3, 4, 7, 8}));
  EXPECT_THAT(RunOp("Concat", 13, {a, b}, {{"axis", int64_t{0}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Concat", 13, {a, I64({1, 2})}, {{"axis", int64_t{0}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Concat", 13, {a, b}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));  // axis required
}

// Element (indices) of a row-major tensor.
int64_t Offset(const Shape& shape, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
  return off;
}
std::vector<int64_t> Unravel(const Shape& shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

TEST(ConcatOp, RandomConcatMatchesNaive) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dim(1, 6);
  const int64_t h = dim(rng) * 40, w = dim(rng);  // H large: the concat runs on several threads
  std::vector<Tensor> in;
  int64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t c = dim(rng);
    Tensor t = Iota({h, c, 1, w});
    for (int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] += 1000.0f * static_cast<float>(i);
    in.push_back(t);
    total += c;
  }
  Tensor y = RunOp1("Concat", 13, in, {{"axis", int64_t{1}}});
  ASSERT_EQ(y.shape(), (Shape{h, total, 1, w}));
  for (int64_t i = 0; i < y.numel(); ++i) {
    std::vector<int64_t> idx = Unravel(y.shape(), i);
    size_t k = 0;
    while (idx[1] >= in[k].dim(1)) idx[1] -= in[k++].dim(1);
    ASSERT_EQ(y.data<float>()[i], in[k].data<float>()[Offset(in[k].shape(), idx)]) << "element " << i;
  }
}

TEST(SplitOp, AttributeBefore13) {
  const Tensor x = Make<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  auto out = RunOp("Split", 11, {x}, {{"axis", int64_t{1}}, {"split", std::vector<int64_t>{1, 2}}}, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Values<float>((*out)[0]), (std::vector<float>{1, 4}));
  EXPECT_EQ(Values<float>((*out)[1]), (std::vector<float>{2, 3, 5, 6}));
  auto equal = RunOp("Split", 11, {x}, {{"axis", int64_t{-1}}}, 3);
  ASSERT_TRUE(equal.ok()) << equal.status();
  EXPECT_EQ(Values<float>((*equal)[2]), (std::vector<float>{3, 6}));
}

TEST(SplitOp, InputFrom13) {
  const Tensor x = Make<float>({5}, {1, 2, 3, 4, 5});
  auto out = RunOp("Split", 13, {x, I64({2, 0, 3})}, {}, 3);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Values<float>((*out)[0]), (std::vector<float>{1, 2}));
  EXPECT_EQ((*out)[1].shape(), Shape{0});
  EXPECT_EQ(Values<float>((*out)[2]), (std::vector<float>{3, 4, 5}));
  EXPECT_THAT(RunOp("Split", 13, {x, I64({2, 2})}, {}, 2).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Split", 13, {x, I64({2, 3})}, {}, 3).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Split", 13, {x}, {}, 2).status(),
              HasCode(absl::StatusCode::kInvalidArgument));  // 5 not even
}

TEST(SplitOp, NumOutputsFrom18LastChunkSmaller) {
  const Tensor x = Make<float>({7}, {1, 2, 3, 4, 5, 6, 7});
  auto out = RunOp("Split", 18, {x}, {{"num_outputs", int64_t{3}}}, 3);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Values<float>((*out)[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Values<float>((*out)[1]), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(Values<float>((*out)[2]), (std::vector<float>{7}));
  EXPECT_THAT(RunOp("Split", 18, {x}, {{"num_outputs", int64_t{2}}}, 3).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(SliceOp, AttributesBeforeOpset10) {
  const Tensor x = Iota({3, 4});
  Tensor y = RunOp1("Slice", 9, {x},
                    {{"starts", std::vector<int64_t>{1}},
                     {"ends", std::vector<int64_t>{1000}},
                     {"axes", std::vector<int64_t>{1}}});
  EXPECT_EQ(y.shape(), (Shape{3, 3}));
  EXPECT_EQ(Values<float>(y), (std::vector<float>{1, 2, 3, 5, 6, 7, 9, 10, 11}));
}

TEST(SliceOp, NegativeStepsAndClamping) {
  const Tensor x = Iota({10});
  auto slice = [&](int64_t start, int64_t end, int64_t step) {
    return Values<float>(RunOp1("Slice", 13, {x, I64({start}), I64({end}), I64({0}), I64({step})}));
  };
  EXPECT_EQ(slice(-1, -100, -2), (std::vector<float>{9, 7, 5, 3, 1}));
  EXPECT_EQ(slice(100, -100, -3), (std::vector<float>{9, 6, 3, 0}));  // start clamps to 9, end to -1
  EXPECT_EQ(slice(2, 100, 3), (std::vector<float>{2, 5, 8}));
  EXPECT_EQ(slice(-3, std::numeric_limits<int64_t>::max(), 1), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(slice(5, 2, 1), std::vector<float>{});
  EXPECT_EQ(slice(std::numeric_limits<int64_t>::max(), 7, -1), (std::vector<float>{9, 8}));
  EXPECT_EQ(slice(-1000, 3, 1), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(slice(-1, -100, std::numeric_limits<int64_t>::min()), std::vector<float>{9});
  EXPECT_EQ(slice(1, 10, std::numeric_limits<int64_t>::max()), std::vector<float>{1});
  EXPECT_THAT(RunOp("Slice", 13, {x, I64({0}), I64({1}), I64({0}), I64({0})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Slice", 13, {x, I64({0}), I64({1}), I64({1})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(SliceOp, RandomSlicesMatchNaive) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 50; ++iter) {
    const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(std::uniform_int_distribution<int64_t>(1, 6)(rng));
    const Tensor x = Iota(shape);
    std::vector<int64_t> starts, ends, axes, steps;
    std::vector<int64_t> all(rank);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int n = std::uniform_int_distribution<int>(1, rank)(rng);
    std::uniform_int_distribution<int64_t> idx(-9, 9), step(-3, 3);
    for (int i = 0; i < n; ++i) {
      axes.push_back(all[i] - (rng() % 2 ? rank : 0));
      starts.push_back(idx(rng));
      ends.push_back(idx(rng));
      int64_t s = 0;
      while (s == 0) s = step(rng);
      steps.push_back(s);
    }
    Tensor y = RunOp1("Slice", 13, {x, I64(starts), I64(ends), I64(axes), I64(steps)});
    // Naive: the spec's per-axis index lists.
    std::vector<std::vector<int64_t>> picks(rank);
    for (int d = 0; d < rank; ++d) {
      for (int64_t i = 0; i < shape[d]; ++i) picks[d].push_back(i);
    }
    for (int i = 0; i < n; ++i) {
      const int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i], dim = shape[a];
      int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i], e = ends[i] < 0 ? ends[i] + dim : ends[i];
      picks[a].clear();
      if (steps[i] > 0) {
        for (int64_t k = std::clamp<int64_t>(s, 0, dim); k < std::clamp<int64_t>(e, 0, dim); k += steps[i])
          picks[a].push_back(k);
      } else {
        for (int64_t k = std::clamp<int64_t>(s, 0, dim - 1); k > std::clamp<int64_t>(e, -1, dim - 1);
             k += steps[i])
          picks[a].push_back(k);
      }
    }
    Shape expect_shape;
    for (auto& p : picks) expect_shape.push_back(static_cast<int64_t>(p.size()));
    ASSERT_EQ(y.shape(), expect_shape) << "iteration " << iter;
    for (int64_t i = 0; i < y.numel(); ++i) {
      std::vector<int64_t> o = Unravel(expect_shape, i);
      for (int d = 0; d < rank; ++d) o[d] = picks[d][o[d]];
      ASSERT_EQ(y.data<float>()[i], x.data<float>()[Offset(shape, o)])
          << "iteration " << iter << " element " << i;
    }
  }
}

TEST(TransposeOp, DefaultPermReversesAxes) {
  Tensor y = RunOp1("Transpose", 13, {Iota({2, 3})});
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(Values<float>(y), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THAT(RunOp("Transpose", 13, {Iota({2, 3})}, {{"perm", std::vector<int64_t>{0, 2}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Transpose", 13, {Iota({2, 3})}, {{"perm", std::vector<int64_t>{1, 1}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Transpose", 13, {Iota({2, 3})}, {{"perm", std::vector<int64_t>{0}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

// Random perms of random shapes, for every element size, against the naive index mapping.
TEST(TransposeOp, RandomPermsMatchNaive) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kUInt8, DType::kFloat16, DType::kFloat32, DType::kInt64};
  for (int iter = 0; iter < 41; ++iter) {
    Shape shape = {3, 70, 80, 7};  // the last iteration is large enough to run on several threads
    if (iter < 40) {
      shape.resize(std::uniform_int_distribution<size_t>(1, 5)(rng));
      for (int64_t& d : shape) d = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    }
    const int rank = static_cast<int>(shape.size());
    const DType dt = dtypes[iter % 4];
    Tensor x(dt, shape);
    const size_t e = DTypeSize(dt);
    for (size_t b = 0; b < x.nbytes(); ++b) static_cast<uint8_t*>(x.raw())[b] = static_cast<uint8_t>(rng());
    std::vector<int64_t> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    Tensor y = RunOp1("Transpose", 13, {x}, {{"perm", perm}});
    Shape expect_shape;
    for (int64_t p : perm) expect_shape.push_back(shape[p]);
    ASSERT_EQ(y.shape(), expect_shape);
    for (int64_t i = 0; i < y.numel(); ++i) {
      const std::vector<int64_t> o = Unravel(expect_shape, i);
      std::vector<int64_t> in(rank);
      for (int d = 0; d < rank; ++d) in[perm[d]] = o[d];
      ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(y.raw()) + i * e,
                            static_cast<const uint8_t*>(x.raw()) + Offset(shape, in) * e, e),
                0)
          << "iteration " << iter << " perm " << ShapeToString(perm) << " element " << i;
    }
  }
}

TEST(GatherOp, AxisAndNegativeIndices) {
  const Tensor x = Iota({2, 3});
  Tensor y = RunOp1("Gather", 13, {x, I64({-1, 0})}, {{"axis", int64_t{1}}});
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(Values<float>(y), (std::vector<float>{2, 0, 5, 3}));
  Tensor row = RunOp1("Gather", 13, {x, Make<int32_t>({}, {-2})});
  EXPECT_EQ(row.shape(), Shape{3});
  EXPECT_EQ(Values<float>(row), (std::vector<float>{0, 1, 2}));
  Tensor m = RunOp1("Gather", 13, {x, Make<int64_t>({2, 2}, {1, 1, 0, 1})});
  EXPECT_EQ(m.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(Values<float>(m), (std::vector<float>{3, 4, 5, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_THAT(RunOp("Gather", 13, {x, I64({3})}, {{"axis", int64_t{1}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Gather", 13, {x, I64({-4})}, {{"axis", int64_t{1}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Gather", 13, {x, I64({0})}, {{"axis", int64_t{2}}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(GatherElementsOp, SpecExample) {
  const Tensor data = Make<float>({2, 2}, {1, 2, 3, 4});
  Tensor y =
      RunOp1("GatherElements", 13, {data, Make<int64_t>({2, 2}, {0, 0, 1, 0})}, {{"axis", int64_t{1}}});
  EXPECT_EQ(Values<float>(y), (std::vector<float>{1, 1, 4, 3}));
  const Tensor d3 = Iota({3, 3});
  Tensor z = RunOp1("GatherElements", 13, {d3, Make<int32_t>({2, 3}, {1, 2, 0, 2, 0, -3})});
  EXPECT_EQ(Values<float>(z), (std::vector<float>{3, 7, 2, 6, 1, 2}));
  EXPECT_THAT(RunOp("GatherElements", 13, {data, Make<int64_t>({2, 2}, {0, 2, 1, 0})}, {{"axis", int64_t{1}}})
                  .status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("GatherElements", 13, {data, Make<int64_t>({2, 3}, {0, 0, 0, 0, 0, 0})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(ExpandOp, BidirectionalBroadcast) {
  const Tensor x = Make<float>({3, 1}, {1, 2, 3});
  Tensor y = RunOp1("Expand", 13, {x, I64({2, 1, 2})});
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(Values<float>(y), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  EXPECT_THAT(RunOp("Expand", 13, {x, I64({2, 2})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(TileOp, RepeatsEachAxis) {
  Tensor y = RunOp1("Tile", 13, {Make<int32_t>({2, 2}, {1, 2, 3, 4}), I64({2, 3})});
  EXPECT_EQ(y.shape(), (Shape{4, 6}));
  EXPECT_EQ(Values<int32_t>(y), (std::vector<int32_t>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4,  //
                                                      1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
  EXPECT_THAT(RunOp("Tile", 13, {Iota({2, 2}), I64({2})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(ConstantOfShapeOp, ValueAttributeAndDefault) {
  Tensor y = RunOp1("ConstantOfShape", 13, {I64({2, 3})}, {{"value", Make<int64_t>({1}, {7})}});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(Values<int64_t>(y), std::vector<int64_t>(6, 7));
  Tensor z = RunOp1("ConstantOfShape", 13, {I64({4})});
  EXPECT_EQ(Values<float>(z), std::vector<float>(4, 0.0f));
  EXPECT_THAT(RunOp("ConstantOfShape", 13, {I64({-1})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(RangeOp, CountIsCeilOfSpanOverDelta) {
  EXPECT_EQ(Values<int64_t>(RunOp1("Range", 13,
                                   {Make<int64_t>({}, {3}), Make<int64_t>({}, {9}), Make<int64_t>({}, {3})})),
            (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(Values<int32_t>(RunOp1(
                "Range", 13, {Make<int32_t>({}, {10}), Make<int32_t>({}, {4}), Make<int32_t>({}, {-3})})),
            (std::vector<int32_t>{10, 7}));
  EXPECT_EQ(Values<int32_t>(RunOp1("Range", 13,
                                   {Make<int32_t>({}, {1}), Make<int32_t>({}, {8}), Make<int32_t>({}, {3})})),
            (std::vector<int32_t>{1, 4, 7}));
  std::vector<float> f = Values<float>(
      RunOp1("Range", 13, {Make<float>({}, {1}), Make<float>({}, {2}), Make<float>({}, {0.3f})}));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FLOAT_EQ(f[3], 1.9f);
  EXPECT_EQ(RunOp1("Range", 13, {Make<float>({}, {5}), Make<float>({}, {1}), Make<float>({}, {1})}).shape(),
            Shape{0});
  EXPECT_THAT(RunOp("Range", 13, {Make<float>({}, {0}), Make<float>({}, {1}), Make<float>({}, {0})}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(TopKOp, TiesBreakByLowerIndex) {
  const Tensor x = Make<float>({5}, {3, 1, 3, 2, 3});
  auto out = RunOp("TopK", 11, {x, I64({2})}, {}, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Values<float>((*out)[0]), (std::vector<float>{3, 3}));
  EXPECT_EQ(Values<int64_t>((*out)[1]), (std::vector<int64_t>{0, 2}));
  auto small = RunOp("TopK", 11, {x, I64({3})}, {{"largest", int64_t{0}}}, 2);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(Values<float>((*small)[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Values<int64_t>((*small)[1]), (std::vector<int64_t>{1, 3, 0}));
}

TEST(TopKOp, AxisOpsetVariantsAndFloat16) {
  const Tensor x = Make<float>({3, 2}, {1, 6, 5, 2, 3, 4});
  auto out =
      RunOp("TopK", 1, {x}, {{"k", int64_t{2}}, {"axis", int64_t{0}}}, 2);  // k attribute before opset 10
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(Values<float>((*out)[0]), (std::vector<float>{5, 6, 3, 4}));
  EXPECT_EQ(Values<int64_t>((*out)[1]), (std::vector<int64_t>{1, 0, 2, 2}));
  std::vector<uint16_t> h;
  for (float v : {0.5f, -2.0f, 7.0f, 0.25f}) h.push_back(FloatToHalf(v));
  Tensor xh(DType::kFloat16, {4});
  std::copy(h.begin(), h.end(), xh.data<uint16_t>());
  auto hout = RunOp("TopK", 13, {xh, I64({2})}, {}, 2);
  ASSERT_TRUE(hout.ok()) << hout.status();
  EXPECT_EQ(HalfToFloat((*hout)[0].data<uint16_t>()[0]), 7.0f);
  EXPECT_EQ(HalfToFloat((*hout)[0].data<uint16_t>()[1]), 0.5f);
  EXPECT_EQ(Values<int64_t>((*hout)[1]), (std::vector<int64_t>{2, 0}));
  EXPECT_THAT(RunOp("TopK", 13, {x, I64({3})}, {}, 2).status(), HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(PadOp, ReflectEdgeConstant) {
  const Tensor x = Make<float>({3}, {1, 2, 3});
  EXPECT_EQ(Values<float>(RunOp1("Pad", 13, {x, I64({2, 2})}, {{"mode", std::string("reflect")}})),
            (std::vector<float>{3, 2, 1, 2, 3, 2, 1}));
  EXPECT_EQ(Values<float>(RunOp1("Pad", 13, {x, I64({2, 1})}, {{"mode", std::string("edge")}})),
            (std::vector<float>{1, 1, 1, 2, 3, 3}));
  EXPECT_EQ(Values<float>(RunOp1("Pad", 13, {x, I64({1, 0}), Make<float>({}, {9})})),
            (std::vector<float>{9, 1, 2, 3}));
  EXPECT_EQ(Values<float>(RunOp1("Pad", 13, {x, I64({-1, 1})})),
            (std::vector<float>{2, 3, 0}));  // negative pads crop
  // Pad-2: pads and value are attributes.
  EXPECT_EQ(Values<float>(RunOp1("Pad", 2, {x}, {{"pads", std::vector<int64_t>{0, 2}}, {"value", 1.5f}})),
            (std::vector<float>{1, 2, 3, 1.5f, 1.5f}));
  EXPECT_THAT(RunOp("Pad", 13, {x, I64({3, 0})}, {{"mode", std::string("reflect")}}).status(),
              HasCode(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RunOp("Pad", 13, {x, I64({1})}).status(), HasCode(absl::StatusCode::kInvalidArgument));
}

TEST(PadOp, TwoDimensionalReflectAndAxesInput) {
  const Tensor x = Make<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor y = RunOp1("Pad", 13, {x, I64({1, 0, 0, 2})}, {{"mode", std::string("reflect")}});
  EXPECT_EQ(y.shape(), (Shape{3, 5}));
  EXPECT_EQ(Values<int32_t>(y), (std::vector<int32_t>{4, 5, 6, 5, 4, 1, 2, 3, 2, 1, 4, 5, 6, 5, 4}));
  Tensor z = RunOp1("Pad", 18, {x, I64({1, 1}), Make<int32_t>({}, {-1}), I64({-1})});  // only the last axis
  EXPECT_EQ(z.shape(), (Shape{2, 5}));
  EXPECT_EQ(Values<int32_t>(z), (std::vector<int32_t>{-1, 1, 2, 3, -1, -1, 4, 5, 6, -1}));
}

TEST(TensorOps, NonConstantShapeInputsAreUnimplementedNotCrashes) {
  Node node;
  node.name = "r";
  node.op_type = "Reshape";
  node.inputs = {"x", "shape"};
  node.outputs = {"y"};
  const OpSchema* schema = FindOp("", "Reshape");
  ASSERT_NE(schema, nullptr);
  ShapeContext ctx{node, 13, {{DType::kFloat32, {2, 3}}, {DType::kInt64, {2}}}, {nullptr, nullptr}};
  std::vector<TensorType> out;
  EXPECT_THAT(schema->infer(ctx, &out), HasCode(absl::StatusCode::kUnimplemented));
}

}  // namespace
}  // namespace vigil::infer
