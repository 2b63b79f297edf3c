// cuda_backend_test.cc — the CUDA backend against the CPU reference kernels, op by op and in chains.
//
// Every graph is compiled twice: the CPU backend with reference kernels only (the oracle: plain C++
// following the ONNX specification) and the CUDA backend, in fp32 (TF32 off) and fp16. Each model runs
// three times on fresh random inputs: eager, captured into a CUDA graph, replayed. Tolerances (issue
// #4): fp32 relative error max|a − b| / max(1, max|ref|) <= 1e-4; fp16 normalised L2 error
// ||a − b||₂ / ||ref||₂ <= 2e-3. Shapes are odd on purpose (3, 5, 7, 13 channels / pixels).
// Without a GPU every test but the error-path ones skips with a message.
#include <cmath>
#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "infer/backend.h"
#include "infer/cuda/device.h"
#include "testing/graph_builder.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

using testing::FreshSeed;
using testing::GraphBuilder;
using testing::RandomTensor;
using testing::NormalizedL2;
using testing::RelativeError;

bool GpuVisible(std::string* why) {
  std::string error;
  const bool ok = !cuda::ListDevices(&error).empty();
  *why = ok ? "" : (error.empty() ? "no device" : error);
  return ok;
}

#define VIGIL_REQUIRE_GPU()                                                                                 \
  do {                                                                                                      \
    std::string why;                                                                                        \
    if (!GpuVisible(&why)) GTEST_SKIP() << "no CUDA device (" << why << "); GPU tests run via scripts/gpu-check.sh"; \
  } while (0)

struct Case {
  std::string name;
  std::function<void(GraphBuilder&, std::mt19937&)> build;  // inputs named in graph.inputs, float32
  std::vector<std::string> expect_kernels;                  // kernels that must appear in the CUDA profile
};

// gtest prints parameters with this (else as raw bytes).
[[maybe_unused]] void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Tensor Weights(std::mt19937& rng, const Shape& shape) {
  const double fan_in = static_cast<double>(NumElements(shape) / shape[0]);
  const float s = static_cast<float>(1.0 / std::sqrt(fan_in));
  return RandomTensor(rng, shape, -s, s);
}

Node& Conv(GraphBuilder& b, std::mt19937& rng, const std::string& in, const std::string& out, int64_t cin,
           int64_t cout, int64_t k, int64_t stride, int64_t pad, int64_t group = 1, const std::string& act = "",
           bool bias = true, int64_t dilation = 1) {
  b.Initializer(out + ".w", Weights(rng, {cout, cin / group, k, k}));
  std::vector<std::string> ins = {in, out + ".w"};
  if (bias) {
    b.Initializer(out + ".b", RandomTensor(rng, {cout}, -0.5f, 0.5f));
    ins.push_back(out + ".b");
  }
  Node& n = act.empty() ? b.Add("Conv", ins, {out}) : b.Add("FusedConv", ins, {out}, "vigil");
  n.attrs["kernel_shape"] = std::vector<int64_t>{k, k};
  n.attrs["strides"] = std::vector<int64_t>{stride, stride};
  n.attrs["pads"] = std::vector<int64_t>{pad, pad, pad, pad};
  n.attrs["dilations"] = std::vector<int64_t>{dilation, dilation};
  n.attrs["group"] = group;
  if (!act.empty()) n.attrs["activation"] = act;
  return n;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"conv3x3_silu_3ch", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {1, 3, 17, 19});
                     Conv(b, rng, "x", "y", 3, 16, 3, 1, 1, 1, "SiLU");
                     b.Output("y");
                   }, {"cudnn"}});
  cases.push_back({"conv1x1_nobias_batch2", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 16, 9, 7});
                     Conv(b, rng, "x", "y", 16, 24, 1, 1, 0, 1, "", false);
                     b.Output("y");
                   }, {"cudnn"}});
  cases.push_back({"depthwise_stride2", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {1, 8, 15, 13});
                     Conv(b, rng, "x", "y", 8, 8, 3, 2, 1, 8, "Relu");
                     b.Output("y");
                   }, {"cudnn"}});
  cases.push_back({"dilated_conv_k5", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {1, 16, 21, 11});
                     Conv(b, rng, "x", "y", 16, 8, 5, 1, 4, 1, "", true, 2);
                     b.Output("y");
                   }, {"cudnn"}});
  // The YOLO body in miniature: NHWC region with pooling, channel concat/split, residual add and
  // nearest upsampling, leaving through ToNchw into a float32 head (reshape, softmax, transpose).
  cases.push_back({"yolo_like_chain", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 32, 24});
                     Conv(b, rng, "x", "c1", 3, 16, 3, 2, 1, 1, "SiLU");
                     Node& pool = b.Add("MaxPool", {"c1"}, {"p1"});
                     pool.attrs["kernel_shape"] = std::vector<int64_t>{5, 5};
                     pool.attrs["pads"] = std::vector<int64_t>{2, 2, 2, 2};
                     b.Add("Concat", {"c1", "p1"}, {"cat"}).attrs["axis"] = int64_t{1};
                     Conv(b, rng, "cat", "c2", 32, 16, 1, 1, 0, 1, "SiLU");
                     b.Initializer("split", Tensor::FromVector<int64_t>({8, 8}, {2}));
                     b.Add("Split", {"c2", "split"}, {"s0", "s1"}).attrs["axis"] = int64_t{1};
                     b.Add("Add", {"s0", "s1"}, {"sum"});
                     b.Initializer("scales", Tensor::FromVector<float>({1, 1, 2, 2}, {4}));
                     Node& up = b.Add("Resize", {"sum", "", "scales"}, {"up"});
                     up.attrs["mode"] = std::string("nearest");
                     up.attrs["coordinate_transformation_mode"] = std::string("asymmetric");
                     up.attrs["nearest_mode"] = std::string("floor");
                     Conv(b, rng, "up", "c3", 8, 12, 3, 1, 1, 1, "SiLU");
                     b.Initializer("shape", Tensor::FromVector<int64_t>({2, 12, -1}, {3}));
                     b.Add("Reshape", {"c3", "shape"}, {"flat"});
                     b.Add("Softmax", {"flat"}, {"soft"}).attrs["axis"] = int64_t{1};
                     b.Add("Transpose", {"soft"}, {"out"}).attrs["perm"] = std::vector<int64_t>{0, 2, 1};
                     b.Add("Sigmoid", {"c2"}, {"gate"});
                     b.Output("out");
                     b.Output("gate");
                   }, {"cudnn", "cuda", "copy"}});
  // Nearest upsampling of 12 NHWC channels: whole 16-byte groups in float32 (4 channels), not in float16 (8),
  // so the grouped and the element-wise resize kernels both run (yolo_like_chain's 8 channels: grouped in both).
  cases.push_back({"resize_after_conv_12ch", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 9, 7});
                     Conv(b, rng, "x", "c", 3, 12, 3, 1, 1, 1, "SiLU");
                     b.Initializer("scales", Tensor::FromVector<float>({1, 1, 2, 2}, {4}));
                     Node& up = b.Add("Resize", {"c", "", "scales"}, {"up"});
                     up.attrs["mode"] = std::string("nearest");
                     up.attrs["coordinate_transformation_mode"] = std::string("asymmetric");
                     up.attrs["nearest_mode"] = std::string("floor");
                     Conv(b, rng, "up", "y", 12, 8, 1, 1, 0, 1, "SiLU");
                     b.Output("y");
                   }, {"cudnn", "cuda"}});
  cases.push_back({"broadcast_elementwise", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("x", {2, 3, 4, 5});
                     b.Initializer("bias", RandomTensor(rng, {3, 1, 1}));
                     b.Initializer("two", Tensor::FromVector<float>({2.0f}, {}));
                     b.Initializer("row", RandomTensor(rng, {5}, 0.5f, 1.5f));
                     b.Add("Add", {"x", "bias"}, {"a"});
                     b.Add("Mul", {"a", "two"}, {"m"});
                     b.Add("Div", {"m", "row"}, {"d"});
                     b.Add("Sub", {"d", "x"}, {"s"});
                     b.Add("Pow", {"s", "two"}, {"p"});
                     b.Add("Exp", {"x"}, {"e"});
                     b.Add("Max", {"p", "e"}, {"y"});
                     b.Output("y");
                   }, {"cuda"}});
  cases.push_back({"slice_focus_and_reverse", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {1, 3, 10, 9});
                     b.Initializer("st", Tensor::FromVector<int64_t>({0, 1}, {2}));
                     b.Initializer("en", Tensor::FromVector<int64_t>({1000, 1000}, {2}));
                     b.Initializer("ax", Tensor::FromVector<int64_t>({2, 3}, {2}));
                     b.Initializer("sp", Tensor::FromVector<int64_t>({2, 2}, {2}));
                     b.Add("Slice", {"x", "st", "en", "ax", "sp"}, {"focus"});
                     b.Initializer("st2", Tensor::FromVector<int64_t>({-1}, {1}));
                     b.Initializer("en2", Tensor::FromVector<int64_t>({-1000}, {1}));
                     b.Initializer("ax2", Tensor::FromVector<int64_t>({3}, {1}));
                     b.Initializer("sp2", Tensor::FromVector<int64_t>({-1}, {1}));
                     b.Add("Slice", {"x", "st2", "en2", "ax2", "sp2"}, {"rev"});
                     b.Output("focus");
                     b.Output("rev");
                   }, {"cuda"}});
  cases.push_back({"matmul_batched_and_weight", [](GraphBuilder& b, std::mt19937& rng) {
                     b.Input("a", {2, 3, 4, 5});
                     b.Input("c", {2, 3, 5, 7});
                     b.Initializer("w", RandomTensor(rng, {7, 6}));
                     b.Add("MatMul", {"a", "c"}, {"ac"});
                     b.Add("MatMul", {"ac", "w"}, {"y"});
                     b.Output("y");
                   }, {"cublas"}});
  cases.push_back({"maxpool_on_input_and_host_fallback", [](GraphBuilder& b, std::mt19937&) {
                     b.Input("x", {1, 5, 13, 11});
                     Node& pool = b.Add("MaxPool", {"x"}, {"p"});
                     pool.attrs["kernel_shape"] = std::vector<int64_t>{3, 3};
                     pool.attrs["strides"] = std::vector<int64_t>{2, 2};
                     pool.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
                     b.Add("ReduceMax", {"p"}, {"r"}).attrs["axes"] = std::vector<int64_t>{1};  // no GPU kernel: host
                     b.Output("p");
                     b.Output("r");
                   }, {"cuda", "host"}});
  return cases;
}

class CudaOpGrid : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(CudaOpGrid, MatchesReference) {
  VIGIL_REQUIRE_GPU();
  const auto& [c, fp16] = GetParam();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(StrCat("case ", c.name, fp16 ? " fp16" : " fp32", " seed ", seed));
  std::mt19937 rng(seed);
  GraphBuilder b;
  c.build(b, rng);
  ASSERT_TRUE(b.Finish().ok()) << b.Finish();
  CompileOptions ref_options;
  ref_options.use_onednn = false;
  auto ref = CreateCpuBackend()->Compile(b.graph, ref_options);
  ASSERT_TRUE(ref.ok()) << ref.status();
  CompileOptions options;
  options.fp16 = fp16;
  auto gpu = CreateCudaBackend()->Compile(b.graph, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  for (int run = 0; run < 3; ++run) {  // eager, capture, replay
    SCOPED_TRACE(StrCat("run ", run));
    std::vector<Tensor> inputs;
    for (const ValueInfo& in : b.graph.inputs) inputs.push_back(RandomTensor(rng, b.graph.types.at(in.name).shape));
    std::vector<Tensor> want, got;
    ASSERT_TRUE((*ref)->Run(inputs, &want).ok());
    Status st = (*gpu)->Run(inputs, &got);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE(StrCat("output ", b.graph.outputs[i].name));
      if (fp16) {
        EXPECT_LE(NormalizedL2(got[i], want[i]), 2e-3);
      } else {
        EXPECT_LE(RelativeError(got[i], want[i]), 1e-4);
      }
    }
  }
  CompileOptions profiled = options;
  profiled.profile = true;
  auto prof = CreateCudaBackend()->Compile(b.graph, profiled);
  ASSERT_TRUE(prof.ok()) << prof.status();
  std::vector<Tensor> inputs, out;
  for (const ValueInfo& in : b.graph.inputs) inputs.push_back(RandomTensor(rng, b.graph.types.at(in.name).shape));
  ASSERT_TRUE((*prof)->Run(inputs, &out).ok());
  for (const std::string& kernel : c.expect_kernels) {
    bool found = false;
    for (const NodeTiming& t : (*prof)->Profile()) found = found || (t.kernel == kernel && t.calls == 1);
    EXPECT_TRUE(found) << "no node ran on kernel '" << kernel << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, CudaOpGrid, ::testing::Combine(::testing::ValuesIn(Cases()), ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::get<0>(param_info.param).name + (std::get<1>(param_info.param) ? "_fp16" : "_fp32");
                         });

// Device-resident runs read the same device buffers Run fills, and many inferences can be enqueued
// before one synchronisation.
TEST(CudaBackend, DeviceResidentRunsMatchHostRuns) {
  VIGIL_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(StrCat("seed ", seed));
  std::mt19937 rng(seed);
  GraphBuilder b;
  b.Input("x", {1, 8, 12, 12});
  Conv(b, rng, "x", "y", 8, 8, 3, 1, 1, 1, "SiLU");
  ASSERT_TRUE(b.Finish().ok());
  b.Output("y");
  EngineOptions options;
  options.device = "cuda:0";
  auto engine = Engine::FromGraph(b.graph, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_NE((*engine)->device_io(), nullptr);
  std::vector<Tensor> in = {RandomTensor(rng, {1, 8, 12, 12})}, first, again;
  ASSERT_TRUE((*engine)->Run(in, &first).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*engine)->EnqueueOnDevice().ok());
  ASSERT_TRUE((*engine)->SynchronizeDevice().ok());
  ASSERT_TRUE((*engine)->Run(in, &again).ok());
  EXPECT_EQ(RelativeError(again[0], first[0]), 0.0);
}

TEST(CudaBackend, BadOrdinalIsAClearError) {
  GraphBuilder b;
  b.Input("x", {1, 2});
  b.Add("Relu", {"x"}, {"y"});
  b.Output("y");
  ASSERT_TRUE(b.Finish().ok());
  EngineOptions options;
  options.device = "cuda:99";
  auto engine = Engine::FromGraph(b.graph, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(engine.status().message()).find("CUDA device 99 is not available"), std::string::npos)
      << engine.status();
  options.device = "cuda:x";
  engine = Engine::FromGraph(b.graph, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePrecision("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vigil::infer
