// cpu_backend.cc — the CPU backend: arena binding, kernel choice, Run and profiling (cpu_backend.h).
#include "infer/cpu/cpu_backend.h"

#include <sched.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <omp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "infer/backend.h"
#include "infer/cpu/alias_plan.h"
#include "infer/cpu/blocked_kernels.h"
#include "infer/cpu/layout_plan.h"
#include "infer/cpu/onednn_kernels.h"
#include "infer/op_registry.h"
#include "infer/passes/memory_plan.h"
#include "vigil/common/clock.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

constexpr size_t kArenaAlignment = 64;

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return omp_get_num_procs();
}

std::string TypeString(DType dtype, const Shape& shape) { return absl::StrCat(std::string(DTypeName(dtype)), ShapeToString(shape)); }

class ReferenceKernel final : public CpuKernel {
 public:
  ReferenceKernel(const Node& node, int64_t opset, RunFn run) : node_(node), opset_(opset), run_(run) {}
  std::string_view name() const override { return "reference"; }
  Status Run(std::span<const Tensor> inputs, std::span<Tensor> outputs) override {
    return run_(KernelContext{node_, opset_, inputs, outputs});
  }

 private:
  Node node_;
  int64_t opset_;
  RunFn run_;
};

struct Step {
  std::unique_ptr<CpuKernel> kernel;
  std::string label;            // Node::Describe(), for errors
  std::vector<Tensor> inputs;   // bound at compile time, except graph inputs (bound per Run)
  std::vector<Tensor> outputs;  // arena views
  std::vector<std::pair<size_t, size_t>> graph_inputs;  // (slot in `inputs`, index in graph.inputs)
};

// Where a graph output's value lives: a bound tensor (arena view or initializer) or a graph input.
struct OutputSource {
  Tensor value;
  int graph_input = -1;
};

// The layout plan and one kernel per node of plan.graph.
struct Kernels {
  LayoutPlan plan;
  std::vector<std::unique_ptr<CpuKernel>> kernels;
};

// Chooses the kernels: oneDNN / blocked ones where the layout plan and options allow, the reference
// elsewhere. A node whose blocked kernel cannot be built is re-planned NCHW; a oneDNN failure on an
// NCHW node falls back to the reference kernel. One warning names the first failure.
StatusOr<Kernels> ChooseKernels(const Graph& graph, const CompileOptions& options) {
  bool onednn = false;
  int64_t block = 1;  // no blocked values without oneDNN: nothing produces them
#ifdef VIGIL_HAVE_ONEDNN
  onednn = options.use_onednn;
  block = OnednnChannelBlock();
  auto scratch = std::make_shared<OnednnScratch>();
#endif
  auto onednn_runs = [&](const Node& node) {
#ifdef VIGIL_HAVE_ONEDNN
    return onednn && OnednnHandles(node, graph);
#else
    return false;
#endif
  };
  std::unordered_set<size_t> keep_nchw;
  int failures = 0;
  Status first_failure;
  for (;;) {
    Kernels k;
    k.plan = PlanLayouts(graph, block, onednn_runs, keep_nchw);
    const Graph& g = k.plan.graph;
    bool replan = false;
    for (size_t i = 0; i < g.nodes.size() && !replan; ++i) {
      const Node& node = g.nodes[i];
      const BlockedRole role = k.plan.roles[i];
      auto layout = [&](const std::string& v) {
        return k.plan.blocked_values.count(v) ? Layout::kBlocked : Layout::kNchw;
      };
      StatusOr<std::unique_ptr<CpuKernel>> kernel = std::unique_ptr<CpuKernel>();
#ifdef VIGIL_HAVE_ONEDNN
      if (node.domain == kCpuDomain && node.op_type == kToNchwOp) {
        kernel = CreateOnednnReorder(g.types.at(node.inputs[0]).shape, Layout::kBlocked, Layout::kNchw, block, node.name,
                                     scratch);
      } else if (role == BlockedRole::kAnyInput || (role == BlockedRole::kNone && onednn && OnednnHandles(node, g))) {
        kernel = CreateOnednnKernel(node, g, layout(node.inputs[0]), layout(node.outputs[0]), block, scratch);
        if (kernel.ok() && *kernel == nullptr) kernel = absl::InternalError(node.Describe() + ": oneDNN does not apply");
      }
#endif
      if (role == BlockedRole::kResize) kernel = CreateBlockedResize(node, g, g.OpsetOf(node.domain), block);
      if (!kernel.ok()) {
        if (failures++ == 0) first_failure = kernel.status();
        if (k.plan.origin[i] < 0) return kernel.status();  // a layout conversion: nothing to fall back to
        if (role != BlockedRole::kNone) {
          keep_nchw.insert(static_cast<size_t>(k.plan.origin[i]));
          replan = true;
          continue;
        }
        kernel = std::unique_ptr<CpuKernel>();
      }
      if (*kernel == nullptr) {
        const OpSchema* schema = FindOp(node.domain, node.op_type);  // checked by Create
        kernel = std::make_unique<ReferenceKernel>(node, g.OpsetOf(node.domain), schema->run);
      }
      k.kernels.push_back(*std::move(kernel));
    }
    if (replan) continue;
    if (failures > 0) {
      spdlog::warn("{} node(s) could not use their fast kernel and run on the reference kernels; first: {}", failures,
                   std::string(first_failure.message()));
    }
    return k;
  }
}

class CpuCompiledModel final : public CompiledModel {
 public:
  static StatusOr<std::unique_ptr<CompiledModel>> Create(const Graph& graph, const CompileOptions& options);

  Status Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) override;
  std::vector<NodeTiming> Profile() const override { return timings_; }
  void ResetProfile() override {
    for (NodeTiming& t : timings_) t.total_ms = 0, t.calls = 0;
  }
  size_t ArenaBytes() const override { return arena_.nbytes(); }

 private:
  CpuCompiledModel() = default;

  std::vector<TensorInfo> inputs_;
  std::vector<OutputSource> outputs_;
  Tensor arena_;
  std::vector<Step> steps_;
  std::vector<NodeTiming> timings_;  // index-aligned with steps_
  int threads_ = 1;
  bool profile_ = false;
};

StatusOr<std::unique_ptr<CompiledModel>> CpuCompiledModel::Create(const Graph& graph, const CompileOptions& options) {
  for (const Node& node : graph.nodes) {
    const int64_t opset = graph.OpsetOf(node.domain);
    const OpSchema* schema = FindOp(node.domain, node.op_type);
    if (schema == nullptr || schema->run == nullptr || opset < schema->min_opset) {
      return absl::UnimplementedError(absl::StrCat("unsupported op '", node.op_type, "' (node '", node.name,
                                                   "', opset ", opset, ")"));
    }
  }
  std::unique_ptr<CpuCompiledModel> model(new CpuCompiledModel());
  model->threads_ = ResolveThreads(options.threads);
  model->profile_ = options.profile;
  omp_set_num_threads(model->threads_);  // before oneDNN sizes its primitives

  // Every value a node can read: initializers (shared storage), node outputs (arena views); graph
  // inputs are bound per Run.
  std::unordered_map<std::string, Tensor> values;
  std::unordered_map<std::string, size_t> graph_input_index;
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const std::string& name = graph.inputs[i].name;
    auto t = graph.types.find(name);
    if (t == graph.types.end()) {
      return absl::FailedPreconditionError(absl::StrCat("graph input '", name, "' has no static type"));
    }
    graph_input_index[name] = i;
    model->inputs_.push_back({name, t->second.dtype, t->second.shape});
  }
  for (const auto& [name, tensor] : graph.initializers) values[name] = tensor;
  for (const Node& node : graph.nodes) {
    for (const std::string& out : node.outputs) {
      if (!out.empty() && !graph.types.count(out)) {
        return absl::FailedPreconditionError(
            absl::StrCat(node.Describe(), ": output '", out, "' has no inferred type (run shape inference first)"));
      }
    }
  }

  VIGIL_ASSIGN_OR_RETURN(Kernels chosen, ChooseKernels(graph, options));
  const Graph& g = chosen.plan.graph;
  const AliasPlan aliases = PlanAliases(g);
  const MemoryPlan plan = PlanMemory(PlanningGraph(g, aliases), kArenaAlignment);
  model->arena_ = Tensor(DType::kUInt8, {static_cast<int64_t>(plan.arena_bytes)});
  auto* arena = static_cast<std::byte*>(model->arena_.raw());

  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    Step step;
    step.kernel = aliases.aliased[n] ? CreateAliasKernel(node) : std::move(chosen.kernels[n]);
    step.label = node.Describe();
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const std::string& in = node.inputs[i];
      if (in.empty()) {
        step.inputs.emplace_back();
      } else if (auto gi = graph_input_index.find(in); gi != graph_input_index.end()) {
        step.graph_inputs.emplace_back(i, gi->second);
        step.inputs.emplace_back();
      } else if (auto v = values.find(in); v != values.end()) {
        step.inputs.push_back(v->second);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": input '", in, "' is produced by no earlier node"));
      }
    }
    for (const std::string& out : node.outputs) {
      if (out.empty()) {
        step.outputs.emplace_back();
        continue;
      }
      const TensorType& t = g.types.at(out);
      const Placement place = Locate(aliases, out);
      step.outputs.push_back(Tensor::Wrap(t.dtype, t.shape, arena + plan.offsets.at(place.root) + place.offset));
      values[out] = step.outputs.back();
    }
    model->timings_.push_back({node.name, node.op_type, std::string(step.kernel->name()), 0.0, 0});
    model->steps_.push_back(std::move(step));
  }

  for (const ValueInfo& out : g.outputs) {
    OutputSource source;
    if (auto gi = graph_input_index.find(out.name); gi != graph_input_index.end()) {
      source.graph_input = static_cast<int>(gi->second);
    } else if (auto v = values.find(out.name); v != values.end()) {
      source.value = v->second;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("graph output '", out.name, "' is produced by no node"));
    }
    model->outputs_.push_back(std::move(source));
  }
  return std::unique_ptr<CompiledModel>(std::move(model));
}

Status CpuCompiledModel::Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) {
  if (inputs.size() != inputs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", inputs_.size(), " input(s), got ", inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorInfo& want = inputs_[i];
    if (inputs[i].dtype() != want.dtype || inputs[i].shape() != want.shape) {
      return absl::InvalidArgumentError(absl::StrCat("input '", want.name, "': expected ",
                                                     TypeString(want.dtype, want.shape), ", got ",
                                                     TypeString(inputs[i].dtype(), inputs[i].shape())));
    }
  }
  omp_set_num_threads(threads_);
  for (size_t s = 0; s < steps_.size(); ++s) {
    Step& step = steps_[s];
    for (const auto& [slot, index] : step.graph_inputs) {
      step.inputs[slot] = Tensor::Wrap(inputs[index].dtype(), inputs[index].shape(), const_cast<void*>(inputs[index].raw()));
    }
    const int64_t start_ns = profile_ ? SystemClock()->SteadyNs() : 0;
    Status status = step.kernel->Run(step.inputs, step.outputs);
    if (profile_) {
      timings_[s].total_ms += static_cast<double>(SystemClock()->SteadyNs() - start_ns) / 1e6;
      ++timings_[s].calls;
    }
    if (!status.ok()) {
      return status.code() == absl::StatusCode::kInternal
                 ? status
                 : absl::InternalError(absl::StrCat(step.label, ": ", std::string(status.message())));
    }
  }
  outputs->clear();
  for (const OutputSource& source : outputs_) {
    outputs->push_back(source.graph_input >= 0 ? inputs[source.graph_input].Clone() : source.value.Clone());
  }
  return absl::OkStatus();
}

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  bool Supports(const Node& node, int64_t opset) const override {
    const OpSchema* schema = FindOp(node.domain, node.op_type);
    return schema != nullptr && schema->run != nullptr && opset >= schema->min_opset;
  }
  StatusOr<std::unique_ptr<CompiledModel>> Compile(const Graph& graph, const CompileOptions& options) override {
    return CpuCompiledModel::Create(graph, options);
  }
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend() { return std::make_unique<CpuBackend>(); }

StatusOr<BackendPlan> Backend::Plan(const Graph& graph, const CompileOptions& /*options*/) const {
  BackendPlan plan;
  for (const Node& node : graph.nodes) {
    if (!Supports(node, graph.OpsetOf(node.domain))) {
      return absl::UnimplementedError(StrCat("unsupported op '", node.op_type, "' (node '", node.name, "')"));
    }
    plan.nodes.push_back({node.name.empty() ? node.Describe() : node.name,
                          node.QualifiedOpType(),
                          std::string(name()), "", false, false});
  }
  return plan;
}

}  // namespace vigil::infer
