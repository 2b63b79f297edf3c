// cuda_backend.cc — the CUDA backend: layout and memory planning, kernel choice, Run, CUDA graphs
// (cuda_backend.h). Each op's kernel is made in cuda_kernels_body.cc / cuda_kernels_reference.cc (cuda_build.h).
#include "infer/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cudnn.h>
#include <spdlog/spdlog.h>

#include "infer/backend.h"
#include "infer/cpu/blocked_kernels.h"
#include "infer/cpu/layout_plan.h"
#include "vigil/infer/cuda_util.h"
#include "infer/cuda/cuda_build.h"
#include "infer/cuda/cudnn_conv.h"
#include "infer/cuda/kernels.h"
#include "infer/cuda/plan_cache.h"
#include "infer/op_registry.h"
#include "infer/ops/op_util.h"
#include "infer/passes/memory_plan.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

using namespace cuda_build;  // NOLINT: the kernel makers and their device values
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

bool GpuConvRuns(const Node& node, const Graph& graph) {
  const bool conv = (node.domain.empty() && node.op_type == "Conv") || (node.domain == "vigil" && node.op_type == "FusedConv");
  const bool pool = node.domain.empty() && node.op_type == "MaxPool" && (node.outputs.size() < 2 || node.outputs[1].empty());
  if (!conv && !pool) return false;
  auto it = graph.types.find(node.inputs[0]);
  if (it == graph.types.end() || it->second.shape.size() != 4 || it->second.dtype != DType::kFloat32) return false;
  return !conv || (node.HasInput(1) && graph.IsInitializer(node.inputs[1]));
}

// Whether the backend takes the op at all: every op needs a reference kernel (a GPU kernel or the host fallback).
bool HasReferenceKernel(const Node& node, int64_t opset) {
  const OpSchema* schema = FindOp(node.domain, node.op_type);
  return schema != nullptr && schema->run != nullptr && opset >= schema->min_opset;
}

Status CheckOps(const Graph& graph) {
  for (const Node& node : graph.nodes) {
    if (!HasReferenceKernel(node, graph.OpsetOf(node.domain))) {
      return absl::UnimplementedError(StrCat("unsupported op '", node.op_type, "' (node '", node.name, "')"));
    }
  }
  return absl::OkStatus();
}

// Why a node has no GPU kernel: the Unsupported message without the node's own description.
std::string FallbackReason(const Node& node, const Status& st) {
  std::string m(st.message());
  const std::string prefix = node.Describe() + ": ";
  if (m.rfind(prefix, 0) == 0) m.erase(0, prefix.size());
  return m;
}

// Node i's GPU kernel (MakeGpuKernel), or why it has none: a node of the NHWC region is then re-planned NCHW
// (`replan`: its model node's index goes into *keep_nchw), any other falls back to the host (`fallback`: the
// reason). The one rule both PlanDry and Compile follow. Errors: a kernel that failed to build; a layout
// conversion without a kernel.
struct Choice {
  std::unique_ptr<CudaKernel> kernel;  // null: no GPU kernel
  std::string fallback;                // no kernel and no re-plan: why (the host runs it)
  bool replan = false;
};
StatusOr<Choice> ChooseKernel(Build& b, const LayoutPlan& plan, size_t i, std::unordered_set<size_t>* keep_nchw) {
  StatusOr<std::unique_ptr<CudaKernel>> kernel = MakeGpuKernel(b);
  if (kernel.ok()) return Choice{*std::move(kernel), "", false};
  if (kernel.status().code() != absl::StatusCode::kUnimplemented) return Annotate(kernel.status(), b.node.Describe());
  if (plan.origin[i] < 0) return kernel.status();  // a layout conversion has no fallback
  if (plan.roles[i] != BlockedRole::kNone) {
    spdlog::debug("{}; re-planned NCHW", std::string(kernel.status().message()));
    keep_nchw->insert(static_cast<size_t>(plan.origin[i]));
    return Choice{nullptr, "", true};
  }
  return Choice{nullptr, FallbackReason(b.node, kernel.status()), false};
}

// Backend::Plan, and the layout Compile starts from: the same planning and kernel choice as Compile with
// Resources::dry (no device). `keep_nchw` receives the nodes re-planned NCHW because their NHWC kernel
// could not be built.
StatusOr<BackendPlan> PlanDry(const Graph& graph, const CompileOptions& options, std::unordered_set<size_t>* keep_nchw) {
  VIGIL_RETURN_IF_ERROR(CheckOps(graph));
  const DType compute = options.fp16 ? DType::kFloat16 : DType::kFloat32;
  for (;;) {
    Resources res;
    res.dry = true;
    res.device = options.device_ordinal;
    res.fp16 = options.fp16;
    res.allow_tf32 = options.allow_tf32;
    LayoutPlan plan = PlanLayouts(graph, 1, [&](const Node& n) { return GpuConvRuns(n, graph); }, *keep_nchw);
    const Graph& g = plan.graph;
    std::unordered_map<std::string, Value> values;
    auto add = [&](const std::string& name) -> StatusOr<void*> {
      const TensorType& t = g.types.at(name);
      const bool nhwc = plan.blocked_values.count(name) != 0;
      const DType dt = nhwc ? compute : t.dtype;
      VIGIL_ASSIGN_OR_RETURN(void* p, res.Alloc(static_cast<size_t>(NumElements(t.shape)) * DTypeSize(dt), name));
      values[name] = Value{p, dt, t.shape, nhwc};
      return p;
    };
    for (const ValueInfo& in : g.inputs) VIGIL_RETURN_IF_ERROR(add(in.name).status());
    for (const Node& node : g.nodes) {
      for (const std::string& out : node.outputs) {
        if (!out.empty() && !values.count(out)) VIGIL_RETURN_IF_ERROR(add(out).status());
      }
    }
    BackendPlan out;
    out.channels_last_values = static_cast<int>(plan.blocked_values.size());
    bool replan = false;
    for (size_t i = 0; i < g.nodes.size() && !replan; ++i) {
      const Node& node = g.nodes[i];
      Build b{g, node, plan.roles[i], g.OpsetOf(node.domain), values, res};
      VIGIL_ASSIGN_OR_RETURN(Choice c, ChooseKernel(b, plan, i, keep_nchw));
      replan = c.replan;
      if (replan) continue;
      NodePlacement& p = out.nodes.emplace_back();
      p.node = node.name.empty() ? node.Describe() : node.name;
      p.op = node.QualifiedOpType();
      p.conversion = plan.origin[i] < 0;
      p.channels_last = std::any_of(node.outputs.begin(), node.outputs.end(),
                                    [&](const std::string& o) { return plan.blocked_values.count(o) != 0; });
      p.kernel = c.kernel ? std::string(c.kernel->name()) : "host";
      p.reason = c.fallback;
      out.host_nodes += c.kernel ? 0 : 1;
    }
    if (replan) continue;
    for (const NodePlacement& p : out.nodes) out.conversions += p.conversion ? 1 : 0;
    return out;
  }
}

// ---- The compiled model ------------------------------------------------------------------------

struct Step {
  std::unique_ptr<CudaKernel> kernel;
  std::string label;
};

struct OutputSource {
  Value device;           // NCHW, declared dtype
  Tensor constant;        // an initializer that is a graph output
  int graph_input = -1;   // a graph input that is a graph output
  void* staging = nullptr;
};

class CudaCompiledModel final : public CompiledModel {
 public:
  static StatusOr<std::unique_ptr<CompiledModel>> Create(const Graph& graph, const CompileOptions& options);
  ~CudaCompiledModel() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Status Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) override;
  const DeviceIo* device_io() const override { return &io_; }
  Status EnqueueOnDevice() override;
  Status SynchronizeDevice() override;
  std::vector<NodeTiming> Profile() const override { return timings_; }
  void ResetProfile() override {
    for (NodeTiming& t : timings_) t.total_ms = 0, t.calls = 0;
  }
  size_t ArenaBytes() const override { return arena_.bytes(); }

 private:
  CudaCompiledModel() = default;
  Status EnqueueSteps(bool profile);
  Status Capture();

  std::unique_ptr<Resources> res_;
  DeviceBuffer arena_, workspace_;
  std::vector<TensorInfo> inputs_;
  std::vector<DeviceBuffer> input_buffers_;
  std::vector<PinnedBuffer> input_staging_, output_staging_;
  std::vector<OutputSource> outputs_;
  std::vector<Step> steps_;
  std::vector<NodeTiming> timings_;
  std::vector<cudaEvent_t> events_;
  DeviceIo io_;
  bool profile_ = false, use_graph_ = true, pending_profile_ = false;
  int runs_ = 0;
  cudaGraphExec_t exec_ = nullptr;
};

StatusOr<std::unique_ptr<CompiledModel>> CudaCompiledModel::Create(const Graph& graph, const CompileOptions& options) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || options.device_ordinal < 0 || options.device_ordinal >= count) {
    return absl::FailedPreconditionError(
        StrCat("CUDA device ", options.device_ordinal, " is not available (",
               e == cudaSuccess ? StrCat(count, " device(s) visible") : std::string(cudaGetErrorString(e)), ")"));
  }
  // The layout and the kernels as Plan decides them (no device work); the build below follows that plan and
  // re-plans only where the device disagrees (a convolution cuDNN has no engine for).
  std::unordered_set<size_t> keep_nchw;
  VIGIL_RETURN_IF_ERROR(PlanDry(graph, options, &keep_nchw).status());
  const DType compute = options.fp16 ? DType::kFloat16 : DType::kFloat32;
  // cuDNN plan choices: the process's cache, merged with the file when one is named.
  std::string plan_file = options.cudnn_plan_cache;
  if (const char* env = std::getenv("VIGIL_CUDNN_PLAN_CACHE"); plan_file.empty() && env != nullptr) plan_file = env;
  cuda::PlanCache& plan_cache = cuda::PlanCache::Global();
  if (!plan_file.empty()) {
    if (Status st = plan_cache.Load(plan_file); !st.ok()) {
      spdlog::warn("{}; ignored (rewritten after this load)", std::string(st.message()));
    }
  }
  cuda::PlanCacheStats plan_stats;
  cuda::PlanLookup plan_lookup;
  if (StatusOr<std::string> sig = cuda::DeviceSignature(options.device_ordinal); sig.ok()) {
    plan_lookup = {&plan_cache, *sig, &plan_stats};
  } else {
    spdlog::warn("cuDNN plan cache unused: {}", std::string(sig.status().message()));
  }
  for (;;) {
    std::unique_ptr<CudaCompiledModel> model(new CudaCompiledModel());
    model->profile_ = options.profile;
    model->use_graph_ = options.cuda_graph && !options.profile;
    model->res_ = std::make_unique<Resources>();
    Resources& res = *model->res_;
    res.device = options.device_ordinal;
    res.fp16 = options.fp16;
    res.allow_tf32 = options.allow_tf32;
    res.plan_lookup = plan_lookup;
    if (const char* env = std::getenv("VIGIL_CUDNN_AUTOTUNE"); env != nullptr && std::atoi(env) > 0) {
      res.autotune_candidates = std::atoi(env);
    }
    VIGIL_CUDA(cudaSetDevice(res.device));
    VIGIL_CUDA(cudaStreamCreateWithFlags(&res.stream, cudaStreamNonBlocking));
    VIGIL_CUDNN(cudnnCreate(&res.cudnn));
    VIGIL_CUDNN(cudnnSetStream(res.cudnn, res.stream));
    VIGIL_CUBLAS(cublasCreate(&res.cublas));
    VIGIL_CUBLAS(cublasSetStream(res.cublas, res.stream));
    VIGIL_ASSIGN_OR_RETURN(res.cublas_workspace, DeviceBuffer::Allocate(size_t{32} << 20, "cuBLAS workspace"));
    VIGIL_CUBLAS(cublasSetWorkspace(res.cublas, res.cublas_workspace.get(), res.cublas_workspace.bytes()));
    VIGIL_ASSIGN_OR_RETURN(res.autotune, DeviceBuffer::Allocate(kAutotuneWorkspace, "cuDNN autotuning"));

    LayoutPlan plan = PlanLayouts(graph, 1, [&](const Node& n) { return GpuConvRuns(n, graph); }, keep_nchw);
    const Graph& g = plan.graph;
    // Storage: NHWC values in the compute dtype, everything else as declared.
    Graph planning = g;
    for (const std::string& v : plan.blocked_values) planning.types[v].dtype = compute;
    const MemoryPlan mem = PlanMemory(planning, kArenaAlignment);
    VIGIL_ASSIGN_OR_RETURN(model->arena_, DeviceBuffer::Allocate(mem.arena_bytes, "activation arena"));
    std::unordered_map<std::string, Value> values;
    for (const auto& [name, offset] : mem.offsets) {
      const TensorType& t = planning.types.at(name);
      values[name] = Value{static_cast<char*>(model->arena_.get()) + offset, t.dtype, t.shape,
                           plan.blocked_values.count(name) != 0};
    }
    for (const ValueInfo& in : g.inputs) {
      const TensorType& t = g.types.at(in.name);
      model->inputs_.push_back({in.name, t.dtype, t.shape});
      const size_t bytes = static_cast<size_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
      VIGIL_ASSIGN_OR_RETURN(DeviceBuffer d, DeviceBuffer::Allocate(std::max<size_t>(bytes, 1), "input " + in.name));
      VIGIL_ASSIGN_OR_RETURN(PinnedBuffer p, PinnedBuffer::Allocate(std::max<size_t>(bytes, 1), "input " + in.name));
      values[in.name] = Value{d.get(), t.dtype, t.shape, false};
      model->input_buffers_.push_back(std::move(d));
      model->input_staging_.push_back(std::move(p));
    }

    bool replan = false;
    std::vector<std::string> host;  // "node (op): reason" of each host fallback
    for (size_t i = 0; i < g.nodes.size() && !replan; ++i) {
      const Node& node = g.nodes[i];
      Build b{g, node, plan.roles[i], g.OpsetOf(node.domain), values, res};
      VIGIL_ASSIGN_OR_RETURN(Choice c, ChooseKernel(b, plan, i, &keep_nchw));
      replan = c.replan;
      if (replan) continue;
      if (!c.kernel) {
        host.push_back(StrCat("'", node.name.empty() ? node.Describe() : node.name, "' (", node.QualifiedOpType(), "): ",
                              c.fallback));
        VIGIL_ASSIGN_OR_RETURN(c.kernel, MakeHost(b));
      }
      model->timings_.push_back({node.name, node.op_type, std::string(c.kernel->name()), 0.0, 0});
      model->steps_.push_back({std::move(c.kernel), node.Describe()});
    }
    if (replan) continue;
    if (!host.empty()) {
      // A host fallback is a decision, said at load: each node, its op and why (the first 20 here; `vigil model
      // inspect --device cuda:N` lists all, without a GPU).
      spdlog::warn("CUDA backend: {} of {} node(s) run on the host reference kernels (device copies around each):",
                   host.size(), g.nodes.size());
      for (size_t k = 0; k < host.size() && k < 20; ++k) spdlog::warn("CUDA backend:   on the host: {}", host[k]);
      if (host.size() > 20) spdlog::warn("CUDA backend:   … and {} more", host.size() - 20);
    }
    size_t ws = 0;
    for (const Step& s : model->steps_) ws = std::max(ws, s.kernel->WorkspaceBytes());
    res.autotune = DeviceBuffer();
    VIGIL_ASSIGN_OR_RETURN(model->workspace_, DeviceBuffer::Allocate(std::max<size_t>(ws, 256), "cuDNN workspace"));
    for (Step& s : model->steps_) VIGIL_RETURN_IF_ERROR(Annotate(s.kernel->BindWorkspace(model->workspace_.get()), s.label));

    for (const ValueInfo& out : g.outputs) {
      OutputSource src;
      if (const Tensor* t = g.FindInitializer(out.name)) {
        src.constant = *t;
      } else if (auto it = std::find_if(g.inputs.begin(), g.inputs.end(), [&](const ValueInfo& v) { return v.name == out.name; });
                 it != g.inputs.end()) {
        src.graph_input = static_cast<int>(it - g.inputs.begin());
      } else {
        auto v = values.find(out.name);
        if (v == values.end()) return absl::InvalidArgumentError(StrCat("graph output '", out.name, "' is produced by no node"));
        src.device = v->second;
        VIGIL_ASSIGN_OR_RETURN(PinnedBuffer p, PinnedBuffer::Allocate(std::max<size_t>(src.device.bytes(), 1), out.name));
        src.staging = p.get();
        model->output_staging_.push_back(std::move(p));
      }
      model->outputs_.push_back(std::move(src));
    }
    model->io_.device = res.device;
    model->io_.stream = res.stream;
    for (const DeviceBuffer& d : model->input_buffers_) model->io_.inputs.push_back(d.get());
    for (const OutputSource& o : model->outputs_) model->io_.outputs.push_back(o.device.ptr);
    if (model->profile_) {
      model->events_.resize(model->steps_.size() + 1);
      for (cudaEvent_t& ev : model->events_) VIGIL_CUDA(cudaEventCreate(&ev));
    }
    VIGIL_CUDA(cudaStreamSynchronize(res.stream));
    res.plan_lookup = {};  // its counts are this function's
    plan_cache.Record(plan_stats);
    if (plan_stats.hits + plan_stats.timed > 0) {
      spdlog::info("CUDA backend: cuDNN plans: {} from cache, {} timed{}", plan_stats.hits, plan_stats.timed,
                   plan_stats.failed_restores > 0 ? StrCat(" (", plan_stats.failed_restores, " cached plans did not rebuild)")
                                                  : std::string());
    }
    if (!plan_file.empty() && plan_stats.timed > 0) {
      if (Status st = plan_cache.Save(plan_file); !st.ok()) spdlog::warn("{}", std::string(st.message()));
    }
    return std::unique_ptr<CompiledModel>(std::move(model));
  }
}

// The kernels only (captured into the CUDA graph); host I/O copies are Run's.
Status CudaCompiledModel::EnqueueSteps(bool profile) {
  cudaStream_t s = res_->stream;
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (profile) VIGIL_CUDA(cudaEventRecord(events_[i], s));
    VIGIL_RETURN_IF_ERROR(Annotate(steps_[i].kernel->Enqueue(s), steps_[i].label));
  }
  if (profile) VIGIL_CUDA(cudaEventRecord(events_.back(), s));
  return absl::OkStatus();
}

Status CudaCompiledModel::Capture() {
  cudaStream_t s = res_->stream;
  VIGIL_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  Status enqueued = EnqueueSteps(false);
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  VIGIL_RETURN_IF_ERROR(enqueued);
  VIGIL_CUDA(end);
  cudaError_t inst = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) exec_ = nullptr;
  return cuda::CudaStatus(inst, "cudaGraphInstantiate");
}

Status CudaCompiledModel::EnqueueOnDevice() {
  VIGIL_CUDA(cudaSetDevice(res_->device));
  if (use_graph_ && exec_ == nullptr && runs_ >= 1) {
    Status captured = Capture();
    if (!captured.ok()) {
      cudaGetLastError();  // clear a sticky launch error of the failed capture
      spdlog::warn("CUDA graph capture failed, running eagerly: {}", std::string(captured.message()));
      use_graph_ = false;
    }
  }
  ++runs_;
  if (exec_ != nullptr) return cuda::CudaStatus(cudaGraphLaunch(exec_, res_->stream), "cudaGraphLaunch");
  pending_profile_ = profile_;
  return EnqueueSteps(profile_);
}

Status CudaCompiledModel::SynchronizeDevice() {
  VIGIL_CUDA(cudaStreamSynchronize(res_->stream));
  for (const Step& s : steps_) VIGIL_RETURN_IF_ERROR(Annotate(s.kernel->Check(), s.label));
  if (std::exchange(pending_profile_, false)) {
    for (size_t i = 0; i < steps_.size(); ++i) {
      float ms = 0;
      VIGIL_CUDA(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      timings_[i].total_ms += ms;
      ++timings_[i].calls;
    }
  }
  return absl::OkStatus();
}

Status CudaCompiledModel::Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) {
  if (inputs.size() != inputs_.size()) {
    return absl::InvalidArgumentError(StrCat("expected ", inputs_.size(), " input(s), got ", inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != inputs_[i].dtype || inputs[i].shape() != inputs_[i].shape) {
      return absl::InvalidArgumentError(StrCat("input '", inputs_[i].name, "': expected ", DTypeName(inputs_[i].dtype),
                                               ShapeToString(inputs_[i].shape), ", got ", DTypeName(inputs[i].dtype()),
                                               ShapeToString(inputs[i].shape())));
    }
  }
  VIGIL_CUDA(cudaSetDevice(res_->device));
  cudaStream_t s = res_->stream;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::memcpy(input_staging_[i].get(), inputs[i].raw(), inputs[i].nbytes());
    VIGIL_CUDA(cudaMemcpyAsync(input_buffers_[i].get(), input_staging_[i].get(), inputs[i].nbytes(),
                               cudaMemcpyHostToDevice, s));
  }
  VIGIL_RETURN_IF_ERROR(EnqueueOnDevice());
  for (const OutputSource& o : outputs_) {
    if (o.staging) VIGIL_CUDA(cudaMemcpyAsync(o.staging, o.device.ptr, o.device.bytes(), cudaMemcpyDeviceToHost, s));
  }
  VIGIL_RETURN_IF_ERROR(SynchronizeDevice());
  outputs->clear();
  for (const OutputSource& o : outputs_) {
    if (o.graph_input >= 0) {
      outputs->push_back(inputs[static_cast<size_t>(o.graph_input)].Clone());
    } else if (o.constant.defined()) {
      outputs->push_back(o.constant.Clone());
    } else {
      Tensor t(o.device.dtype, o.device.shape);
      std::memcpy(t.raw(), o.staging, t.nbytes());
      outputs->push_back(std::move(t));
    }
  }
  return absl::OkStatus();
}

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  bool Supports(const Node& node, int64_t opset) const override { return HasReferenceKernel(node, opset); }
  StatusOr<BackendPlan> Plan(const Graph& graph, const CompileOptions& options) const override {
    std::unordered_set<size_t> keep_nchw;
    return PlanDry(graph, options, &keep_nchw);
  }
  StatusOr<std::unique_ptr<CompiledModel>> Compile(const Graph& graph, const CompileOptions& options) override {
    return CudaCompiledModel::Create(graph, options);
  }
};

}  // namespace

std::unique_ptr<Backend> CreateCudaBackend() { return std::make_unique<CudaBackend>(); }

}  // namespace vigil::infer
