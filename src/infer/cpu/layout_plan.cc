// layout_plan.cc — PlanLayouts (layout_plan.h).
#include "infer/cpu/layout_plan.h"

#include <set>
#include <vector>
#include <string_view>
#include <unordered_map>

namespace vigil::infer {
namespace {

// A 4-D float32 value whose channel count is a multiple of `block`.
bool IsBlockable(const Graph& graph, const std::string& name, int64_t block) {
  auto it = graph.types.find(name);
  return it != graph.types.end() && it->second.dtype == DType::kFloat32 && it->second.shape.size() == 4 &&
         it->second.shape[1] % block == 0;
}

bool IsFloat4D(const Graph& graph, const std::string& name) {
  auto it = graph.types.find(name);
  return it != graph.types.end() && it->second.dtype == DType::kFloat32 && it->second.shape.size() == 4;
}

bool IsOneElement(const Graph& graph, const std::string& name) {
  auto it = graph.types.find(name);
  return it != graph.types.end() && NumElements(it->second.shape) == 1;
}

// Elementwise ops whose result at an index depends only on the inputs at that index.
bool IsElementwiseOp(const Node& node) {
  static const std::set<std::string_view> ops = {"Add",  "Sub",       "Mul",         "Div",       "Pow", "Max",
                                                 "Min",  "Sigmoid",   "Relu",        "LeakyRelu", "Tanh", "Exp",
                                                 "Neg",  "Abs",       "Sqrt",        "Erf",       "Clip", "HardSigmoid",
                                                 "HardSwish"};
  return (node.domain.empty() && ops.count(node.op_type) != 0) ||
         (node.domain == "vigil" && node.op_type == "DynamicFakeQuantize");  // global range, then elementwise
}

// A Slice of whole channel blocks of a 4-D value: one axis, the channel axis, step 1, a constant start that is
// a multiple of `block` (the output's channel count is checked by the caller). Like a Split piece, each image's
// channel range [c0, c1) is then one contiguous run in both layouts, so the reference kernel's copy is right
// on blocked data. Exporters write C2f's chunk this way (PyTorch's exporter from a plain module).
bool IsChannelBlockSlice(const Node& node, const Graph& graph, int64_t block) {
  std::vector<int64_t> starts, axes;
  auto ints = [&](size_t i, std::vector<int64_t>* out) {
    if (!node.HasInput(i)) return true;
    const Tensor* t = graph.FindInitializer(node.inputs[i]);
    if (t == nullptr) return false;
    *out = t->ToInt64Vector();
    return true;
  };
  if (node.inputs.size() >= 3) {  // Slice-10+: starts, ends, axes, steps as inputs
    std::vector<int64_t> steps;
    if (!ints(1, &starts) || !ints(3, &axes) || !ints(4, &steps)) return false;
    for (int64_t s : steps) {
      if (s != 1) return false;
    }
  } else {  // Slice-1: attributes
    starts = node.GetInts("starts");
    axes = node.GetInts("axes");
  }
  if (starts.size() != 1 || axes.size() != 1 || (axes[0] != 1 && axes[0] != -3)) return false;
  const int64_t c = graph.types.at(node.inputs[0]).shape[1];
  int64_t start = starts[0] < 0 ? starts[0] + c : starts[0];
  start = start < 0 ? 0 : (start > c ? c : start);
  return start % block == 0;
}

BlockedRole RoleOf(const Node& node, const Graph& graph, int64_t block, bool onednn_runs) {
  if (node.outputs.empty() || node.NumInputs() == 0 || !IsFloat4D(graph, node.inputs[0])) return BlockedRole::kNone;
  for (const std::string& out : node.outputs) {  // an omitted output's channel count is unknown
    if (out.empty() || !IsBlockable(graph, out, block)) return BlockedRole::kNone;
  }
  if (onednn_runs) return BlockedRole::kAnyInput;
  if (!IsBlockable(graph, node.inputs[0], block)) return BlockedRole::kNone;
  if (IsElementwiseOp(node) && node.outputs.size() == 1) {
    const Shape& out_shape = graph.types.at(node.outputs[0]).shape;
    for (const std::string& in : node.inputs) {
      if (in.empty() || IsOneElement(graph, in)) continue;
      if (graph.IsInitializer(in) || !IsFloat4D(graph, in) || graph.types.at(in).shape != out_shape) return BlockedRole::kNone;
    }
    return BlockedRole::kAgnostic;
  }
  if (!node.domain.empty()) return BlockedRole::kNone;
  const int64_t axis = node.GetInt("axis", node.op_type == "Concat" ? -1 : 0);
  if (node.op_type == "Concat" && (axis == 1 || axis == -3)) {
    for (const std::string& in : node.inputs) {
      if (in.empty() || graph.IsInitializer(in) || !IsBlockable(graph, in, block)) return BlockedRole::kNone;
    }
    return BlockedRole::kAgnostic;
  }
  if (node.op_type == "Split" && (axis == 1 || axis == -3)) return BlockedRole::kAgnostic;
  if (node.op_type == "Slice" && node.outputs.size() == 1 && IsChannelBlockSlice(node, graph, block)) {
    return BlockedRole::kAgnostic;
  }
  if ((node.op_type == "Resize" || node.op_type == "Upsample") && node.GetString("mode", "nearest") == "nearest" &&
      node.outputs.size() == 1) {
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      if (!node.inputs[i].empty() && !graph.IsInitializer(node.inputs[i])) return BlockedRole::kNone;
    }
    const Shape& in_shape = graph.types.at(node.inputs[0]).shape;
    const Shape& out_shape = graph.types.at(node.outputs[0]).shape;
    if (out_shape[0] != in_shape[0] || out_shape[1] != in_shape[1]) return BlockedRole::kNone;
    return BlockedRole::kResize;
  }
  return BlockedRole::kNone;
}

}  // namespace

LayoutPlan PlanLayouts(const Graph& graph, int64_t block, const std::function<bool(const Node&)>& onednn_runs,
                       const std::unordered_set<size_t>& keep_nchw) {
  const size_t n = graph.nodes.size();
  std::unordered_map<std::string, size_t> producer;
  std::unordered_map<std::string, std::vector<size_t>> consumers;
  std::vector<BlockedRole> roles(n);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    roles[i] = keep_nchw.count(i) ? BlockedRole::kNone : RoleOf(node, graph, block, onednn_runs(node));
    for (const std::string& out : node.outputs) {
      if (!out.empty()) producer[out] = i;
    }
    for (const std::string& in : node.inputs) {
      if (!in.empty()) consumers[in].push_back(i);
    }
  }
  // A kAnyInput node with an NCHW source gains nothing from blocking unless a consumer can use it.
  auto capable_consumer = [&](const Node& node) {
    for (const std::string& out : node.outputs) {
      for (size_t c : consumers[out]) {
        if (roles[c] != BlockedRole::kNone) return true;
      }
    }
    return false;
  };
  std::vector<bool> blocked(n);
  for (size_t i = 0; i < n; ++i) blocked[i] = roles[i] != BlockedRole::kNone;
  auto input_blocked = [&](const std::string& in) {
    auto p = producer.find(in);
    return p != producer.end() && blocked[p->second];
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (!blocked[i]) continue;
      const Node& node = graph.nodes[i];
      bool keep = true;
      if (roles[i] == BlockedRole::kAnyInput) {
        keep = input_blocked(node.inputs[0]) || capable_consumer(node);
      } else {
        for (const std::string& in : node.inputs) {  // activations; Split sizes, Resize scales are not
          if (!in.empty() && IsFloat4D(graph, in) && !IsOneElement(graph, in) && !input_blocked(in)) keep = false;
        }
      }
      if (!keep) blocked[i] = false, changed = true;
    }
  }

  LayoutPlan plan;
  plan.block = block;
  plan.graph = graph;
  plan.graph.nodes.clear();
  std::unordered_set<std::string> graph_outputs;
  for (const ValueInfo& v : graph.outputs) graph_outputs.insert(v.name);
  std::unordered_map<std::string, std::string> renamed;  // blocked value → its NCHW copy
  for (size_t i = 0; i < n; ++i) {
    Node node = graph.nodes[i];
    for (std::string& in : node.inputs) {
      auto r = renamed.find(in);
      if (!blocked[i] && r != renamed.end()) in = r->second;
    }
    plan.graph.nodes.push_back(node);
    plan.roles.push_back(blocked[i] ? roles[i] : BlockedRole::kNone);
    plan.origin.push_back(static_cast<int64_t>(i));
    if (!blocked[i]) continue;
    for (const std::string& out : node.outputs) {
      plan.blocked_values.insert(out);
      bool nchw_reader = graph_outputs.count(out) != 0;
      for (size_t c : consumers[out]) nchw_reader |= !blocked[c];
      if (!nchw_reader) continue;
      Node convert;
      convert.name = out + "/to_nchw";
      convert.op_type = kToNchwOp;
      convert.domain = kCpuDomain;
      convert.inputs = {out};
      convert.outputs = {out + "#nchw"};
      plan.graph.types[convert.outputs[0]] = graph.types.at(out);
      renamed[out] = convert.outputs[0];
      plan.graph.nodes.push_back(std::move(convert));
      plan.roles.push_back(BlockedRole::kNone);
      plan.origin.push_back(-1);
    }
  }
  for (ValueInfo& v : plan.graph.outputs) {
    auto r = renamed.find(v.name);
    if (r != renamed.end()) v.name = r->second;
  }
  return plan;
}

}  // namespace vigil::infer
