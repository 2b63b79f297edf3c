// conv_bench.cc — Google Benchmark micro-benchmarks of the CPU backend's convolution paths.
//
// BM_FusedConv/<layer>/<path>: one vigil FusedConv (SiLU) node with a YOLOv8n layer's shape at 640x640
// input, compiled by the CPU backend and run through CompiledModel::Run with the oneDNN path (path 1)
// or the reference kernel only (path 0). The node's input is a graph input and its output a graph
// output, both NCHW, so the oneDNN path includes the reorders a lone node needs (inside a model,
// convolutions read and write oneDNN's blocked layout directly: infer/cpu/layout_plan.h).
// Counter FLOPS = 2·MACs per second. Threads: CompileOptions::threads = 1 (--benchmark_filter to pick).
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/strings/str_cat.h"
#include "infer/backend.h"
#include "infer/op_registry.h"

namespace vigil::infer {
namespace {

struct Layer {
  const char* name;
  int64_t ic, oc, k, stride, hw;  // input channels, output channels, kernel, stride, input H = W
};

// A few YOLOv8n (Ultralytics yolov8n.yaml, 640x640) convolutions: stem, C2f bottleneck, 1x1, head.
const Layer kLayers[] = {
    {"model.0 3->16 k3 s2 @640", 3, 16, 3, 2, 640},      {"model.1 16->32 k3 s2 @320", 16, 32, 3, 2, 320},
    {"model.2.m 16->16 k3 @160", 16, 16, 3, 1, 160},      {"model.4.cv2 128->64 k1 @80", 128, 64, 1, 1, 80},
    {"model.6.m 64->64 k3 @40", 64, 64, 3, 1, 40},        {"model.22.cv3.0 80->80 k3 @80", 80, 80, 3, 1, 80},
};

void BM_FusedConv(benchmark::State& state) {
  const Layer& l = kLayers[state.range(0)];
  const bool onednn = state.range(1) != 0;
  state.SetLabel(absl::StrCat(l.name, onednn ? " onednn" : " reference"));
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto random = [&](const Shape& shape) {
    Tensor t(DType::kFloat32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    return t;
  };
  const int64_t out_hw = (l.hw + 2 * (l.k / 2) - l.k) / l.stride + 1;
  Graph g;
  g.opset = 17;
  g.inputs.push_back({"x", DType::kFloat32, {}, false});
  g.outputs.push_back({"y", DType::kFloat32, {}, false});
  g.initializers["w"] = random({l.oc, l.ic, l.k, l.k});
  g.initializers["b"] = random({l.oc});
  g.types["x"] = {DType::kFloat32, {1, l.ic, l.hw, l.hw}};
  g.types["w"] = {DType::kFloat32, {l.oc, l.ic, l.k, l.k}};
  g.types["b"] = {DType::kFloat32, {l.oc}};
  g.types["y"] = {DType::kFloat32, {1, l.oc, out_hw, out_hw}};
  Node node;
  node.name = "conv";
  node.op_type = "FusedConv";
  node.domain = "vigil";
  node.inputs = {"x", "w", "b"};
  node.outputs = {"y"};
  node.attrs["activation"] = std::string("SiLU");
  node.attrs["strides"] = std::vector<int64_t>{l.stride, l.stride};
  node.attrs["pads"] = std::vector<int64_t>(4, l.k / 2);
  g.nodes.push_back(node);

  CompileOptions options;
  options.threads = 1;
  options.use_onednn = onednn;
  auto model = CreateCpuBackend()->Compile(g, options);
  if (!model.ok()) {
    state.SkipWithError(std::string(model.status().message()).c_str());
    return;
  }
  const std::vector<Tensor> inputs{random({1, l.ic, l.hw, l.hw})};
  std::vector<Tensor> outputs;
  for (auto _ : state) {
    if (!(*model)->Run(inputs, &outputs).ok()) state.SkipWithError("Run failed");
    benchmark::DoNotOptimize(outputs.data());
  }
  const double flops = 2.0 * static_cast<double>(l.oc * l.ic * l.k * l.k * out_hw * out_hw);
  state.counters["FLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_FusedConv)
    ->ArgsProduct({benchmark::CreateDenseRange(0, static_cast<int64_t>(std::size(kLayers)) - 1, 1), {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace vigil::infer

BENCHMARK_MAIN();
