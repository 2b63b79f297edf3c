// blocked_kernels.cc — nearest Resize on nChw{b}c data (blocked_kernels.h).
#include "infer/cpu/blocked_kernels.h"

#include <cstring>
#include <vector>

#include "infer/ops/op_util.h"

namespace vigil::infer {
namespace {

class BlockedResize final : public CpuKernel {
 public:
  BlockedResize(std::vector<int64_t> source, int64_t block) : source_(std::move(source)), block_(block) {}
  std::string_view name() const override { return "blocked"; }
  Status Run(std::span<const Tensor> inputs, std::span<Tensor> outputs) override {
    const Shape& x = inputs[0].shape();
    const int64_t blocks = x[0] * x[1] / block_;  // (image, channel block) pairs
    const int64_t in_pixels = x[2] * x[3], out_pixels = static_cast<int64_t>(source_.size());
    const float* src = inputs[0].data<float>();
    float* dst = outputs[0].data<float>();
    const size_t bytes = static_cast<size_t>(block_) * sizeof(float);
#pragma omp parallel for num_threads(ThreadsFor(blocks * out_pixels * block_))
    for (int64_t k = 0; k < blocks; ++k) {
      const float* from = src + k * in_pixels * block_;
      float* to = dst + k * out_pixels * block_;
      for (int64_t p = 0; p < out_pixels; ++p) std::memcpy(to + p * block_, from + source_[p] * block_, bytes);
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> source_;  // per output pixel of one plane: its source pixel h·W + w
  int64_t block_;
};

}  // namespace

StatusOr<std::vector<int64_t>> NearestResizeSources(const Node& node, const Graph& graph, int64_t opset) {
  const Shape& x = graph.types.at(node.inputs[0]).shape;
  const Shape& y = graph.types.at(node.outputs[0]).shape;
  const int64_t planes = x[0] * x[1], in_pixels = x[2] * x[3], out_pixels = y[2] * y[3];
  if (planes * in_pixels >= (int64_t{1} << 24)) {
    return NodeError(node, "input ", ShapeToString(x), " is too large to map pixel indices exactly");
  }
  Tensor index(DType::kFloat32, x);
  for (int64_t i = 0; i < index.numel(); ++i) index.data<float>()[i] = static_cast<float>(i);
  std::vector<Tensor> inputs{index};
  for (size_t i = 1; i < node.inputs.size(); ++i) {
    inputs.push_back(node.inputs[i].empty() ? Tensor() : *graph.FindInitializer(node.inputs[i]));
  }
  std::vector<Tensor> outputs;
  VIGIL_RETURN_IF_ERROR(RunReference(node, opset, inputs, &outputs));
  if (outputs.empty() || outputs[0].shape() != y) return NodeError(node, "reference output shape differs from the inferred one");
  // Every plane must copy from the same plane, pixel by pixel as plane 0 does.
  std::vector<int64_t> source(static_cast<size_t>(out_pixels));
  const float* v = outputs[0].data<float>();
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < out_pixels; ++i) {
      const auto from = static_cast<int64_t>(v[p * out_pixels + i]);
      if (from / in_pixels != p || (p > 0 && from % in_pixels != source[i])) {
        return NodeError(node, "is not a per-plane pixel copy; cannot run it on blocked data");
      }
      source[i] = from % in_pixels;
    }
  }
  return source;
}

StatusOr<std::unique_ptr<CpuKernel>> CreateBlockedResize(const Node& node, const Graph& graph, int64_t opset,
                                                         int64_t block) {
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> source, NearestResizeSources(node, graph, opset));
  return std::make_unique<BlockedResize>(std::move(source), block);
}

}  // namespace vigil::infer
