#include "vigil/infer/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"

#include "infer/backend.h"
#include "infer/onnx_import.h"
#include "infer/op_registry.h"
#include "infer/passes/passes.h"

namespace vigil::infer {
namespace {

ModelSummary Summarize(const Graph& graph, const std::string& path) {
  ModelSummary s;
  s.path = path;
  s.ir_version = graph.ir_version;
  s.opset = graph.opset;
  s.producer = graph.producer_name + (graph.producer_version.empty() ? "" : " " + graph.producer_version);
  s.inputs = graph.inputs;
  s.outputs = graph.outputs;
  s.metadata = graph.metadata;
  s.op_counts = graph.file_op_counts;
  for (const Node& node : graph.nodes) {
    if (graph.file_op_counts.empty()) ++s.op_counts[node.QualifiedOpType()];
    if (FindOp(node.domain, node.op_type) == nullptr) {
      s.unsupported_ops.push_back(StrCat("unsupported op '", node.QualifiedOpType(), "' (node '", node.name,
                                               "', opset ", graph.opset, ")"));
    }
  }
  return s;
}

StatusOr<std::unique_ptr<Backend>> BackendFor(int ordinal, [[maybe_unused]] const std::string& device) {
  if (ordinal < 0) return CreateCpuBackend();
#ifdef VIGIL_HAVE_CUDA
  return CreateCudaBackend();
#else
  return absl::UnimplementedError(StrCat(
      "device '", device, "': this build has no CUDA backend (configure with -DVIGIL_WITH_CUDA=ON); use --device cpu"));
#endif
}

Status RunPasses(Graph& graph, const EngineOptions& options) {
  ShapeOverrides overrides;
  overrides.batch = options.batch;
  overrides.height = options.height;
  overrides.width = options.width;
  overrides.input_shapes = options.input_shapes;
  VIGIL_RETURN_IF_ERROR(FixInputShapes(graph, overrides));
  // int8-dynamic models as exported: on the CPU the integer products summed exactly in float32 (ONNX Runtime's
  // arithmetic, bit for bit with its sigmoid); on a GPU the dequantized values, whose sums fit float16 and which
  // keep the NHWC region whole (cuDNN's algorithms do not promise exact sums anyway).
  Int8Activation int8 = Int8Activation::kFloat;
  if (options.int8_activations == Int8Activations::kQuantized) {
    int8 = options.device == "cpu" ? Int8Activation::kExactProducts : Int8Activation::kFakeQuantized;
  }
  VIGIL_RETURN_IF_ERROR(DequantizeWeights(graph, int8));
  VIGIL_RETURN_IF_ERROR(InferShapesAndFold(graph));
  if (options.optimize) {
    VIGIL_RETURN_IF_ERROR(RemoveNoOps(graph));
    VIGIL_RETURN_IF_ERROR(SlicesToSplit(graph));
    VIGIL_RETURN_IF_ERROR(FuseConvActivation(graph));
  }
  VIGIL_RETURN_IF_ERROR(EliminateDeadNodes(graph));
  VIGIL_RETURN_IF_ERROR(InferShapesAndFold(graph));
  return ValidateGraph(graph);
}

CompileOptions CompileOptionsOf(const EngineOptions& options, int ordinal) {
  CompileOptions compile;
  compile.threads = options.threads;
  compile.use_onednn = options.use_onednn;
  compile.profile = options.profile;
  compile.device_ordinal = std::max(ordinal, 0);
  compile.fp16 = options.precision == Precision::kFp16;
  compile.allow_tf32 = options.allow_tf32;
  compile.cuda_graph = options.cuda_graph;
  compile.cudnn_plan_cache = options.cudnn_plan_cache;
  return compile;
}

// Converts `t` to `dtype` when it is a float32<->float16 mismatch; otherwise returns it unchanged.
Tensor ConvertFloat(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  if (t.dtype() == DType::kFloat16 && dtype == DType::kFloat32) return t.ToFloat32();
  if (t.dtype() == DType::kFloat32 && dtype == DType::kFloat16) {
    Tensor out(DType::kFloat16, t.shape());
    const float* src = t.data<float>();
    uint16_t* dst = out.data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = FloatToHalf(src[i]);
    return out;
  }
  return t;
}

}  // namespace

StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  int ordinal = -1;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &ordinal) && ordinal >= 0) return ordinal;
  return absl::InvalidArgumentError(StrCat("device '", device, "' is not one of: cpu, cuda, cuda:N"));
}

StatusOr<Precision> ParsePrecision(std::string_view text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "fp16") return Precision::kFp16;
  return absl::InvalidArgumentError(StrCat("precision '", std::string(text), "' is not one of: fp32, fp16"));
}

StatusOr<Int8Activations> ParseInt8Activations(std::string_view text) {
  if (text == "quantized") return Int8Activations::kQuantized;
  if (text == "float") return Int8Activations::kFloat;
  return absl::InvalidArgumentError(
      StrCat("int8 activations '", std::string(text), "' is not one of: quantized, float"));
}

StatusOr<ModelSummary> InspectModel(const std::string& path) {
  VIGIL_ASSIGN_OR_RETURN(Graph graph, ImportOnnxFile(path));
  return Summarize(graph, path);
}

StatusOr<BackendPlan> PlanModel(const std::string& path, const EngineOptions& options) {
  VIGIL_ASSIGN_OR_RETURN(Graph graph, ImportOnnxFile(path));
  const std::string context = StrCat("model '", path, "'");
  const ModelSummary summary = Summarize(graph, path);
  if (!summary.unsupported_ops.empty()) {
    return absl::UnimplementedError(StrCat(context, ": ", summary.unsupported_ops.front()));
  }
  VIGIL_RETURN_IF_ERROR(Annotate(RunPasses(graph, options), context));
  VIGIL_ASSIGN_OR_RETURN(const int ordinal, ParseDevice(options.device));
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, BackendFor(ordinal, options.device));
  StatusOr<BackendPlan> plan = backend->Plan(graph, CompileOptionsOf(options, ordinal));
  if (!plan.ok()) return Annotate(plan.status(), context);
  return plan;
}

Engine::Engine() = default;
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Load(const std::string& path, const EngineOptions& options) {
  StatusOr<Graph> graph = ImportOnnxFile(path);
  if (!graph.ok()) return graph.status();
  return FromGraph(*std::move(graph), options, path);
}

StatusOr<std::unique_ptr<Engine>> Engine::FromGraph(Graph graph, const EngineOptions& options, const std::string& name) {
  std::unique_ptr<Engine> engine(new Engine());
  engine->summary_ = Summarize(graph, name);
  const std::string context = StrCat("model '", name, "'");
  if (!engine->summary_.unsupported_ops.empty()) {
    return absl::UnimplementedError(StrCat(context, ": ", engine->summary_.unsupported_ops.front(),
                                                 engine->summary_.unsupported_ops.size() > 1
                                                     ? StrCat(" and ", engine->summary_.unsupported_ops.size() - 1, " more")
                                                     : ""));
  }
  VIGIL_RETURN_IF_ERROR(Annotate(RunPasses(graph, options), context));
  VIGIL_ASSIGN_OR_RETURN(const int ordinal, ParseDevice(options.device));
  VIGIL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, BackendFor(ordinal, options.device));
  StatusOr<std::unique_ptr<CompiledModel>> compiled = backend->Compile(graph, CompileOptionsOf(options, ordinal));
  if (!compiled.ok()) return Annotate(compiled.status(), context);
  engine->compiled_ = *std::move(compiled);
  for (const ValueInfo& v : graph.inputs) {
    const TensorType& t = graph.types.at(v.name);
    engine->inputs_.push_back({v.name, t.dtype, t.shape});
  }
  for (const ValueInfo& v : graph.outputs) {
    auto it = graph.types.find(v.name);
    if (it == graph.types.end()) {
      return absl::InternalError(StrCat(context, ": output '", v.name, "' has no inferred type"));
    }
    engine->outputs_.push_back({v.name, it->second.dtype, it->second.shape});
  }
  engine->graph_ = std::move(graph);
  return engine;
}

Status Engine::Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) {
  if (inputs.size() != inputs_.size()) {
    return absl::InvalidArgumentError(
        StrCat("model takes ", inputs_.size(), " input(s), got ", inputs.size()));
  }
  std::vector<Tensor> converted;
  converted.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorInfo& want = inputs_[i];
    if (inputs[i].shape() != want.shape) {
      return absl::InvalidArgumentError(StrCat("input '", want.name, "': expected shape ",
                                                     ShapeToString(want.shape), ", got ",
                                                     ShapeToString(inputs[i].shape())));
    }
    converted.push_back(ConvertFloat(inputs[i], want.dtype));
    if (converted.back().dtype() != want.dtype) {
      return absl::InvalidArgumentError(StrCat("input '", want.name, "': expected ", DTypeName(want.dtype),
                                                     ", got ", DTypeName(inputs[i].dtype())));
    }
  }
  MutexLock lock(mu_);
  return compiled_->Run(converted, outputs);
}

std::vector<NodeTiming> Engine::Profile() const {
  MutexLock lock(mu_);
  return compiled_->Profile();
}

size_t Engine::ArenaBytes() const { return compiled_->ArenaBytes(); }

const DeviceIo* Engine::device_io() const { return compiled_->device_io(); }

Status Engine::EnqueueOnDevice() {
  MutexLock lock(mu_);
  return compiled_->EnqueueOnDevice();
}

Status Engine::SynchronizeDevice() {
  MutexLock lock(mu_);
  return compiled_->SynchronizeDevice();
}

}  // namespace vigil::infer
