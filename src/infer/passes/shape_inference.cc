// shape_inference.cc — InferShapesAndFold (passes.h): types every value with the op schemas and
// folds nodes whose inputs are known at load into initializers, computed by the reference kernels.
#include <algorithm>

#include "absl/strings/match.h"
#include "infer/op_registry.h"
#include "infer/passes/passes.h"

namespace vigil::infer {
namespace {

std::string TypeString(const TensorType& t) { return std::string(DTypeName(t.dtype)) + ShapeToString(t.shape); }

// Shape (ONNX Shape-15: optional start/end, clamped) and Size of a statically typed value: known at
// load whether or not the value itself is.
Tensor ShapeValue(const Node& node, const TensorType& in) {
  if (node.op_type == "Size") return Tensor::Scalar<int64_t>(NumElements(in.shape));
  const int64_t rank = static_cast<int64_t>(in.shape.size());
  auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  const int64_t start = clamp(node.GetInt("start", 0));
  const int64_t end = std::max(start, clamp(node.GetInt("end", rank)));
  std::vector<int64_t> dims(in.shape.begin() + start, in.shape.begin() + end);
  return Tensor::FromVector(dims, {end - start});
}

// Errors from a schema should name the node; add it when they do not.
Status WithNode(const Status& s, const Node& node) {
  return s.ok() || absl::StrContains(s.message(), node.name) ? s : Annotate(s, node.Describe());
}

}  // namespace

Status InferShapesAndFold(Graph& graph) {
  // Start over from the input types (FixInputShapes) so that rewritten values are re-typed.
  std::unordered_map<std::string, TensorType> types;
  for (const ValueInfo& in : graph.inputs) {
    auto it = graph.types.find(in.name);
    if (it == graph.types.end()) {
      return absl::FailedPreconditionError(
          StrCat("graph input '", in.name, "' has no static type (run FixInputShapes first)"));
    }
    types.insert(*it);
  }
  for (const auto& [name, t] : graph.initializers) types[name] = TensorType{t.dtype(), t.shape()};

  std::vector<Node> kept;
  kept.reserve(graph.nodes.size());
  for (Node& node : graph.nodes) {
    const int64_t opset = graph.OpsetOf(node.domain);
    const OpSchema* schema = FindOp(node.domain, node.op_type);
    if (!schema || opset < schema->min_opset) {
      return absl::UnimplementedError(StrCat(
          "unsupported op '", node.domain.empty() ? "" : node.domain + ".", node.op_type, "' (node '", node.name,
          "', opset ", opset, schema ? StrCat("; vigil implements opset ", schema->min_opset, " and later") : "",
          ")"));
    }
    ShapeContext ctx{node, opset, {}, {}};
    bool all_known = node.NumInputs() > 0;
    for (const std::string& in : node.inputs) {
      if (in.empty()) {
        ctx.input_types.emplace_back();
        ctx.input_values.push_back(nullptr);
        continue;
      }
      auto it = types.find(in);
      if (it == types.end()) {
        return absl::InvalidArgumentError(
            StrCat(node.Describe(), ": input '", in, "' has no known type (is the graph sorted and valid?)"));
      }
      ctx.input_types.push_back(it->second);
      ctx.input_values.push_back(graph.FindInitializer(in));
      all_known &= ctx.input_values.back() != nullptr;
    }
    std::vector<TensorType> out_types;
    VIGIL_RETURN_IF_ERROR(WithNode(schema->infer(ctx, &out_types), node));
    if (out_types.size() < node.outputs.size()) {
      return absl::InternalError(StrCat(node.Describe(), ": shape inference gave ", out_types.size(),
                                              " output types for ", node.outputs.size(), " outputs"));
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (!node.outputs[i].empty()) types[node.outputs[i]] = out_types[i];
    }

    const bool shape_of = node.domain.empty() && (node.op_type == "Shape" || node.op_type == "Size") &&
                          node.outputs.size() == 1 && !ctx.input_types.empty();
    if (shape_of) {
      graph.initializers[node.outputs[0]] = ShapeValue(node, ctx.input_types[0]);
      continue;
    }
    if (!all_known || !schema->run) {
      kept.push_back(std::move(node));
      continue;
    }
    std::vector<Tensor> inputs;
    for (const Tensor* t : ctx.input_values) inputs.push_back(t ? *t : Tensor());
    std::vector<Tensor> outputs;
    for (size_t i = 0; i < node.outputs.size(); ++i) outputs.emplace_back(out_types[i].dtype, out_types[i].shape);
    VIGIL_RETURN_IF_ERROR(WithNode(schema->run(KernelContext{node, opset, inputs, outputs}), node));
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (!node.outputs[i].empty()) graph.initializers[node.outputs[i]] = std::move(outputs[i]);
    }
  }
  graph.nodes = std::move(kept);

  for (ValueInfo& out : graph.outputs) {
    auto it = types.find(out.name);
    if (it == types.end()) {
      return absl::InvalidArgumentError(StrCat("graph output '", out.name, "' has no inferred type"));
    }
    const TensorType& t = it->second;
    bool agrees = out.dtype == DType::kUndefined || out.dtype == t.dtype;
    if (out.has_shape) {
      agrees &= out.dims.size() == t.shape.size();
      for (size_t i = 0; agrees && i < out.dims.size(); ++i) {
        agrees = !out.dims[i].is_static() || out.dims[i].value == t.shape[i];
      }
    }
    if (!agrees) {
      return absl::InvalidArgumentError(StrCat("graph output '", out.name, "' is inferred as ", TypeString(t),
                                                     " but the model declares a different type or shape"));
    }
    out.dtype = t.dtype;
    out.has_shape = true;
    out.dims.resize(t.shape.size());
    for (size_t i = 0; i < t.shape.size(); ++i) out.dims[i].value = t.shape[i];
  }
  graph.types = std::move(types);
  return absl::OkStatus();
}

}  // namespace vigil::infer
