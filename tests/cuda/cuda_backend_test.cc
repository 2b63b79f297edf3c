// cuda_backend_test.cc — the CUDA backend against the CPU reference kernels, op by op and in chains.
//
// Every graph is compiled twice: the CPU backend with reference kernels only (the oracle: plain C++
// following the ONNX specification) and the CUDA backend, in fp32 (TF32 off) and fp16. Each model runs
// three times on fresh random inputs: eager, captured into a CUDA graph, replayed. Tolerances (issue
// #4): fp32 relative error max|a − b| / max(1, max|ref|) <= 1e-4; fp16 normalised L2 error
// ||a − b||₂ / ||ref||₂ <= 2e-3. Shapes are odd on purpose (3, 5, 7, 13 channels / pixels).
// Without a GPU every test but the error-path ones skips with a message.
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "infer/backend.h"
#include "vigil/infer/cuda_device.h"
#include "cuda/op_grid_cases.h"
#include "testing/graph_builder.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

using testing::Case;
using testing::Cases;
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

// Non-float outputs (indices, bools, integers) must equal the reference exactly.
bool IsFloatOutput(const Tensor& t) { return t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16; }

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
      if (!IsFloatOutput(want[i])) {
        ASSERT_EQ(got[i].dtype(), want[i].dtype());
        ASSERT_EQ(got[i].shape(), want[i].shape());
        EXPECT_EQ(0, std::memcmp(got[i].raw(), want[i].raw(), want[i].nbytes())) << "differs from the reference";
      } else if (want[i].dtype() == DType::kFloat16) {
        EXPECT_LE(NormalizedL2(got[i], want[i]), 2e-3);
      } else if (fp16) {
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
