// alias_plan.cc — PlanAliases, PlanningGraph and the alias kernel (alias_plan.h).
#include "infer/cpu/alias_plan.h"

#include <cstring>
#include <unordered_set>

namespace vigil::infer {
namespace {

bool IsReshapeOp(const Node& node) {
  return node.domain.empty() && (node.op_type == "Reshape" || node.op_type == "Flatten" ||
                                 node.op_type == "Squeeze" || node.op_type == "Unsqueeze");
}

size_t Bytes(const Graph& graph, const std::string& value) {
  const TensorType& t = graph.types.at(value);
  return static_cast<size_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
}

// True when the pieces of a Concat / Split along the node's axis are contiguous byte ranges of
// `whole`: every dimension before the axis is 1.
bool ContiguousPieces(const Node& node, const Shape& whole) {
  const int64_t rank = static_cast<int64_t>(whole.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return false;
  for (int64_t d = 0; d < axis; ++d) {
    if (whole[d] != 1) return false;
  }
  return true;
}

enum class AliasOp { kConcat, kSplit, kReshape };

class AliasKernel final : public CpuKernel {
 public:
  explicit AliasKernel(AliasOp op) : op_(op) {}
  std::string_view name() const override { return "alias"; }
  Status Run(std::span<const Tensor> inputs, std::span<Tensor> outputs) override {
    switch (op_) {
      case AliasOp::kConcat: {  // inputs are consecutive ranges of the output
        auto* dst = static_cast<std::byte*>(outputs[0].raw());
        for (const Tensor& in : inputs) {
          if (in.raw() != dst) std::memcpy(dst, in.raw(), in.nbytes());
          dst += in.nbytes();
        }
        break;
      }
      case AliasOp::kSplit: {  // outputs are consecutive ranges of input 0
        const auto* src = static_cast<const std::byte*>(inputs[0].raw());
        for (Tensor& out : outputs) {
          if (out.raw() != src) std::memcpy(out.raw(), src, out.nbytes());
          src += out.nbytes();
        }
        break;
      }
      case AliasOp::kReshape:
        if (outputs[0].raw() != inputs[0].raw()) std::memcpy(outputs[0].raw(), inputs[0].raw(), outputs[0].nbytes());
        break;
    }
    return absl::OkStatus();
  }

 private:
  AliasOp op_;
};

}  // namespace

Placement Locate(const AliasPlan& aliases, const std::string& value) {
  auto it = aliases.placed.find(value);
  return it == aliases.placed.end() ? Placement{value, 0} : it->second;
}

AliasPlan PlanAliases(const Graph& graph) {
  AliasPlan plan;
  plan.aliased.assign(graph.nodes.size(), false);
  std::unordered_set<std::string> produced;  // arena values
  for (const Node& node : graph.nodes) {
    for (const std::string& out : node.outputs) {
      if (!out.empty() && !graph.IsInitializer(out)) produced.insert(out);
    }
  }
  // `placed` holds direct parents while planning; flattened at the end.
  auto find = [&](const std::string& v) {
    Placement p{v, 0};
    for (auto it = plan.placed.find(p.root); it != plan.placed.end(); it = plan.placed.find(p.root)) {
      p.offset += it->second.offset;
      p.root = it->second.root;
    }
    return p;
  };
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (!node.domain.empty() || node.NumInputs() == 0 || node.outputs.empty()) continue;
    bool outputs_present = true;
    for (const std::string& out : node.outputs) outputs_present &= !out.empty();
    if (!outputs_present) continue;
    const std::string& in0 = node.inputs[0];
    if (IsReshapeOp(node) && node.outputs.size() == 1 && produced.count(in0)) {
      plan.placed[node.outputs[0]] = {in0, 0};
      plan.aliased[i] = true;
    } else if (node.op_type == "Split" && produced.count(in0) && ContiguousPieces(node, graph.types.at(in0).shape)) {
      size_t offset = 0;
      for (const std::string& out : node.outputs) {
        plan.placed[out] = {in0, offset};
        offset += Bytes(graph, out);
      }
      plan.aliased[i] = true;
    } else if (node.op_type == "Concat" && node.outputs.size() == 1 &&
               ContiguousPieces(node, graph.types.at(node.outputs[0]).shape)) {
      const std::string& out = node.outputs[0];
      size_t slot = 0;
      for (size_t j = 0; j < node.inputs.size();) {
        const Placement first = find(node.inputs[j]);
        // The run of inputs j..m-1 that together are exactly the root `first.root`, in order.
        size_t m = j, covered = 0;
        const bool placeable = produced.count(first.root) && first.root != out && first.offset == 0;
        const size_t root_bytes = placeable ? Bytes(graph, first.root) : 0;
        while (placeable && m < node.inputs.size() && covered < root_bytes) {
          const Placement p = find(node.inputs[m]);
          if (p.root != first.root || p.offset != covered) break;
          covered += Bytes(graph, node.inputs[m]);
          ++m;
        }
        if (placeable && covered == root_bytes) {
          plan.placed[first.root] = {out, slot};
          plan.aliased[i] = true;
          slot += covered;
          j = m;
        } else {
          slot += Bytes(graph, node.inputs[j]);
          ++j;
        }
      }
    }
  }
  std::unordered_map<std::string, Placement> flat;
  for (const auto& [value, parent] : plan.placed) flat[value] = find(value);
  plan.placed = std::move(flat);
  return plan;
}

Graph PlanningGraph(const Graph& graph, const AliasPlan& aliases) {
  Graph planning;
  planning.types = graph.types;
  planning.outputs = graph.outputs;
  for (ValueInfo& v : planning.outputs) v.name = Locate(aliases, v.name).root;
  std::unordered_set<std::string> born;
  for (const Node& node : graph.nodes) {
    Node n;
    n.name = node.name;
    for (const std::string& in : node.inputs) n.inputs.push_back(in.empty() ? in : Locate(aliases, in).root);
    for (const std::string& out : node.outputs) {
      const std::string root = out.empty() ? out : Locate(aliases, out).root;
      n.outputs.push_back(!root.empty() && born.insert(root).second ? root : std::string());
    }
    planning.nodes.push_back(std::move(n));
  }
  return planning;
}

std::unique_ptr<CpuKernel> CreateAliasKernel(const Node& node) {
  return std::make_unique<AliasKernel>(node.op_type == "Concat" ? AliasOp::kConcat
                                       : node.op_type == "Split" ? AliasOp::kSplit
                                                                 : AliasOp::kReshape);
}

}  // namespace vigil::infer
