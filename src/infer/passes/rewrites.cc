// rewrites.cc — pattern rewrites of passes.h: DequantizeWeights, RemoveNoOps, FuseConvActivation,
// EliminateDeadNodes. Each keeps the node order topological: a rewritten node stays where the
// first node of its pattern was, which comes before every consumer of the pattern's result.
//
// FuseConvActivation also absorbs Conv → Add(constant broadcast along channels) into Conv's bias
// first: dynamically quantized exports keep the bias as a separate Add (YOLO-NOTES.md), which
// would otherwise sit between the Conv and its activation and block the fusion.
#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include "infer/passes/passes.h"

namespace vigil::infer {
namespace {

constexpr int64_t kOnnxFloat = 1;  // TensorProto.DataType FLOAT, the `to` of Cast

using Uses = std::unordered_map<std::string, std::vector<size_t>>;

// Value → indices of the nodes that read it, one entry per use.
Uses Consumers(const Graph& graph) {
  Uses uses;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const std::string& in : graph.nodes[i].inputs) {
      if (!in.empty()) uses[in].push_back(i);
    }
  }
  return uses;
}

std::unordered_map<std::string, size_t> Producers(const Graph& graph) {
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (const std::string& out : graph.nodes[i].outputs) {
      if (!out.empty()) producer[out] = i;
    }
  }
  return producer;
}

bool IsGraphOutput(const Graph& graph, const std::string& name) {
  for (const ValueInfo& out : graph.outputs) {
    if (out.name == name) return true;
  }
  return false;
}

// Index of the only node reading `value` (one use, not a graph output), or -1.
int64_t SoleConsumer(const Graph& graph, const Uses& uses, const std::string& value) {
  auto it = uses.find(value);
  if (it == uses.end() || it->second.size() != 1 || IsGraphOutput(graph, value)) return -1;
  return static_cast<int64_t>(it->second[0]);
}

// `base`, or `base_<k>` for the first k that names no initializer and no node output.
std::string UniqueName(const Graph& graph, const std::string& base) {
  std::unordered_set<std::string> taken;
  for (const auto& [name, t] : graph.initializers) taken.insert(name);
  for (const Node& node : graph.nodes) taken.insert(node.outputs.begin(), node.outputs.end());
  std::string name = base;
  for (int k = 1; taken.count(name); ++k) name = StrCat(base, "_", k);
  return name;
}

void ReplaceUses(Graph& graph, const std::string& from, const std::string& to) {
  for (Node& node : graph.nodes) {
    for (std::string& in : node.inputs) {
      if (in == from) in = to;
    }
  }
}

void EraseMarked(Graph& graph, const std::vector<bool>& erase) {
  std::vector<Node> kept;
  kept.reserve(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!erase[i]) kept.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(kept);
}

// W = (W_q − W_zp) · w_scale with a scale and zero point per tensor or per output channel
// (ONNX ConvInteger: channel = axis 0 of W; MatMulInteger: channel = last axis of B).
StatusOr<Tensor> DequantizeWeight(const Node& node, const Tensor& wq, const Tensor* wzp, const Tensor& wscale,
                                  bool conv) {
  if (wq.dtype() != DType::kUInt8 && wq.dtype() != DType::kInt8) {
    return absl::InvalidArgumentError(StrCat(node.Describe(), ": quantized weight '", node.inputs[1],
                                                   "' is ", std::string(DTypeName(wq.dtype())),
                                                   ", expected uint8 or int8"));
  }
  if (conv ? wq.rank() < 3 : wq.rank() != 2) {
    return absl::InvalidArgumentError(StrCat(node.Describe(), ": quantized weight '", node.inputs[1],
                                                   "' has shape ", ShapeToString(wq.shape())));
  }
  const int64_t channels = conv ? wq.dim(0) : wq.dim(-1);
  const std::vector<float> q = wq.ToFloatVector();
  const std::vector<float> scale = wscale.ToFloatVector();
  const std::vector<float> zp = wzp ? wzp->ToFloatVector() : std::vector<float>{0.f};
  for (const auto* v : {&scale, &zp}) {
    if (v->size() != 1 && static_cast<int64_t>(v->size()) != channels) {
      return absl::InvalidArgumentError(StrCat(node.Describe(), ": weight ",
                                                     v == &scale ? "scale" : "zero point", " has ", v->size(),
                                                     " values for ", channels, " channels"));
    }
  }
  const int64_t inner = conv ? wq.numel() / channels : 1;
  Tensor w(DType::kFloat32, wq.shape());
  float* out = w.data<float>();
  for (int64_t e = 0; e < wq.numel(); ++e) {
    const size_t c = static_cast<size_t>(conv ? e / inner : e % channels);
    out[e] = (q[e] - zp[zp.size() == 1 ? 0 : c]) * scale[scale.size() == 1 ? 0 : c];
  }
  return w;
}

// The per-output-channel bias [M] that Add(conv_out, b) adds, when b is a float32 initializer
// that broadcasts (ONNX multidirectional broadcasting) along the output's channel axis 1 only.
std::optional<std::vector<float>> ChannelBias(const Graph& graph, const Node& conv, const Node& add) {
  const Tensor* w = conv.HasInput(1) ? graph.FindInitializer(conv.inputs[1]) : nullptr;
  const std::string& other = add.inputs[add.inputs[0] == conv.outputs[0] ? 1 : 0];
  const Tensor* b = graph.FindInitializer(other);
  if (!w || w->rank() < 3 || !b || b->dtype() != DType::kFloat32 || b->rank() > w->rank()) return std::nullopt;
  const int64_t channels = w->dim(0);
  const int channel_axis = b->rank() - (w->rank() - 1);  // output axis 1, counted in b's dims
  for (int a = 0; a < b->rank(); ++a) {
    if (b->dim(a) != 1 && (a != channel_axis || b->dim(a) != channels)) return std::nullopt;
  }
  const std::vector<float> v = b->ToFloatVector();
  std::vector<float> bias(static_cast<size_t>(channels));
  for (size_t c = 0; c < bias.size(); ++c) bias[c] = v[v.size() == 1 ? 0 : c];
  if (conv.HasInput(2)) {
    const Tensor* old = graph.FindInitializer(conv.inputs[2]);
    if (!old || old->numel() != channels) return std::nullopt;
    const std::vector<float> o = old->ToFloatVector();
    for (size_t c = 0; c < bias.size(); ++c) bias[c] += o[c];
  }
  return bias;
}

}  // namespace

Status DequantizeWeights(Graph& graph, Int8Activation activation_mode) {
  const bool quantize_activations = activation_mode != Int8Activation::kFloat;
  const bool exact = activation_mode == Int8Activation::kExactProducts;
  const Uses uses = Consumers(graph);
  const auto producer = Producers(graph);
  auto produced_by = [&](const std::string& value, const char* op_type) -> const Node* {
    auto it = producer.find(value);
    if (it == producer.end()) return nullptr;
    const Node& p = graph.nodes[it->second];
    return p.domain.empty() && p.op_type == op_type ? &p : nullptr;
  };
  std::vector<bool> erase(graph.nodes.size(), false);
  bool changed = false;
  // With quantize_activations: DynamicQuantizeLinear output → its DynamicFakeQuantize node (inserted right after it).
  std::map<std::string, std::pair<std::string, std::string>> fake_quantized;  // (activation, scale)
  std::map<size_t, Node> insert_after;
  for (Node& node : graph.nodes) {
    const bool conv = node.op_type == "ConvInteger";
    if (!node.domain.empty() || (!conv && node.op_type != "MatMulInteger") || !node.HasInput(0) ||
        node.outputs.size() != 1) {
      continue;
    }
    // x_q and x_zp must come from one DynamicQuantizeLinear (it may feed several nodes).
    const Node* dql = produced_by(node.inputs[0], "DynamicQuantizeLinear");
    if (!dql || dql->outputs.size() != 3 || node.inputs[0] != dql->outputs[0] || !node.HasInput(2) ||
        node.inputs[2] != dql->outputs[2]) {
      continue;
    }
    const Tensor* wq = node.HasInput(1) ? graph.FindInitializer(node.inputs[1]) : nullptr;
    const Tensor* wzp = node.HasInput(3) ? graph.FindInitializer(node.inputs[3]) : nullptr;
    if (!wq || (node.HasInput(3) && !wzp)) continue;
    // → Cast(to=float) → Mul(·, x_scale·w_scale), the scale product being a Mul node of its own.
    const int64_t cast = SoleConsumer(graph, uses, node.outputs[0]);
    if (cast < 0 || graph.nodes[cast].op_type != "Cast" || graph.nodes[cast].GetInt("to", 0) != kOnnxFloat) continue;
    const std::string& cast_out = graph.nodes[cast].outputs[0];
    const int64_t mul = SoleConsumer(graph, uses, cast_out);
    if (mul < 0 || graph.nodes[mul].op_type != "Mul" || graph.nodes[mul].inputs.size() != 2) continue;
    const Node& m = graph.nodes[mul];
    const Node* scales = produced_by(m.inputs[m.inputs[0] == cast_out ? 1 : 0], "Mul");
    if (!scales || scales->inputs.size() != 2) continue;
    const std::string& x_scale = dql->outputs[1];
    const Tensor* wscale = scales->inputs[0] == x_scale   ? graph.FindInitializer(scales->inputs[1])
                           : scales->inputs[1] == x_scale ? graph.FindInitializer(scales->inputs[0])
                                                          : nullptr;
    if (!wscale) continue;

    const Tensor unit = Tensor::Scalar<float>(1.f);
    VIGIL_ASSIGN_OR_RETURN(Tensor w, DequantizeWeight(node, *wq, wzp, exact ? unit : *wscale, conv));
    const std::string name = UniqueName(graph, node.inputs[1] + "_dequantized");
    graph.initializers[name] = std::move(w);
    std::string activation = dql->inputs[0];
    if (quantize_activations) {
      auto [it, fresh] = fake_quantized.emplace(dql->outputs[0], std::make_pair(std::string(), std::string()));
      if (fresh) {
        Node fq;
        fq.name = UniqueName(graph, dql->name.empty() ? dql->outputs[0] + "_fake_quantize" : dql->name + "_fake_quantize");
        fq.domain = "vigil";
        fq.op_type = "DynamicFakeQuantize";
        fq.inputs = {dql->inputs[0]};
        fq.outputs = {UniqueName(graph, dql->outputs[0] + (exact ? "_centered" : "_fake_quantized"))};
        if (exact) {
          fq.attrs["centered"] = int64_t{1};
          fq.outputs.push_back(UniqueName(graph, dql->outputs[1] + "_of_fake_quantize"));
        }
        it->second = {fq.outputs[0], exact ? fq.outputs[1] : std::string()};
        insert_after.emplace(producer.at(dql->outputs[0]), std::move(fq));
      }
      activation = it->second.first;
      if (exact) {  // the export's scale product now reads the DynamicFakeQuantize's scale
        Node& scale_mul = graph.nodes[producer.at(scales->outputs[0])];
        for (std::string& in : scale_mul.inputs) {
          if (in == x_scale) in = it->second.second;
        }
      }
    }
    node.op_type = conv ? "Conv" : "MatMul";  // ConvInteger's attributes are Conv's
    node.inputs = {activation, name};
    if (exact) {  // the integer sums in float, then the export's own Mul(x_scale·w_scale)
      node.outputs = {cast_out};
      erase[cast] = true;
    } else {
      node.outputs = {m.outputs[0]};
      erase[cast] = erase[mul] = true;
    }
    changed = true;
  }
  if (!changed) return absl::OkStatus();
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size() + insert_after.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!erase[i]) nodes.push_back(std::move(graph.nodes[i]));
    if (auto it = insert_after.find(i); it != insert_after.end()) nodes.push_back(std::move(it->second));
  }
  graph.nodes = std::move(nodes);
  return EliminateDeadNodes(graph);  // the scale Muls and DynamicQuantizeLinears left unused
}

Status RemoveNoOps(Graph& graph) {
  std::vector<bool> erase(graph.nodes.size(), false);
  auto same_type = [&](const Node& node, bool shape_only) {
    auto in = graph.types.find(node.inputs[0]);
    auto out = graph.types.find(node.outputs[0]);
    if (in == graph.types.end() || out == graph.types.end()) return false;
    return shape_only ? in->second.shape == out->second.shape : in->second == out->second;
  };
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (!node.domain.empty() || !node.HasInput(0) || node.outputs.empty() || node.outputs[0].empty()) continue;
    const std::string& op = node.op_type;
    bool noop = false;
    if (op == "Identity") {
      noop = true;
    } else if (op == "Dropout") {  // a no-op when training_mode (opset 12+) is absent or a false constant
      const Tensor* training = node.HasInput(2) ? graph.FindInitializer(node.inputs[2]) : nullptr;
      const bool mask_used = node.outputs.size() > 1 && !node.outputs[1].empty();
      noop = !mask_used && (!node.HasInput(2) || (training && training->ToInt64Vector() == std::vector<int64_t>{0}));
    } else if (op == "Cast") {
      noop = same_type(node, false);
    } else if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") {
      noop = same_type(node, true);
    }
    if (!noop) continue;
    const std::string x = node.inputs[0];
    const std::string y = node.outputs[0];
    if (!IsGraphOutput(graph, y)) {
      ReplaceUses(graph, y, x);
      erase[i] = true;
      continue;
    }
    // y names a graph output: keep that name by renaming x at its producer, when x is a plain
    // intermediate (not a graph input, initializer or graph output itself).
    if (IsGraphOutput(graph, x)) continue;
    for (size_t p = 0; p < i; ++p) {
      for (std::string& out : graph.nodes[p].outputs) {
        if (out != x || erase[p]) continue;
        out = y;
        ReplaceUses(graph, x, y);
        erase[i] = true;
      }
    }
  }
  EraseMarked(graph, erase);
  return absl::OkStatus();
}

Status SlicesToSplit(Graph& graph) {
  // A Slice's one-axis constant range [start, end) after ONNX's clamping, or nullopt.
  struct Range {
    int64_t axis, start, end;
  };
  auto range_of = [&](const Node& n) -> std::optional<Range> {
    if (!n.domain.empty() || n.op_type != "Slice" || n.outputs.size() != 1 || n.inputs.size() < 3) return std::nullopt;
    auto ints = [&](size_t i) -> std::optional<std::vector<int64_t>> {
      if (!n.HasInput(i)) return std::vector<int64_t>{};
      const Tensor* t = graph.FindInitializer(n.inputs[i]);
      if (t == nullptr) return std::nullopt;
      return t->ToInt64Vector();
    };
    const auto starts = ints(1), ends = ints(2), axes = ints(3), steps = ints(4);
    if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1) return std::nullopt;
    if (!steps->empty() && (steps->size() != 1 || (*steps)[0] != 1)) return std::nullopt;
    auto type = graph.types.find(n.inputs[0]);
    if (type == graph.types.end()) return std::nullopt;
    const int64_t rank = static_cast<int64_t>(type->second.shape.size());
    int64_t axis = axes->empty() ? 0 : (*axes)[0];
    if (axes->size() > 1 || axis < -rank || axis >= rank) return std::nullopt;
    if (axis < 0) axis += rank;
    const int64_t dim = type->second.shape[static_cast<size_t>(axis)];
    auto clamp = [dim](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
    return Range{axis, clamp((*starts)[0]), clamp((*ends)[0])};
  };
  const int64_t opset = graph.OpsetOf("");
  std::map<std::string, std::vector<size_t>> slices_of;  // input value → its Slice nodes
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (graph.nodes[i].op_type == "Slice" && graph.nodes[i].domain.empty() && graph.nodes[i].HasInput(0)) {
      slices_of[graph.nodes[i].inputs[0]].push_back(i);
    }
  }
  std::vector<bool> erase(graph.nodes.size(), false);
  bool changed = false;
  for (auto& [value, idx] : slices_of) {
    if (idx.size() < 2) continue;
    std::vector<std::pair<Range, size_t>> ranges;
    for (size_t i : idx) {
      const std::optional<Range> r = range_of(graph.nodes[i]);
      if (!r) break;
      ranges.emplace_back(*r, i);
    }
    if (ranges.size() != idx.size()) continue;
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.first.start < b.first.start; });
    const int64_t axis = ranges[0].first.axis;
    const int64_t dim = graph.types.at(value).shape[static_cast<size_t>(axis)];
    bool tiles = ranges.front().first.start == 0 && ranges.back().first.end == dim;
    for (size_t k = 0; k < ranges.size() && tiles; ++k) {
      tiles = ranges[k].first.axis == axis && ranges[k].first.end > ranges[k].first.start &&
              (k == 0 || ranges[k].first.start == ranges[k - 1].first.end);
    }
    if (!tiles) continue;
    Node split;
    split.name = UniqueName(graph, value + "_split");
    split.op_type = "Split";
    split.inputs = {value};
    split.attrs["axis"] = axis;
    std::vector<int64_t> sizes;
    for (const auto& [r, i] : ranges) {
      split.outputs.push_back(graph.nodes[i].outputs[0]);
      sizes.push_back(r.end - r.start);
    }
    if (opset >= 13) {
      const std::string name = UniqueName(graph, value + "_split_sizes");
      graph.initializers[name] = Tensor::FromVector<int64_t>(sizes, {static_cast<int64_t>(sizes.size())});
      graph.types[name] = TensorType{DType::kInt64, {static_cast<int64_t>(sizes.size())}};
      split.inputs.push_back(name);
    } else {
      split.attrs["split"] = sizes;
    }
    const size_t first = *std::min_element(idx.begin(), idx.end());
    for (size_t i : idx) erase[i] = true;
    erase[first] = false;
    graph.nodes[first] = std::move(split);
    changed = true;
  }
  if (!changed) return absl::OkStatus();
  EraseMarked(graph, erase);
  return EliminateDeadNodes(graph);  // the Slices' bound initializers
}

Status FuseConvActivation(Graph& graph) {
  const Uses uses = Consumers(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  auto is = [&](size_t i, const char* op_type) {
    return graph.nodes[i].domain.empty() && graph.nodes[i].op_type == op_type;
  };
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!is(i, "Conv") || graph.nodes[i].outputs.size() != 1) continue;
    std::string c = graph.nodes[i].outputs[0];
    // Conv → Add(per-channel constant), as quantized exports leave it: the constant becomes Conv's bias.
    const int64_t add = SoleConsumer(graph, uses, c);
    if (add >= 0 && is(add, "Add") && graph.nodes[add].inputs.size() == 2) {
      if (auto bias = ChannelBias(graph, graph.nodes[i], graph.nodes[add])) {
        Node& conv = graph.nodes[i];
        const std::string name = UniqueName(graph, conv.name + "_bias");
        graph.initializers[name] = Tensor::FromVector(*bias, {static_cast<int64_t>(bias->size())});
        conv.inputs.resize(3);
        conv.inputs[2] = name;
        c = conv.outputs[0] = graph.nodes[add].outputs[0];
        erase[add] = true;
      }
    }
    auto it = uses.find(c);
    if (it == uses.end() || IsGraphOutput(graph, c)) continue;
    const std::vector<size_t>& u = it->second;
    std::string activation;
    std::vector<size_t> absorbed;
    if (u.size() == 1 && is(u[0], "Relu")) {
      activation = "Relu";
      absorbed = {u[0]};
    } else if (u.size() == 2) {  // SiLU: Mul(c, Sigmoid(c)), either input order
      for (size_t k = 0; k < 2 && activation.empty(); ++k) {
        const size_t s = u[k], m = u[1 - k];
        if (!is(s, "Sigmoid") || !is(m, "Mul") || graph.nodes[m].inputs.size() != 2) continue;
        const std::string& sig = graph.nodes[s].outputs[0];
        const auto& mi = graph.nodes[m].inputs;
        if (SoleConsumer(graph, uses, sig) == static_cast<int64_t>(m) &&
            ((mi[0] == c && mi[1] == sig) || (mi[0] == sig && mi[1] == c))) {
          activation = "SiLU";
          absorbed = {s, m};
        }
      }
    }
    if (activation.empty()) continue;
    Node& conv = graph.nodes[i];
    conv.domain = "vigil";
    conv.op_type = "FusedConv";
    conv.attrs["activation"] = activation;
    conv.outputs = {graph.nodes[absorbed.back()].outputs[0]};
    for (size_t a : absorbed) erase[a] = true;
  }
  EraseMarked(graph, erase);
  return absl::OkStatus();
}

Status EliminateDeadNodes(Graph& graph) {
  std::unordered_set<std::string> live;
  for (const ValueInfo& out : graph.outputs) live.insert(out.name);
  std::vector<bool> erase(graph.nodes.size(), true);
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    const Node& node = graph.nodes[i];
    for (const std::string& out : node.outputs) {
      if (!out.empty() && live.count(out)) erase[i] = false;
    }
    if (erase[i]) {
      for (const std::string& out : node.outputs) graph.types.erase(out);
      continue;
    }
    for (const std::string& in : node.inputs) {
      if (!in.empty()) live.insert(in);
    }
  }
  EraseMarked(graph, erase);
  for (auto it = graph.initializers.begin(); it != graph.initializers.end();) {
    if (live.count(it->first)) {
      ++it;
    } else {
      graph.types.erase(it->first);
      it = graph.initializers.erase(it);
    }
  }
  return absl::OkStatus();
}

}  // namespace vigil::infer
