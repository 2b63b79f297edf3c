// cudnn_conv.cc — CudnnConv (cudnn_conv.h) on cuDNN's backend descriptors.
#include "infer/cuda/cudnn_conv.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include "vigil/infer/cuda_util.h"

namespace vigil::cuda {
namespace {

// Unique ids of the graph's tensors (variant-pack keys).
enum : int64_t { kX = 1, kW = 2, kB = 3, kY = 4, kConvOut = 10, kBiasOut = 11 };

// Owns descriptors created while building; released unless handed over to the CudnnConv.
struct Descriptors {
  std::vector<cudnnBackendDescriptor_t> list;
  ~Descriptors() {
    for (auto d : list) cudnnBackendDestroyDescriptor(d);
  }
  StatusOr<cudnnBackendDescriptor_t> Make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    VIGIL_CUDNN(cudnnBackendCreateDescriptor(type, &d));
    list.push_back(d);
    return d;
  }
};

template <typename T>
Status Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           const T* values, int64_t count = 1) {
  return CudnnStatus(cudnnBackendSetAttribute(d, name, type, count, values), "cudnnBackendSetAttribute");
}

StatusOr<cudnnBackendDescriptor_t> TensorDesc(Descriptors& ds, int64_t uid, cudnnDataType_t type,
                                          const std::array<int64_t, 4>& dims, const std::array<int64_t, 4>& strides,
                                          bool is_virtual) {
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t t, ds.Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const int64_t alignment = 16;
  VIGIL_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type));
  VIGIL_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4));
  VIGIL_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4));
  VIGIL_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid));
  VIGIL_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment));
  VIGIL_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual));
  VIGIL_CUDNN(cudnnBackendFinalize(t));
  return t;
}

// A pointwise op y = mode(x[, b]) in float32 math.
StatusOr<cudnnBackendDescriptor_t> Pointwise(Descriptors& ds, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                             cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pw, ds.Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  VIGIL_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode));
  VIGIL_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec));
  if (mode == CUDNN_POINTWISE_SWISH_FWD) {
    const float beta = 1.0f;  // swish(x) = x · sigmoid(beta · x): SiLU
    VIGIL_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_FLOAT, &beta));
  }
  VIGIL_CUDNN(cudnnBackendFinalize(pw));
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t op, ds.Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
  VIGIL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, &pw));
  VIGIL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x));
  if (b != nullptr) VIGIL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b));
  VIGIL_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y));
  VIGIL_CUDNN(cudnnBackendFinalize(op));
  return op;
}

// Whether an engine config's engine carries a numerical note that means reduced fp32 precision.
bool UsesReducedFp32(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t engine = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return true;
  int64_t n = 0;
  bool reduced = true;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
      CUDNN_STATUS_SUCCESS) {
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t count = 0;
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) == CUDNN_STATUS_SUCCESS) {
      reduced = false;
      for (int64_t i = 0; i < count; ++i) {
        reduced = reduced || notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                  notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
      }
    }
  }
  cudnnBackendDestroyDescriptor(engine);
  return reduced;
}

int64_t EngineIndex(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t engine = nullptr;
  int64_t index = -1, n = 0;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return index;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
      CUDNN_STATUS_SUCCESS) {
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  }
  cudnnBackendDestroyDescriptor(engine);
  return index;
}

StatusOr<cudnnBackendDescriptor_t> VariantPack(Descriptors& ds, bool has_bias, const void* x, const void* w,
                                               const void* bias, void* y, void* workspace) {
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pack, ds.Make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  std::vector<int64_t> uids = {kX, kW, kY};
  std::vector<void*> ptrs = {const_cast<void*>(x), const_cast<void*>(w), y};
  if (has_bias) {
    uids.push_back(kB);
    ptrs.push_back(const_cast<void*>(bias));
  }
  VIGIL_RETURN_IF_ERROR(Set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(),
                            static_cast<int64_t>(uids.size())));
  VIGIL_RETURN_IF_ERROR(Set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(),
                            static_cast<int64_t>(ptrs.size())));
  VIGIL_RETURN_IF_ERROR(Set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace));
  VIGIL_CUDNN(cudnnBackendFinalize(pack));
  return pack;
}

// The operation graph and its heuristics' engine configs. The *_HANDLE attributes are marked
// deprecated in cuDNN 9.19's headers but are what operation graphs and plans are finalized against in
// every cuDNN 9 release (the device-property replacement is not in all of them).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

struct Candidate {
  cudnnBackendDescriptor_t plan = nullptr, cfg = nullptr;
  size_t workspace = 0;
  float ms = std::numeric_limits<float>::infinity();
  int64_t engine = -1;
};

// Finalizes an execution plan for `cfg`. Unimplemented when cuDNN says the config cannot run the
// graph (NOT_SUPPORTED or BAD_PARAM: the same every time), ResourceExhausted when it needs more
// workspace than `limit`, Internal for anything that may pass another time (compilation, allocation).
StatusOr<Candidate> FinalizePlan(Descriptors& ds, cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, size_t limit) {
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t plan, ds.Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  VIGIL_RETURN_IF_ERROR(Set(plan, kPlanHandle, CUDNN_TYPE_HANDLE, &handle));
  VIGIL_RETURN_IF_ERROR(Set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &cfg));
  if (const cudnnStatus_t st = cudnnBackendFinalize(plan); st != CUDNN_STATUS_SUCCESS) {
    const Status s = CudnnStatus(st, "cudnnBackendFinalize(execution plan)");
    const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
    if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM) {
      return absl::UnimplementedError(s.message());
    }
    return s;
  }
  int64_t ws = 0, n = 0;
  VIGIL_CUDNN(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws));
  if (ws < 0 || static_cast<size_t>(ws) > limit) {
    return absl::ResourceExhaustedError(StrCat("plan needs ", ws, " bytes of workspace, limit ", limit));
  }
  Candidate c;
  c.plan = plan;
  c.cfg = cfg;
  c.workspace = static_cast<size_t>(ws);
  return c;
}

// The engine and knob settings of a (heuristics') engine config: what rebuilds it.
StatusOr<PlanChoice> ChoiceOf(cudnnBackendDescriptor_t cfg, int64_t engine) {
  if (engine < 0) return absl::InternalError("engine global index unavailable");
  Descriptors ds;  // the knob descriptors are only read here
  std::array<cudnnBackendDescriptor_t, CUDNN_KNOB_TYPE_COUNTS> knobs{};
  for (auto& k : knobs) {
    VIGIL_ASSIGN_OR_RETURN(k, ds.Make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
  }
  int64_t n = 0;
  VIGIL_CUDNN(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       static_cast<int64_t>(knobs.size()), &n, knobs.data()));
  if (n < 0 || n > static_cast<int64_t>(knobs.size())) return absl::InternalError(StrCat(n, " knob choices"));
  PlanChoice c;
  c.engine = engine;
  for (int64_t i = 0; i < n; ++i) {
    cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_COUNTS;
    int64_t value = 0, m = 0;
    VIGIL_CUDNN(cudnnBackendGetAttribute(knobs[static_cast<size_t>(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                         CUDNN_TYPE_KNOB_TYPE, 1, &m, &type));
    VIGIL_CUDNN(cudnnBackendGetAttribute(knobs[static_cast<size_t>(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                         CUDNN_TYPE_INT64, 1, &m, &value));
    c.knobs.emplace_back(static_cast<int64_t>(type), value);
  }
  return c;
}

// Rebuilds the engine config of `choice` on `graph` (engine by global index, then its knobs, as
// cudnn-frontend's EngineBuilder / EngineConfigBuilder do), finalizes its plan and runs it once on the
// buffers: the checks a timed candidate passes.
StatusOr<Candidate> Restore(Descriptors& ds, cudnnHandle_t handle, cudnnBackendDescriptor_t graph, const ConvSpec& spec,
                            const PlanChoice& choice, bool has_bias, const void* x, const void* w, const void* bias,
                            void* y, void* scratch) {
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t engine, ds.Make(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  VIGIL_RETURN_IF_ERROR(Set(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph));
  VIGIL_RETURN_IF_ERROR(Set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &choice.engine));
  VIGIL_CUDNN(cudnnBackendFinalize(engine));
  std::vector<cudnnBackendDescriptor_t> knobs;
  for (const auto& [type, value] : choice.knobs) {
    if (type < 0 || type >= CUDNN_KNOB_TYPE_COUNTS) return absl::InvalidArgumentError(StrCat("knob type ", type));
    const auto t = static_cast<cudnnBackendKnobType_t>(type);
    VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t k, ds.Make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    VIGIL_RETURN_IF_ERROR(Set(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, &t));
    VIGIL_RETURN_IF_ERROR(Set(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, &value));
    VIGIL_CUDNN(cudnnBackendFinalize(k));
    knobs.push_back(k);
  }
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t cfg, ds.Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  VIGIL_RETURN_IF_ERROR(Set(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, &engine));
  if (!knobs.empty()) {
    VIGIL_RETURN_IF_ERROR(Set(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, knobs.data(),
                              static_cast<int64_t>(knobs.size())));
  }
  VIGIL_CUDNN(cudnnBackendFinalize(cfg));
  if (spec.data_type == CUDNN_DATA_FLOAT && !spec.allow_tensor_core_fp32 && UsesReducedFp32(cfg)) {
    return absl::FailedPreconditionError("the engine reduces float32 precision");
  }
  VIGIL_ASSIGN_OR_RETURN(Candidate c, FinalizePlan(ds, handle, cfg, spec.workspace_limit));
  VIGIL_ASSIGN_OR_RETURN(cudnnBackendDescriptor_t pack, VariantPack(ds, has_bias, x, w, bias, y, scratch));
  VIGIL_CUDNN(cudnnBackendExecute(handle, c.plan, pack));
  c.engine = choice.engine;
  return c;
}

void Count(const PlanLookup& lookup, int64_t PlanCacheStats::*field) {
  if (lookup.stats != nullptr) ++(lookup.stats->*field);
}

}  // namespace

StatusOr<std::string> DeviceSignature(int ordinal) {
  cudaDeviceProp p{};
  VIGIL_CUDA(cudaGetDeviceProperties(&p, ordinal));
  return StrCat(p.name, "|sm", p.major, p.minor, "|", p.multiProcessorCount, "sm|cudnn", cudnnGetVersion());
}

std::string PlanKey(const ConvSpec& s, const std::string& device) {
  const auto list = [](const auto& a) {
    std::string out;
    for (size_t i = 0; i < a.size(); ++i) out += StrCat(i ? "," : "", a[i]);
    return out;
  };
  return StrCat(device, "|x", list(s.x_dims), "/", list(s.x_strides), "|w", list(s.w_dims), "/", list(s.w_strides),
                "|y", list(s.y_dims), "/", list(s.y_strides), "|pad", list(s.pre_pad), "/", list(s.post_pad), "|stride",
                list(s.stride), "|dil", list(s.dilation), "|dt", static_cast<int>(s.data_type), "|fuse",
                int{s.fuse_epilogue}, "|bias", int{s.has_bias}, "|act", static_cast<int>(s.activation), "|tf32",
                int{s.allow_tensor_core_fp32}, "|cand", s.max_candidates, "|ws", s.workspace_limit);
}

CudnnConv::~CudnnConv() {
  for (auto d : owned_) cudnnBackendDestroyDescriptor(d);
}

StatusOr<std::unique_ptr<CudnnConv>> CudnnConv::Create(cudnnHandle_t handle, const ConvSpec& spec, const void* x,
                                                       const void* w, const void* bias, void* y, void* scratch,
                                                       cudaStream_t stream, const PlanLookup& lookup) {
  Descriptors ds;
  const bool fused = spec.fuse_epilogue && (spec.has_bias || spec.activation != ConvActivation::kNone);
  VIGIL_ASSIGN_OR_RETURN(auto xd, TensorDesc(ds, kX, spec.data_type, spec.x_dims, spec.x_strides, false));
  VIGIL_ASSIGN_OR_RETURN(auto wd, TensorDesc(ds, kW, spec.data_type, spec.w_dims, spec.w_strides, false));
  VIGIL_ASSIGN_OR_RETURN(auto yd, TensorDesc(ds, kY, spec.data_type, spec.y_dims, spec.y_strides, false));

  VIGIL_ASSIGN_OR_RETURN(auto conv, ds.Make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp));
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode));
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial));
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, spec.dilation.data(), 2));
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, spec.stride.data(), 2));
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, spec.pre_pad.data(), 2));
  VIGIL_RETURN_IF_ERROR(Set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, spec.post_pad.data(), 2));
  VIGIL_CUDNN(cudnnBackendFinalize(conv));

  // Convolution into y, or into a virtual float32 tensor that the epilogue continues from.
  std::array<int64_t, 4> vstrides = spec.y_strides;
  cudnnBackendDescriptor_t conv_out = yd;
  if (fused) {
    VIGIL_ASSIGN_OR_RETURN(conv_out, TensorDesc(ds, kConvOut, CUDNN_DATA_FLOAT, spec.y_dims, vstrides, true));
  }
  VIGIL_ASSIGN_OR_RETURN(auto conv_op, ds.Make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR));
  const float alpha = 1.0f, beta = 0.0f;
  VIGIL_RETURN_IF_ERROR(Set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, &xd));
  VIGIL_RETURN_IF_ERROR(Set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, &wd));
  VIGIL_RETURN_IF_ERROR(
      Set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, &conv_out));
  VIGIL_RETURN_IF_ERROR(
      Set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &conv));
  VIGIL_RETURN_IF_ERROR(Set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, &alpha));
  VIGIL_RETURN_IF_ERROR(Set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, &beta));
  VIGIL_CUDNN(cudnnBackendFinalize(conv_op));
  std::vector<cudnnBackendDescriptor_t> ops = {conv_op};

  if (fused) {
    cudnnBackendDescriptor_t cur = conv_out;
    const bool act = spec.activation != ConvActivation::kNone;
    if (spec.has_bias) {
      const std::array<int64_t, 4> bdims = {1, spec.y_dims[1], 1, 1};
      const std::array<int64_t, 4> bstrides = {spec.y_dims[1], 1, 1, 1};
      VIGIL_ASSIGN_OR_RETURN(auto bd, TensorDesc(ds, kB, spec.data_type, bdims, bstrides, false));
      cudnnBackendDescriptor_t out = yd;
      if (act) {
        VIGIL_ASSIGN_OR_RETURN(out, TensorDesc(ds, kBiasOut, CUDNN_DATA_FLOAT, spec.y_dims, vstrides, true));
      }
      VIGIL_ASSIGN_OR_RETURN(auto add, Pointwise(ds, CUDNN_POINTWISE_ADD, cur, bd, out));
      ops.push_back(add);
      cur = out;
    }
    if (act) {
      const cudnnPointwiseMode_t m = spec.activation == ConvActivation::kSiLU   ? CUDNN_POINTWISE_SWISH_FWD
                                     : spec.activation == ConvActivation::kRelu ? CUDNN_POINTWISE_RELU_FWD
                                                                                : CUDNN_POINTWISE_SIGMOID_FWD;
      VIGIL_ASSIGN_OR_RETURN(auto a, Pointwise(ds, m, cur, nullptr, yd));
      ops.push_back(a);
    }
  }

  VIGIL_ASSIGN_OR_RETURN(auto graph, ds.Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  VIGIL_RETURN_IF_ERROR(Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(),
                            static_cast<int64_t>(ops.size())));
  VIGIL_RETURN_IF_ERROR(Set(graph, kGraphHandle, CUDNN_TYPE_HANDLE, &handle));
  VIGIL_CUDNN(cudnnBackendFinalize(graph));

  const bool bias_in_plan = fused && spec.has_bias;
  const auto finish = [&](const Candidate& c) {
    std::unique_ptr<CudnnConv> out(new CudnnConv());
    out->handle_ = handle;
    out->plan_ = c.plan;
    out->workspace_ = c.workspace;
    out->has_bias_ = bias_in_plan;
    out->engine_ = StrCat("cudnn_engine_", c.engine, fused ? "_fused" : "");
    // Keep every descriptor: the plan refers to the graph, the configs and the tensors.
    out->owned_ = std::move(ds.list);
    ds.list.clear();
    return out;
  };
  const std::string key = lookup.cache != nullptr ? PlanKey(spec, lookup.device) : std::string();
  if (lookup.cache != nullptr) {
    if (std::optional<PlanChoice> cached = lookup.cache->Find(key)) {
      if (cached->engine < 0) {
        Count(lookup, &PlanCacheStats::hits);
        return absl::NotFoundError("no cuDNN engine supports this convolution (plan cache)");
      }
      StatusOr<Candidate> c = Restore(ds, handle, graph, spec, *cached, bias_in_plan, x, w, bias, y, scratch);
      if (c.ok()) {
        Count(lookup, &PlanCacheStats::hits);
        return finish(*c);
      }
      Count(lookup, &PlanCacheStats::failed_restores);
      static std::once_flag warned;
      std::call_once(warned, [&] {
        spdlog::warn("cuDNN plan cache: cached engine {} did not rebuild ({}); such convolutions are timed again and "
                     "their entries replaced",
                     cached->engine, std::string(c.status().message()));
      });
    }
    Count(lookup, &PlanCacheStats::timed);
  }

  VIGIL_ASSIGN_OR_RETURN(auto heur, ds.Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  const cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  VIGIL_RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph));
  VIGIL_RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &heur_mode));
  VIGIL_CUDNN(cudnnBackendFinalize(heur));
  int64_t count = 0;
  VIGIL_CUDNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                       nullptr));
  std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
  for (auto& c : cfgs) {
    VIGIL_ASSIGN_OR_RETURN(c, ds.Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  }
  VIGIL_CUDNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                       &count, cfgs.data()));

  cudaEvent_t start = nullptr, stop = nullptr;
  VIGIL_CUDA(cudaEventCreate(&start));
  VIGIL_CUDA(cudaEventCreate(&stop));
  Candidate best;
  int tried = 0;
  bool transient = false;  // a plan failed in a way that may pass another time
  Status last = absl::NotFoundError("no cuDNN engine supports this convolution");
  for (int64_t i = 0; i < count && tried < spec.max_candidates; ++i) {
    if (spec.data_type == CUDNN_DATA_FLOAT && !spec.allow_tensor_core_fp32 && UsesReducedFp32(cfgs[i])) continue;
    StatusOr<Candidate> cand = FinalizePlan(ds, handle, cfgs[i], spec.workspace_limit);
    if (!cand.ok()) {
      transient = transient || cand.status().code() == absl::StatusCode::kInternal;
      continue;
    }
    auto pack = VariantPack(ds, bias_in_plan, x, w, bias, y, scratch);
    if (!pack.ok()) return pack.status();
    if (cudnnBackendExecute(handle, cand->plan, *pack) != CUDNN_STATUS_SUCCESS) {  // warm-up; some plans fail here
      last = absl::InternalError("cudnnBackendExecute failed for every finalized plan");
      continue;
    }
    ++tried;
    VIGIL_CUDA(cudaEventRecord(start, stream));
    for (int r = 0; r < 3; ++r) VIGIL_CUDNN(cudnnBackendExecute(handle, cand->plan, *pack));
    VIGIL_CUDA(cudaEventRecord(stop, stream));
    VIGIL_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    VIGIL_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best.ms) {
      best = *cand;
      best.ms = ms;
      best.engine = EngineIndex(cfgs[i]);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (best.plan == nullptr) {
    // "No engine" is remembered only when every config was refused as unsupported.
    if (lookup.cache != nullptr && absl::IsNotFound(last) && !transient) lookup.cache->Put(key, PlanChoice{});
    return last;
  }
  if (lookup.cache != nullptr) {
    if (StatusOr<PlanChoice> choice = ChoiceOf(best.cfg, best.engine); choice.ok()) lookup.cache->Put(key, *choice);
  }
  return finish(best);
}

Status CudnnConv::Bind(const void* x, const void* w, const void* bias, void* y, void* workspace) {
  Descriptors ds;
  VIGIL_ASSIGN_OR_RETURN(pack_, VariantPack(ds, has_bias_, x, w, bias, y, workspace));
  owned_.insert(owned_.end(), ds.list.begin(), ds.list.end());
  ds.list.clear();
  return absl::OkStatus();
}

Status CudnnConv::Run() {
  if (pack_ == nullptr) return absl::FailedPreconditionError("CudnnConv::Run before Bind");
  return CudnnStatus(cudnnBackendExecute(handle_, plan_, pack_), "cudnnBackendExecute");
}

}  // namespace vigil::cuda
