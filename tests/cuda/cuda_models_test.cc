// cuda_models_test.cc — whole YOLO models on the CUDA backend against the CPU backend.
//
// Models: every *.onnx in $VIGIL_TEST_MODELS (default: the build's testmodels folder, made by
// tools/testmodels/make_models.py: random-weight YOLOv5n/v5nu/v8n/11n/26n/YOLOX-nano exports) and in
// $VIGIL_SHARED_MODELS (default ../shared/models beside the source tree: the real COCO models).
// Input: uniform [0, 1) images from a fresh seed. fp32 (TF32 off) must match the CPU backend within
// rounding: max|a − b| / max(1, max|cpu|) <= 1e-4 (boxes are in pixels, so 1e-4 of 640 is 0.06 px).
// fp16 is checked at detection level on real images by tools/gpu/check_models.py (issue #4); here it
// must run and stay within a normalised L2 error of 0.1 of the CPU result, which catches layout or
// indexing errors (they give errors of order 1) while allowing float16 rounding through ~60 layers
// and the exp() of YOLOX's box decoding on inputs it was not trained for (the real YOLOX-nano gave
// 0.075 on uniform noise, H200, 2026-11-30, and matched every detection on real images).
// QDQ models: a last-bit difference before a QuantizeLinear flips a quantization level, which the next
// layers amplify; the CPU suite compares them with ONNX Runtime by percentile. Here they get a
// normalised L2 error of 0.05 in fp32 (measured 0.028).
// A missing folder is reported, not failed: the pytest suite makes the generated models in CI.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "vigil/infer/cuda_device.h"
#include "testing/graph_builder.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ModelFiles() {
  std::vector<fs::path> dirs;
  const char* generated = std::getenv("VIGIL_TEST_MODELS");
  dirs.emplace_back(generated ? generated : VIGIL_TEST_MODELS_DIR);
  const char* shared = std::getenv("VIGIL_SHARED_MODELS");
  dirs.emplace_back(shared ? fs::path(shared) : fs::path(VIGIL_SOURCE_DIR) / ".." / "shared" / "models");
  std::vector<std::string> files;
  for (const fs::path& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) {
      std::printf("[ NOTE     ] model folder %s is absent: its models are not tested\n", d.c_str());
      continue;
    }
    for (const auto& e : fs::directory_iterator(d)) {
      if (e.path().extension() == ".onnx") files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

class CudaModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModel, MatchesCpuBackend) {
  std::string why;
  if (cuda::ListDevices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
  const std::string& path = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(StrCat(path, " seed ", seed));
  EngineOptions cpu_options;
  auto cpu = Engine::Load(path, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::mt19937 rng(seed);
  std::vector<Tensor> inputs;
  for (const TensorInfo& in : (*cpu)->inputs()) {
    ASSERT_TRUE(in.dtype == DType::kFloat32 || in.dtype == DType::kFloat16) << in.name;
    inputs.push_back(testing::RandomTensor(rng, in.shape, 0.0f, 1.0f));
  }
  std::vector<Tensor> want;
  ASSERT_TRUE((*cpu)->Run(inputs, &want).ok());
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    const bool fp16 = precision == Precision::kFp16;
    SCOPED_TRACE(fp16 ? "fp16" : "fp32");
    EngineOptions options;
    options.device = "cuda:0";
    options.precision = precision;
    auto gpu = Engine::Load(path, options);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (int run = 0; run < 2; ++run) {  // eager, then the CUDA graph
      std::vector<Tensor> got;
      Status st = (*gpu)->Run(inputs, &got);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const Tensor g = got[i].ToFloat32(), w = want[i].ToFloat32();
        const double rel = testing::RelativeError(g, w), l2 = testing::NormalizedL2(g, w);
        std::printf("[ MEASURE  ] %s %s output %zu run %d: relative %.3g, normalised L2 %.3g\n",
                    fs::path(path).filename().c_str(), fp16 ? "fp16" : "fp32", i, run, rel, l2);
        if (fp16) {
          EXPECT_LE(l2, 0.1) << "output " << i;
        } else if (path.find("qdq") != std::string::npos || path.find("int8") != std::string::npos) {
          // Quantized activations: a last-bit difference before a quantization moves a value by one level
          // (the CPU sums the int8 products exactly; the GPU computes on the dequantized values).
          EXPECT_LE(l2, 0.05) << "output " << i;
        } else {
          EXPECT_LE(rel, 1e-4) << "output " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModel, ::testing::ValuesIn(ModelFiles()), [](const auto& param_info) {
  std::string name = fs::path(param_info.param).stem().string();
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaModel);

}  // namespace
}  // namespace vigil::infer
