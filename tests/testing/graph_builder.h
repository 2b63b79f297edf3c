// graph_builder.h — test helpers shared by the backend tests (CPU, CUDA): fresh seeds, random
// tensors, the relative error and normalised L2 measures and a small graph builder whose Finish() types every value with
// the op schemas' infer functions.
// Relative error: max|a − b| / max(1, max|ref|) over float32 tensors; infinity on a shape or dtype
// mismatch. Thread-safety: none (test code).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "infer/op_registry.h"
#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/infer/graph.h"

namespace vigil::infer::testing {

inline constexpr int64_t kOpset = 17;

inline uint32_t FreshSeed() { return std::random_device{}(); }

inline Tensor RandomTensor(std::mt19937& rng, const Shape& shape, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::kFloat32, shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// max|a − b| / max(1, max|ref|); infinity on a shape or dtype mismatch.
inline double RelativeError(const Tensor& a, const Tensor& ref) {
  if (a.dtype() != DType::kFloat32 || ref.dtype() != DType::kFloat32 || a.shape() != ref.shape()) return INFINITY;
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a.data<float>()[i] - ref.data<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(ref.data<float>()[i])));
  }
  return diff / scale;
}

// ||a − b||₂ / ||ref||₂ over the elements as float32 (float16 converted); infinity on a shape mismatch.
inline double NormalizedL2(const Tensor& a, const Tensor& ref) {
  const Tensor fa = a.ToFloat32(), fr = ref.ToFloat32();
  if (fa.shape() != fr.shape()) return INFINITY;
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < fr.numel(); ++i) {
    const double d = fa.data<float>()[i] - fr.data<float>()[i];
    diff += d * d;
    norm += static_cast<double>(fr.data<float>()[i]) * fr.data<float>()[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12);
}

// A graph under construction; Finish() types every value with the op schemas' infer functions.
struct GraphBuilder {
  Graph graph;
  GraphBuilder() { graph.opset = kOpset; }

  void Input(const std::string& name, const Shape& shape, DType dtype = DType::kFloat32) {
    ValueInfo v{name, dtype, {}, true};
    for (int64_t d : shape) v.dims.push_back(Dim{d, ""});
    graph.inputs.push_back(v);
    graph.types[name] = {dtype, shape};
  }
  void Initializer(const std::string& name, Tensor t) {
    graph.types[name] = {t.dtype(), t.shape()};
    graph.initializers[name] = std::move(t);
  }
  Node& Add(const std::string& op_type, std::vector<std::string> inputs, std::vector<std::string> outputs,
            const std::string& domain = "") {
    Node node;
    node.name = absl::StrCat(op_type, "_", graph.nodes.size());
    node.op_type = op_type;
    node.domain = domain;
    node.inputs = std::move(inputs);
    node.outputs = std::move(outputs);
    graph.nodes.push_back(std::move(node));
    return graph.nodes.back();
  }
  void Output(const std::string& name) { graph.outputs.push_back(ValueInfo{name, DType::kFloat32, {}, false}); }

  Status Finish() {
    for (const Node& node : graph.nodes) {
      const OpSchema* schema = FindOp(node.domain, node.op_type);
      if (schema == nullptr) return absl::UnimplementedError(node.Describe());
      ShapeContext ctx{node, kOpset, {}, {}};
      for (const std::string& in : node.inputs) {
        ctx.input_types.push_back(in.empty() ? TensorType{} : graph.types.at(in));
        ctx.input_values.push_back(in.empty() ? nullptr : graph.FindInitializer(in));
      }
      std::vector<TensorType> out;
      VIGIL_RETURN_IF_ERROR(schema->infer(ctx, &out));
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        if (!node.outputs[i].empty()) graph.types[node.outputs[i]] = out[i];
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace vigil::infer::testing
