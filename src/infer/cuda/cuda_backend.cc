// cuda_backend.cc — the CUDA backend: layout and memory planning, kernel choice, Run, CUDA graphs
// (cuda_backend.h).
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
#include "infer/cuda/cuda_util.h"
#include "infer/cuda/cudnn_conv.h"
#include "infer/cuda/kernels.h"
#include "infer/cuda/plan_cache.h"
#include "infer/op_registry.h"
#include "infer/ops/op_util.h"
#include "infer/passes/memory_plan.h"
#include "vigil/infer/engine.h"

namespace vigil::infer {
namespace {

using cuda::DeviceBuffer;
using cuda::ElemType;
using cuda::PinnedBuffer;
using cuda::StridedView;

constexpr size_t kArenaAlignment = 256;
constexpr size_t kAutotuneWorkspace = size_t{256} << 20;

bool IsFloat(DType t) { return t == DType::kFloat32 || t == DType::kFloat16; }
// The kernels' element type of a float dtype (anything else reads as float32: call for floats only).
ElemType ElemOf(DType t) { return t == DType::kFloat16 ? ElemType::kF16 : ElemType::kF32; }
// The kernels' element type of any dtype they store; false for float64 and int16 (the host runs those).
bool ElemOfAny(DType t, ElemType* e) {
  switch (t) {
    case DType::kFloat32: *e = ElemType::kF32; return true;
    case DType::kFloat16: *e = ElemType::kF16; return true;
    case DType::kInt64: *e = ElemType::kI64; return true;
    case DType::kInt32: *e = ElemType::kI32; return true;
    case DType::kInt8: *e = ElemType::kI8; return true;
    case DType::kUInt8: *e = ElemType::kU8; return true;
    case DType::kBool: *e = ElemType::kBool; return true;
    default: return false;
  }
}
bool Storable(DType t) {
  ElemType e;
  return ElemOfAny(t, &e);
}
ElemType AnyElemOf(DType t) {
  ElemType e = ElemType::kF32;
  ElemOfAny(t, &e);
  return e;
}

// A value's device storage: logical shape, storage dtype and layout (4-D only may be NHWC).
struct Value {
  void* ptr = nullptr;
  DType dtype = DType::kUndefined;
  Shape shape;
  bool nhwc = false;
  size_t bytes() const { return static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype); }
};

cuda::Strides4d StridesOf(const Value& v) {
  return v.nhwc ? cuda::NhwcStrides(v.shape[1], v.shape[2], v.shape[3])
                : cuda::NchwStrides(v.shape[1], v.shape[2], v.shape[3]);
}

// Physical (storage-order) shape and the physical position of each logical axis.
Shape PhysicalShape(const Value& v) {
  return v.nhwc ? Shape{v.shape[0], v.shape[2], v.shape[3], v.shape[1]} : v.shape;
}
int64_t PhysicalAxis(const Value& v, int64_t axis) {
  if (!v.nhwc) return axis;
  static constexpr int64_t kMap[4] = {0, 3, 1, 2};
  return kMap[axis];
}

std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

StatusOr<StridedView> MakeView(const Shape& shape, const std::vector<int64_t>& strides) {
  if (shape.size() > static_cast<size_t>(cuda::kMaxDims)) {
    return absl::UnimplementedError(StrCat("rank ", shape.size(), " exceeds the CUDA kernels' ", cuda::kMaxDims));
  }
  StridedView v;
  v.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    v.shape[d] = shape[d];
    v.stride[d] = strides[d];
  }
  if (v.ndim == 0) {  // a scalar: one element
    v.ndim = 1;
    v.shape[0] = 1;
    v.stride[0] = 0;
  }
  return v;
}

void* Offset(void* p, int64_t elements, DType t) {
  return static_cast<char*>(p) + elements * static_cast<int64_t>(DTypeSize(t));
}

// ---- Per-model resources -----------------------------------------------------------------------

struct Resources {
  // A dry run (Backend::Plan): kernels are chosen exactly as for Compile, but nothing touches a device —
  // allocations and uploads hand out distinct placeholder addresses, no handle or stream exists, and a
  // convolution stops before cuDNN is asked for a plan.
  bool dry = false;
  uintptr_t dry_next = 0x10000;
  int device = 0;
  bool fp16 = false;
  bool allow_tf32 = false;
  int autotune_candidates = 6;  // cuDNN plans timed per convolution (VIGIL_CUDNN_AUTOTUNE)
  cuda::PlanLookup plan_lookup;  // the process's plan cache and this Compile's counts (Compile only)
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceBuffer cublas_workspace;
  DeviceBuffer autotune;  // scratch workspace while choosing cuDNN plans (freed after Compile)
  std::vector<DeviceBuffer> buffers;  // weights, uploaded initializers, kernel scratch
  std::vector<PinnedBuffer> pinned;   // host kernels' staging
  std::map<std::pair<std::string, DType>, void*> uploaded;  // initializer (name, storage dtype) → device copy

  ~Resources() {
    if (cublas) cublasDestroy(cublas);
    if (cudnn) cudnnDestroy(cudnn);
    if (stream) cudaStreamDestroy(stream);
  }

  StatusOr<void*> Alloc(size_t bytes, const std::string& what) {
    if (dry) {
      void* p = reinterpret_cast<void*>(dry_next);
      dry_next += (std::max<size_t>(bytes, 1) + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
      return p;
    }
    VIGIL_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(std::max<size_t>(bytes, 1), what));
    void* p = b.get();
    buffers.push_back(std::move(b));
    return p;
  }
  StatusOr<void*> Upload(const void* host, size_t bytes, const std::string& what) {
    if (dry) return Alloc(bytes, what);
    VIGIL_ASSIGN_OR_RETURN(void* p, Alloc(bytes, what));
    VIGIL_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
  }
  // `t` converted to `dtype` (float32 <-> float16 only; else as is) and uploaded.
  StatusOr<void*> UploadTensor(const Tensor& t, DType dtype, const std::string& what) {
    const DType stored = IsFloat(t.dtype()) && IsFloat(dtype) ? dtype : t.dtype();
    if (dry) return Alloc(static_cast<size_t>(t.numel()) * DTypeSize(stored), what);
    if (t.dtype() == dtype || !IsFloat(t.dtype()) || !IsFloat(dtype)) return Upload(t.raw(), t.nbytes(), what);
    Tensor f = t.ToFloat32();
    if (dtype == DType::kFloat32) return Upload(f.raw(), f.nbytes(), what);
    std::vector<uint16_t> h(static_cast<size_t>(f.numel()));
    for (size_t i = 0; i < h.size(); ++i) h[i] = FloatToHalf(f.data<float>()[i]);
    return Upload(h.data(), h.size() * 2, what);
  }
};

// ---- Kernels -----------------------------------------------------------------------------------

class LambdaKernel final : public CudaKernel {
 public:
  using Fn = std::function<Status(cudaStream_t)>;
  LambdaKernel(std::string_view name, Fn fn) : name_(name), fn_(std::move(fn)) {}
  std::string_view name() const override { return name_; }
  Status Enqueue(cudaStream_t stream) override { return fn_(stream); }

 private:
  std::string_view name_;
  Fn fn_;
};

std::unique_ptr<CudaKernel> Kernel(std::string_view name, LambdaKernel::Fn fn) {
  return std::make_unique<LambdaKernel>(name, std::move(fn));
}

Status Launched(cudaError_t e, const char* what) { return cuda::CudaStatus(e, what); }

class ConvKernel final : public CudaKernel {
 public:
  std::string_view name() const override { return "cudnn"; }
  Status Enqueue(cudaStream_t stream) override {
    if (convert_) VIGIL_RETURN_IF_ERROR(convert_(stream));
    VIGIL_RETURN_IF_ERROR(conv_->Run());
    if (epilogue_) VIGIL_RETURN_IF_ERROR(epilogue_(stream));
    return absl::OkStatus();
  }
  size_t WorkspaceBytes() const override { return conv_->workspace_bytes(); }
  Status BindWorkspace(void* workspace) override { return conv_->Bind(x_, w_, bias_, y_, workspace); }

  std::unique_ptr<cuda::CudnnConv> conv_;
  std::function<Status(cudaStream_t)> convert_, epilogue_;
  const void* x_ = nullptr;
  const void* w_ = nullptr;
  const void* bias_ = nullptr;
  void* y_ = nullptr;
};

// The reference kernel on the host between device copies (cudaLaunchHostFunc: capturable in graphs).
class HostKernel final : public CudaKernel {
 public:
  HostKernel(const Node& node, int64_t opset, RunFn run) : node_(node), opset_(opset), run_(run) {}
  std::string_view name() const override { return "host"; }
  Status Enqueue(cudaStream_t stream) override {
    for (const Copy& c : in_copies_) VIGIL_CUDA(cudaMemcpyAsync(c.host, c.device, c.bytes, cudaMemcpyDeviceToHost, stream));
    VIGIL_CUDA(cudaLaunchHostFunc(stream, &HostKernel::Call, this));
    for (const Copy& c : out_copies_) VIGIL_CUDA(cudaMemcpyAsync(c.device, c.host, c.bytes, cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }
  Status Check() override { return std::exchange(status_, absl::OkStatus()); }

  struct Copy {
    void* host;
    void* device;
    size_t bytes;
  };
  std::vector<Tensor> inputs_, outputs_;
  std::vector<Copy> in_copies_, out_copies_;

 private:
  static void Call(void* self) {
    auto* k = static_cast<HostKernel*>(self);
    Status s = k->run_(KernelContext{k->node_, k->opset_, k->inputs_, k->outputs_});
    if (!s.ok() && k->status_.ok()) k->status_ = s;
  }
  Node node_;
  int64_t opset_;
  RunFn run_;
  Status status_;
};

// ---- Kernel construction -----------------------------------------------------------------------

struct Build {
  const Graph& g;
  const Node& node;
  BlockedRole role;
  int64_t opset;
  const std::unordered_map<std::string, Value>& values;
  Resources& res;

  bool IsInit(size_t i) const { return node.HasInput(i) && g.IsInitializer(node.inputs[i]); }
  const Tensor* Init(size_t i) const { return node.HasInput(i) ? g.FindInitializer(node.inputs[i]) : nullptr; }
  // The device value of input i; initializers are uploaded in `dtype` (kUndefined: as declared).
  StatusOr<Value> In(size_t i, DType dtype = DType::kUndefined) {
    const std::string& name = node.inputs[i];
    if (const Tensor* t = g.FindInitializer(name)) {
      const DType want = dtype == DType::kUndefined ? t->dtype() : dtype;
      auto key = std::make_pair(name, want);
      auto it = res.uploaded.find(key);
      if (it == res.uploaded.end()) {
        VIGIL_ASSIGN_OR_RETURN(void* p, res.UploadTensor(*t, want, name));
        it = res.uploaded.emplace(key, p).first;
      }
      const DType stored = IsFloat(t->dtype()) && IsFloat(want) ? want : t->dtype();
      return Value{it->second, stored, t->shape(), false};
    }
    auto it = values.find(name);
    if (it == values.end()) return NodeError(node, "input '", name, "' has no device value");
    return it->second;
  }
  const Value& Out(size_t i) const { return values.at(node.outputs[i]); }
  template <typename... Args>
  Status Unsupported(const Args&... args) const {
    return NodeUnimplemented(node, "no CUDA kernel: ", args...);
  }
};

// Explicit or auto_pad padding of one spatial axis (ONNX Conv/MaxPool: auto_pad).
std::pair<int64_t, int64_t> Pads(const Node& node, size_t axis, size_t spatial, int64_t in, int64_t out, int64_t k,
                                 int64_t s, int64_t d) {
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t total = std::max<int64_t>(0, (out - 1) * s + (k - 1) * d + 1 - in);
    const int64_t small = total / 2, big = total - small;
    return auto_pad == "SAME_UPPER" ? std::make_pair(small, big) : std::make_pair(big, small);
  }
  if (auto_pad == "VALID") return {0, 0};
  const std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * spatial, 0));
  return {pads[axis], pads[axis + spatial]};
}

StatusOr<std::unique_ptr<CudaKernel>> MakeConv(Build& b) {
  const Node& node = b.node;
  const Tensor* w = b.Init(1);
  if (w == nullptr) return b.Unsupported("weights must be an initializer");
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.shape.size() != 4 || w->rank() != 4 || !IsFloat(y.dtype)) return b.Unsupported("only 2-D float convolutions");
  const int64_t group = node.GetInt("group", 1);
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3];
  const int64_t k = w->dim(0), cg = w->dim(1), r = w->dim(2), s = w->dim(3);
  const int64_t oh = y.shape[2], ow = y.shape[3];
  const std::vector<int64_t> strides = node.GetInts("strides", {1, 1}), dil = node.GetInts("dilations", {1, 1});
  const DType dt = y.dtype;
  const bool out_nhwc = y.nhwc;

  auto kernel = std::make_unique<ConvKernel>();
  // Input as cuDNN reads it: y's dtype and layout. A float16 NHWC convolution reading 3 (or any
  // non-multiple-of-8) channels gets them zero-padded to a multiple of 8 so tensor-core engines apply.
  const bool pad = dt == DType::kFloat16 && out_nhwc && group == 1 && c % 8 != 0;
  const int64_t cp = pad ? (c + 7) / 8 * 8 : c;
  const bool convert = pad || x.dtype != dt || x.nhwc != out_nhwc;
  Value xin = x;
  if (convert) {
    xin.dtype = dt;
    xin.nhwc = out_nhwc;
    xin.shape = {n, cp, h, wd};
    VIGIL_ASSIGN_OR_RETURN(xin.ptr, b.res.Alloc(xin.bytes(), node.name + " input"));
    if (!b.res.dry) VIGIL_CUDA(cudaMemset(xin.ptr, 0, xin.bytes()));  // padding channels stay zero
    const cuda::Strides4d ds = StridesOf(xin), ss = StridesOf(x);
    VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView({n, c, h, wd}, {ds.n, ds.c, ds.h, ds.w}));
    VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView({n, c, h, wd}, {ss.n, ss.c, ss.h, ss.w}));
    kernel->convert_ = [=](cudaStream_t st) {
      return Launched(cuda::StridedCopy(xin.ptr, ElemOf(dt), dv, x.ptr, ElemOf(x.dtype), sv, st), "conv input");
    };
  }
  // Weights OIHW → the output's layout (KRSC for NHWC), padded channels zero, in dt.
  const int64_t cgp = pad ? cp : cg;
  std::vector<float> wl(static_cast<size_t>(k * cgp * r * s), 0.0f);
  if (!b.res.dry) {  // a dry run converts no weights (UploadTensor only reserves their room)
    Tensor wf = w->ToFloat32();
    for (int64_t o = 0; o < k; ++o)
      for (int64_t i = 0; i < cg; ++i)
        for (int64_t a = 0; a < r; ++a)
          for (int64_t e = 0; e < s; ++e) {
            const float v = wf.data<float>()[((o * cg + i) * r + a) * s + e];
            const int64_t at = out_nhwc ? ((o * r + a) * s + e) * cgp + i : ((o * cgp + i) * r + a) * s + e;
            wl[static_cast<size_t>(at)] = v;
          }
  }
  VIGIL_ASSIGN_OR_RETURN(void* wdev, b.res.UploadTensor(Tensor::Wrap(DType::kFloat32, {k, cgp, r, s}, wl.data()), dt,
                                                        node.name + " weights"));
  const Tensor* bias = b.Init(2);
  if (node.HasInput(2) && bias == nullptr) return b.Unsupported("bias must be an initializer");
  const std::string act_name = node.GetString("activation", "");
  cuda::ConvActivation act = cuda::ConvActivation::kNone;
  cuda::UnaryOp uact = cuda::UnaryOp::kIdentity;
  if (act_name == "SiLU") act = cuda::ConvActivation::kSiLU, uact = cuda::UnaryOp::kSiLU;
  else if (act_name == "Relu") act = cuda::ConvActivation::kRelu, uact = cuda::UnaryOp::kRelu;
  else if (!act_name.empty()) return b.Unsupported("activation '", act_name, "'");

  cuda::ConvSpec spec;
  const cuda::Strides4d xs = StridesOf(xin), ys = StridesOf(y);
  spec.x_dims = {n, cp, h, wd};
  spec.x_strides = {xs.n, xs.c, xs.h, xs.w};
  spec.w_dims = {k, cgp, r, s};
  spec.w_strides = out_nhwc ? std::array<int64_t, 4>{r * s * cgp, 1, s * cgp, cgp}
                            : std::array<int64_t, 4>{cgp * r * s, r * s, s, 1};
  spec.y_dims = {n, k, oh, ow};
  spec.y_strides = {ys.n, ys.c, ys.h, ys.w};
  for (size_t a = 0; a < 2; ++a) {
    const int64_t in = a == 0 ? h : wd, out = a == 0 ? oh : ow, kk = a == 0 ? r : s;
    auto [pre, post] = Pads(node, a, 2, in, out, kk, strides[a], dil[a]);
    spec.pre_pad[a] = pre;
    spec.post_pad[a] = post;
    spec.stride[a] = strides[a];
    spec.dilation[a] = dil[a];
  }
  spec.data_type = dt == DType::kFloat16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  spec.allow_tensor_core_fp32 = b.res.allow_tf32;
  spec.has_bias = bias != nullptr;
  spec.activation = act;
  spec.workspace_limit = kAutotuneWorkspace;
  spec.max_candidates = b.res.autotune_candidates;

  void* bias_dt = nullptr;
  if (bias) {
    VIGIL_ASSIGN_OR_RETURN(bias_dt, b.res.UploadTensor(*bias, dt, node.name + " bias"));
  }
  spec.fuse_epilogue = bias != nullptr || act != cuda::ConvActivation::kNone;
  if (b.res.dry) return std::unique_ptr<CudaKernel>(std::move(kernel));  // assumed: cuDNN has an engine for it
  auto conv = cuda::CudnnConv::Create(b.res.cudnn, spec, xin.ptr, wdev, bias_dt, y.ptr, b.res.autotune.get(), b.res.stream,
                                   b.res.plan_lookup);
  if (!conv.ok() && spec.fuse_epilogue) {
    spec.fuse_epilogue = false;
    conv = cuda::CudnnConv::Create(b.res.cudnn, spec, xin.ptr, wdev, nullptr, y.ptr, b.res.autotune.get(), b.res.stream,
                                   b.res.plan_lookup);
    if (conv.ok()) {
      void* bias_f = nullptr;
      if (bias) {
        VIGIL_ASSIGN_OR_RETURN(bias_f, b.res.UploadTensor(*bias, DType::kFloat32, node.name + " bias"));
      }
      const int64_t total = NumElements(y.shape), inner = out_nhwc ? 1 : oh * ow;
      kernel->epilogue_ = [=, out = y.ptr](cudaStream_t st) {
        return Launched(cuda::BiasActivation(out, ElemOf(dt), static_cast<const float*>(bias_f), total, k, inner, uact,
                                             0.0f, st),
                        "conv epilogue");
      };
    }
  }
  if (!conv.ok()) return b.Unsupported(conv.status().message());
  kernel->conv_ = *std::move(conv);
  kernel->x_ = xin.ptr;
  kernel->w_ = wdev;
  kernel->bias_ = kernel->epilogue_ ? nullptr : bias_dt;
  kernel->y_ = y.ptr;
  return std::unique_ptr<CudaKernel>(std::move(kernel));
}

StatusOr<std::unique_ptr<CudaKernel>> MakeMaxPool(Build& b) {
  const Node& node = b.node;
  if (node.outputs.size() > 1 && !node.outputs[1].empty()) return b.Unsupported("Indices output");
  if (node.GetInt("storage_order", 0) != 0) return b.Unsupported("storage_order 1");
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.shape.size() != 4 || !IsFloat(x.dtype) || !IsFloat(y.dtype)) return b.Unsupported("only 2-D float pooling");
  const std::vector<int64_t> ks = node.GetInts("kernel_shape"), st = node.GetInts("strides", {1, 1}),
                             dl = node.GetInts("dilations", {1, 1});
  if (ks.size() != 2) return b.Unsupported("only 2-D pooling");
  cuda::Pool2d p{};
  p.n = x.shape[0], p.c = x.shape[1], p.h = x.shape[2], p.w = x.shape[3], p.oh = y.shape[2], p.ow = y.shape[3];
  p.kh = ks[0], p.kw = ks[1], p.sh = st[0], p.sw = st[1], p.dh = dl[0], p.dw = dl[1];
  p.ph = Pads(node, 0, 2, p.h, p.oh, p.kh, p.sh, p.dh).first;
  p.pw = Pads(node, 1, 2, p.w, p.ow, p.kw, p.sw, p.dw).first;
  p.in = StridesOf(x);
  p.out = StridesOf(y);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::MaxPool2d(y.ptr, ElemOf(y.dtype), x.ptr, ElemOf(x.dtype), p, s), "MaxPool");
  });
}

const std::map<std::string, cuda::UnaryOp>& UnaryOps() {
  static const auto* ops = new std::map<std::string, cuda::UnaryOp>{
      {"Sigmoid", cuda::UnaryOp::kSigmoid}, {"Relu", cuda::UnaryOp::kRelu},         {"LeakyRelu", cuda::UnaryOp::kLeakyRelu},
      {"Tanh", cuda::UnaryOp::kTanh},       {"Exp", cuda::UnaryOp::kExp},           {"Log", cuda::UnaryOp::kLog},
      {"Neg", cuda::UnaryOp::kNeg},         {"Abs", cuda::UnaryOp::kAbs},           {"Sqrt", cuda::UnaryOp::kSqrt},
      {"Reciprocal", cuda::UnaryOp::kReciprocal}, {"Floor", cuda::UnaryOp::kFloor}, {"Ceil", cuda::UnaryOp::kCeil},
      {"Erf", cuda::UnaryOp::kErf},         {"HardSigmoid", cuda::UnaryOp::kHardSigmoid},
      {"HardSwish", cuda::UnaryOp::kHardSwish}, {"Softplus", cuda::UnaryOp::kSoftplus}, {"Clip", cuda::UnaryOp::kClip},
      {"Round", cuda::UnaryOp::kRound}};
  return *ops;
}

const std::map<std::string, cuda::BinaryOp>& BinaryOps() {
  static const auto* ops = new std::map<std::string, cuda::BinaryOp>{
      {"Add", cuda::BinaryOp::kAdd}, {"Sub", cuda::BinaryOp::kSub}, {"Mul", cuda::BinaryOp::kMul},
      {"Div", cuda::BinaryOp::kDiv}, {"Pow", cuda::BinaryOp::kPow}, {"Max", cuda::BinaryOp::kMax},
      {"Min", cuda::BinaryOp::kMin}, {"Sum", cuda::BinaryOp::kAdd}, {"Mean", cuda::BinaryOp::kAdd},
      {"Mod", cuda::BinaryOp::kMod}, {"Equal", cuda::BinaryOp::kEqual}, {"Greater", cuda::BinaryOp::kGreater},
      {"GreaterOrEqual", cuda::BinaryOp::kGreaterOrEqual}, {"Less", cuda::BinaryOp::kLess},
      {"LessOrEqual", cuda::BinaryOp::kLessOrEqual}, {"And", cuda::BinaryOp::kAnd}, {"Or", cuda::BinaryOp::kOr}};
  return *ops;
}

const std::map<std::string, cuda::ReduceOp>& ReduceOps() {
  static const auto* ops = new std::map<std::string, cuda::ReduceOp>{
      {"ReduceSum", cuda::ReduceOp::kSum},       {"ReduceMean", cuda::ReduceOp::kMean},
      {"ReduceMax", cuda::ReduceOp::kMax},       {"ReduceMin", cuda::ReduceOp::kMin},
      {"ReduceProd", cuda::ReduceOp::kProd},     {"ReduceL2", cuda::ReduceOp::kL2},
      {"ArgMax", cuda::ReduceOp::kArgMax},       {"ArgMin", cuda::ReduceOp::kArgMin},
      {"GlobalAveragePool", cuda::ReduceOp::kMean}, {"GlobalMaxPool", cuda::ReduceOp::kMax}};
  return *ops;
}

StatusOr<std::unique_ptr<CudaKernel>> MakeUnary(Build& b, cuda::UnaryOp op) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype ", DTypeName(x.dtype));
  float alpha = 0.0f, beta = 0.0f;
  if (node.op_type == "LeakyRelu") alpha = node.GetFloat("alpha", 0.01f);
  if (node.op_type == "HardSigmoid") alpha = node.GetFloat("alpha", 0.2f), beta = node.GetFloat("beta", 0.5f);
  if (node.op_type == "Clip") {
    alpha = -3.402823466e38f, beta = 3.402823466e38f;
    if (b.opset < 11) {
      alpha = node.GetFloat("min", alpha), beta = node.GetFloat("max", beta);
    } else {
      for (size_t i = 1; i < 3; ++i) {
        if (!node.HasInput(i)) continue;
        const Tensor* t = b.Init(i);
        if (t == nullptr || t->numel() != 1) return b.Unsupported("min/max must be initializers");
        (i == 1 ? alpha : beta) = t->ToFloatVector()[0];
      }
    }
  }
  const int64_t n = NumElements(y.shape);
  if (op == cuda::UnaryOp::kIdentity) {
    return Kernel("copy", [=](cudaStream_t s) {
      return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, x.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "Identity");
    });
  }
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Unary(op, alpha, beta, y.ptr, x.ptr, ElemOf(y.dtype), n, s), "unary");
  });
}

// The operands' storage type of an element-wise node: that of its first activation input (initializers
// are uploaded in it), else of input 0.
StatusOr<DType> OperandDType(Build& b) {
  for (size_t i = 0; i < b.node.inputs.size(); ++i) {
    if (b.node.HasInput(i) && !b.IsInit(i)) {
      VIGIL_ASSIGN_OR_RETURN(Value v, b.In(i));
      return v.dtype;
    }
  }
  return b.g.types.at(b.node.inputs[0]).dtype;
}

// Operand i of an element-wise node with output y, read in `dtype`, and its view over y's shape: the
// broadcast strides (NCHW), or same-shape NHWC / one element (NHWC; layout_plan.h kAgnostic).
StatusOr<std::pair<Value, StridedView>> Operand(Build& b, size_t i, const Value& y, DType dtype) {
  VIGIL_ASSIGN_OR_RETURN(Value v, b.In(i, dtype));
  if (v.dtype != dtype) return b.Unsupported("mixed dtypes");
  const bool one = NumElements(v.shape) == 1;
  StridedView view;
  if (y.nhwc) {
    if (!one && (!v.nhwc || v.shape != y.shape)) return b.Unsupported("operand layout");
    VIGIL_ASSIGN_OR_RETURN(view, MakeView({NumElements(y.shape)}, {one ? 0 : 1}));
  } else {
    if (v.nhwc) return b.Unsupported("operand layout");
    VIGIL_ASSIGN_OR_RETURN(view, MakeView(y.shape, BroadcastStrides(v.shape, y.shape)));
  }
  return std::make_pair(v, view);
}

// Binary ops, and the variadic Sum / Mean / Max / Min folded left to right into the output (Mean then
// divides by the count), as the host reference does.
StatusOr<std::unique_ptr<CudaKernel>> MakeBinary(Build& b, cuda::BinaryOp op) {
  const Node& node = b.node;
  const std::string& name = node.op_type;
  const bool variadic = name == "Sum" || name == "Mean" || name == "Max" || name == "Min";
  if (!variadic && node.NumInputs() != 2) return b.Unsupported(node.NumInputs(), " inputs");
  if (node.NumInputs() < 1) return b.Unsupported("no inputs");
  const Value& y = b.Out(0);
  VIGIL_ASSIGN_OR_RETURN(const DType dtype, OperandDType(b));
  ElemType et;
  if (!ElemOfAny(dtype, &et)) return b.Unsupported("dtype ", DTypeName(dtype));
  if (op == cuda::BinaryOp::kPow && !IsFloat(dtype)) return b.Unsupported("integer Pow");
  if (name == "Mod" && node.GetInt("fmod", 0) == 1) op = cuda::BinaryOp::kFMod;
  if (name == "Mean" && !IsFloat(dtype)) return b.Unsupported("integer Mean");
  if (cuda::BinaryWritesBool(op) ? y.dtype != DType::kBool : y.dtype != dtype) return b.Unsupported("output dtype");
  struct Arg {
    Value v;
    StridedView view;
  };
  std::vector<Arg> args;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.HasInput(i)) return b.Unsupported("omitted input");
    VIGIL_ASSIGN_OR_RETURN(auto a, Operand(b, i, y, dtype));
    args.push_back({a.first, a.second});
  }
  // y read back in place by the later steps: a view of the operands' rank (NHWC operands are flat).
  const Shape y_shape = y.nhwc ? Shape{NumElements(y.shape)} : y.shape;
  VIGIL_ASSIGN_OR_RETURN(StridedView yv, MakeView(y_shape, ContiguousStrides(y_shape)));
  VIGIL_ASSIGN_OR_RETURN(StridedView one, MakeView(y_shape, std::vector<int64_t>(y_shape.size(), 0)));
  void* mean_count = nullptr;
  if (name == "Mean") {
    const float count = static_cast<float>(args.size());
    const uint16_t half = FloatToHalf(count);
    VIGIL_ASSIGN_OR_RETURN(mean_count, b.res.Upload(dtype == DType::kFloat16 ? static_cast<const void*>(&half)
                                                                               : static_cast<const void*>(&count),
                                                    DTypeSize(dtype), node.name + " count"));
  }
  return Kernel("cuda", [=](cudaStream_t s) -> Status {
    if (args.size() == 1) {
      return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, args[0].v.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "variadic copy");
    }
    VIGIL_RETURN_IF_ERROR(Launched(cuda::Binary(op, y.ptr, args[0].v.ptr, args[0].view, args[1].v.ptr, args[1].view, et, s),
                                   "binary"));
    // y is contiguous, so each later step reads it back in place.
    for (size_t i = 2; i < args.size(); ++i) {
      VIGIL_RETURN_IF_ERROR(Launched(cuda::Binary(op, y.ptr, y.ptr, yv, args[i].v.ptr, args[i].view, et, s), "variadic"));
    }
    if (mean_count != nullptr) {
      VIGIL_RETURN_IF_ERROR(Launched(cuda::Binary(cuda::BinaryOp::kDiv, y.ptr, y.ptr, yv, mean_count, one, et, s), "Mean"));
    }
    return absl::OkStatus();
  });
}

// Concat (one output, many inputs) or Split (one input, many outputs): copies of [outer, len, inner]
// pieces along the physical axis.
StatusOr<std::unique_ptr<CudaKernel>> MakeConcatSplit(Build& b, bool concat) {
  const Node& node = b.node;
  Value whole;
  if (concat) {
    whole = b.Out(0);
  } else {
    VIGIL_ASSIGN_OR_RETURN(whole, b.In(0));
  }
  if (!Storable(whole.dtype)) return b.Unsupported("dtype ", DTypeName(whole.dtype));
  const int64_t rank = static_cast<int64_t>(whole.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", concat ? -1 : 0), rank));
  const Shape phys = PhysicalShape(whole);
  const int64_t pa = PhysicalAxis(whole, axis);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < pa; ++d) outer *= phys[d];
  for (int64_t d = pa + 1; d < rank; ++d) inner *= phys[d];
  const int64_t total = phys[pa];
  struct Piece {
    void* ptr;
    int64_t offset, len;
    DType dtype;
  };
  std::vector<Piece> pieces;
  int64_t offset = 0;
  const size_t count = concat ? node.inputs.size() : node.outputs.size();
  for (size_t i = 0; i < count; ++i) {
    Value v;
    if (concat) {
      if (node.inputs[i].empty()) continue;
      VIGIL_ASSIGN_OR_RETURN(v, b.In(i, whole.dtype));
    } else {
      if (node.outputs[i].empty()) return b.Unsupported("omitted Split output");
      v = b.Out(i);
    }
    if (v.dtype != whole.dtype || v.nhwc != whole.nhwc) return b.Unsupported("piece dtype or layout");
    const int64_t len = v.shape[static_cast<size_t>(axis)];
    pieces.push_back({v.ptr, offset, len, v.dtype});
    offset += len;
  }
  if (offset != total) return NodeError(node, "pieces cover ", offset, " of ", total, " along axis ", axis);
  std::vector<std::pair<StridedView, StridedView>> views;  // (whole-side, piece-side)
  for (const Piece& p : pieces) {
    VIGIL_ASSIGN_OR_RETURN(StridedView wv, MakeView({outer, p.len, inner}, {total * inner, inner, 1}));
    VIGIL_ASSIGN_OR_RETURN(StridedView pv, MakeView({outer, p.len, inner}, {p.len * inner, inner, 1}));
    views.emplace_back(wv, pv);
  }
  const ElemType et = AnyElemOf(whole.dtype);
  return Kernel("cuda", [=](cudaStream_t s) -> Status {
    for (size_t i = 0; i < pieces.size(); ++i) {
      void* at = Offset(whole.ptr, pieces[i].offset * inner, whole.dtype);
      cudaError_t e = concat ? cuda::StridedCopy(at, et, views[i].first, pieces[i].ptr, et, views[i].second, s)
                             : cuda::StridedCopy(pieces[i].ptr, et, views[i].second, at, et, views[i].first, s);
      VIGIL_RETURN_IF_ERROR(Launched(e, concat ? "Concat" : "Split"));
    }
    return absl::OkStatus();
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeTranspose(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!Storable(x.dtype) || x.dtype != y.dtype || x.nhwc) return b.Unsupported("dtype or layout");
  const size_t r = x.shape.size();
  std::vector<int64_t> perm = b.node.GetInts("perm");
  if (perm.empty())
    for (size_t d = 0; d < r; ++d) perm.push_back(static_cast<int64_t>(r - 1 - d));
  const std::vector<int64_t> xs = ContiguousStrides(x.shape);
  std::vector<int64_t> src(r);
  for (size_t d = 0; d < r; ++d) src[d] = xs[static_cast<size_t>(perm[d])];
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(y.shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(y.shape, ContiguousStrides(y.shape)));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, AnyElemOf(y.dtype), dv, x.ptr, AnyElemOf(x.dtype), sv, s), "Transpose");
  });
}

// Element strides of each logical axis of a value: row-major for NCHW / any rank, channels innermost for NHWC.
std::vector<int64_t> LogicalStrides(const Value& v) {
  if (!v.nhwc) return ContiguousStrides(v.shape);
  const cuda::Strides4d s = StridesOf(v);
  return {s.n, s.c, s.h, s.w};
}

// An integer initializer input as int64 values, Unsupported when it is not an initializer.
StatusOr<std::vector<int64_t>> ConstInts(Build& b, size_t i, std::string_view what) {
  const Tensor* t = b.Init(i);
  if (t == nullptr) return b.Unsupported(what, " must be a constant (an initializer)");
  return t->ToInt64Vector();
}

// Slice-10+ (starts, ends, axes, steps as constant inputs) and Slice-1 (attributes), ONNX clamping rules: a
// strided copy (the output's extent is its inferred shape). In the NHWC region too (a channel Slice, as
// exporters write C2f's chunk: layout_plan.h), reading and writing through the layout's strides.
StatusOr<std::unique_ptr<CudaKernel>> MakeSlice(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!Storable(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> starts, axes, steps;
  if (b.opset < 10) {
    starts = node.GetInts("starts");
    axes = node.GetInts("axes");
  } else {
    VIGIL_ASSIGN_OR_RETURN(starts, ConstInts(b, 1, "starts"));
    if (node.HasInput(3)) {
      VIGIL_ASSIGN_OR_RETURN(axes, ConstInts(b, 3, "axes"));
    }
    if (node.HasInput(4)) {
      VIGIL_ASSIGN_OR_RETURN(steps, ConstInts(b, 4, "steps"));
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  const std::vector<int64_t> xs = LogicalStrides(x);
  std::vector<int64_t> src = xs;
  int64_t base = 0;
  for (size_t i = 0; i < axes.size() && i < starts.size(); ++i) {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, axes[i], r));
    const int64_t dim = x.shape[static_cast<size_t>(a)];
    const int64_t step = i < steps.size() ? steps[i] : 1;
    if (step == 0) return NodeError(node, "step 0 on axis ", a);
    int64_t start = starts[i] < 0 ? starts[i] + dim : starts[i];
    start = step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, 0, dim - 1);
    if (y.shape[static_cast<size_t>(a)] == 0) start = 0;
    base += start * xs[static_cast<size_t>(a)];
    src[static_cast<size_t>(a)] = xs[static_cast<size_t>(a)] * step;
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(y.shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(y.shape, LogicalStrides(y)));
  const void* from = Offset(x.ptr, base, x.dtype);
  const ElemType et = AnyElemOf(x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, et, dv, from, et, sv, s), "Slice");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeSoftmax(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.nhwc || x.dtype != y.dtype) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(b.node, b.node.GetInt("axis", b.opset >= 13 ? -1 : 1), r));
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t d = 0; d < r; ++d) {
    const int64_t v = x.shape[static_cast<size_t>(d)];
    if (d < axis) outer *= v;
    else if (d == axis || b.opset < 13) len *= v;  // Softmax-1/11: the 2-D coercion [outer, rest]
    else inner *= v;
  }
  const bool log = b.node.op_type == "LogSoftmax";
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Softmax(y.ptr, x.ptr, ElemOf(y.dtype), outer, len, inner, log, s), "Softmax");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeResize(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.shape.size() != 4 || x.dtype != y.dtype || x.nhwc != y.nhwc ||
      b.node.GetString("mode", "nearest") != "nearest" || x.shape[0] != y.shape[0] || x.shape[1] != y.shape[1]) {
    return b.Unsupported("only nearest resize of H and W");
  }
  for (size_t i = 1; i < b.node.inputs.size(); ++i) {
    if (b.node.HasInput(i) && !b.IsInit(i)) return b.Unsupported("scales/sizes must be initializers");
  }
  VIGIL_ASSIGN_OR_RETURN(std::vector<int64_t> source, NearestResizeSources(b.node, b.g, b.opset));
  std::vector<int32_t> s32(source.begin(), source.end());
  VIGIL_ASSIGN_OR_RETURN(void* map, b.res.Upload(s32.data(), s32.size() * 4, b.node.name + " map"));
  const cuda::Strides4d is = StridesOf(x), os = StridesOf(y);
  const int64_t pixels = y.shape[2] * y.shape[3];
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::ResizeNearest(y.ptr, x.ptr, ElemOf(y.dtype), y.shape[0], y.shape[1], x.shape[3], y.shape[3],
                                        pixels, static_cast<const int32_t*>(map), is, os, s),
                    "Resize");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeMatMul(Build& b) {
  const Value& y = b.Out(0);
  if (!IsFloat(y.dtype)) return b.Unsupported("dtype");
  VIGIL_ASSIGN_OR_RETURN(Value a, b.In(0, y.dtype));
  VIGIL_ASSIGN_OR_RETURN(Value c, b.In(1, y.dtype));
  if (a.dtype != y.dtype || c.dtype != y.dtype || a.shape.size() < 2 || c.shape.size() < 2 || a.nhwc || c.nhwc) {
    return b.Unsupported("only float operands of rank >= 2");
  }
  const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), n = c.shape.back();
  const int64_t batch = NumElements(y.shape) / (m * n);
  // Each operand's batch dims must equal the output's, or all be 1 (stride 0).
  auto batch_stride = [&](const Value& v, int64_t matrix) -> int64_t {
    const int64_t count = NumElements(v.shape) / matrix;
    return count == batch ? matrix : count == 1 ? 0 : -1;
  };
  const int64_t sa = batch_stride(a, m * k), sc = batch_stride(c, k * n);
  Shape ab(a.shape.begin(), a.shape.end() - 2), cb(c.shape.begin(), c.shape.end() - 2),
      yb(y.shape.begin(), y.shape.end() - 2);
  auto aligned = [&](const Shape& s) { return NumElements(s) == 1 || s == Shape(yb.end() - s.size(), yb.end()); };
  if (sa < 0 || sc < 0 || !aligned(ab) || !aligned(cb)) return b.Unsupported("batch broadcasting");
  const cudaDataType_t dt = y.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_32F;
  cublasHandle_t handle = b.res.cublas;
  return Kernel("cublas", [=](cudaStream_t) -> Status {
    const float one = 1.0f, zero = 0.0f;
    // Row-major C[m,n] = A[m,k]·B[k,n] is column-major C^T = B^T·A^T.
    VIGIL_CUBLAS(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                            static_cast<int>(k), &one, c.ptr, dt, static_cast<int>(n), sc, a.ptr, dt,
                                            static_cast<int>(k), sa, &zero, y.ptr, dt, static_cast<int>(n), m * n,
                                            static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  });
}

// Reshape, Flatten, Squeeze, Unsqueeze: the bytes are unchanged.
StatusOr<std::unique_ptr<CudaKernel>> MakeReshape(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.nhwc || x.dtype != y.dtype) return b.Unsupported("layout");
  return Kernel("copy", [=](cudaStream_t s) {
    return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, x.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "reshape copy");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeToNchw(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  const Shape& s = x.shape;
  const cuda::Strides4d xs = StridesOf(x), ys = StridesOf(y);
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(s, {xs.n, xs.c, xs.h, xs.w}));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(s, {ys.n, ys.c, ys.h, ys.w}));
  return Kernel("cuda", [=](cudaStream_t st) {
    return Launched(cuda::StridedCopy(y.ptr, ElemOf(y.dtype), dv, x.ptr, ElemOf(x.dtype), sv, st), "ToNchw");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeHost(Build& b) {
  const Node& node = b.node;
  const OpSchema* schema = FindOp(node.domain, node.op_type);
  auto kernel = std::make_unique<HostKernel>(node, b.opset, schema->run);
  auto pinned = [&](const Value& v) -> StatusOr<Tensor> {
    VIGIL_ASSIGN_OR_RETURN(PinnedBuffer p, PinnedBuffer::Allocate(std::max<size_t>(v.bytes(), 1), node.name));
    Tensor t = Tensor::Wrap(v.dtype, v.shape, p.get());
    b.res.pinned.push_back(std::move(p));
    return t;
  };
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!node.HasInput(i)) {
      kernel->inputs_.emplace_back();
    } else if (const Tensor* init = b.Init(i)) {
      kernel->inputs_.push_back(*init);
    } else {
      VIGIL_ASSIGN_OR_RETURN(Value v, b.In(i));
      if (v.nhwc) return NodeError(node, "host kernel cannot read NHWC input ", i);
      VIGIL_ASSIGN_OR_RETURN(Tensor t, pinned(v));
      kernel->in_copies_.push_back({t.raw(), v.ptr, v.bytes()});
      kernel->inputs_.push_back(t);
    }
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.outputs[i].empty()) {
      kernel->outputs_.emplace_back();
      continue;
    }
    const Value& v = b.Out(i);
    VIGIL_ASSIGN_OR_RETURN(Tensor t, pinned(v));
    kernel->out_copies_.push_back({t.raw(), v.ptr, v.bytes()});
    kernel->outputs_.push_back(t);
  }
  return std::unique_ptr<CudaKernel>(std::move(kernel));
}

// ---- Kernels of the reference op set beyond the detection body (issue 21 item 2) ------------------

// A 4-byte-aligned copy of the whole value (Identity, Dropout at inference, Reshape and friends).
StatusOr<std::unique_ptr<CudaKernel>> MakeCopy(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype or layout");
  if (b.node.outputs.size() > 1 && !b.node.outputs[1].empty()) return b.Unsupported("Dropout mask output");
  return Kernel("copy", [=](cudaStream_t s) {
    return cuda::CudaStatus(cudaMemcpyAsync(y.ptr, x.ptr, y.bytes(), cudaMemcpyDeviceToDevice, s), "copy");
  });
}

// A pinned word pair the index kernels report a bad index in (cuda::Fault); Check reads it after the
// stream synchronised. Null in a dry run.
class FaultWord {
 public:
  static StatusOr<FaultWord> Create(Resources& res, const std::string& what) {
    FaultWord f;
    if (res.dry) return f;
    VIGIL_ASSIGN_OR_RETURN(PinnedBuffer p, PinnedBuffer::Allocate(2 * sizeof(cuda::Fault), what));
    f.word_ = static_cast<cuda::Fault*>(p.get());
    f.word_[0] = f.word_[1] = 0;
    res.pinned.push_back(std::move(p));
    return f;
  }
  cuda::Fault* get() const { return word_; }
  // The error for a reported index (then cleared), or OK.
  Status Take(const Node& node, int64_t dim) const {
    if (word_ == nullptr || word_[0] == 0) return absl::OkStatus();
    const auto index = static_cast<int64_t>(word_[1]);
    word_[0] = word_[1] = 0;
    return NodeError(node, "index ", index, " is out of range for an axis of size ", dim);
  }

 private:
  cuda::Fault* word_ = nullptr;
};

class IndexKernel final : public CudaKernel {
 public:
  IndexKernel(const Node& node, int64_t dim, FaultWord fault, LambdaKernel::Fn fn)
      : node_(node), dim_(dim), fault_(fault), fn_(std::move(fn)) {}
  std::string_view name() const override { return "cuda"; }
  Status Enqueue(cudaStream_t stream) override { return fn_(stream); }
  Status Check() override { return fault_.Take(node_, dim_); }

 private:
  Node node_;
  int64_t dim_;
  FaultWord fault_;
  LambdaKernel::Fn fn_;
};

StatusOr<std::unique_ptr<CudaKernel>> MakeNot(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.dtype != DType::kBool || y.dtype != DType::kBool) return b.Unsupported("dtype");
  const int64_t n = NumElements(y.shape);
  return Kernel("cuda", [=](cudaStream_t s) { return Launched(cuda::LogicalNot(y.ptr, x.ptr, n, s), "Not"); });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeWhere(Build& b) {
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(y.dtype, &et) || y.nhwc) return b.Unsupported("dtype or layout");
  VIGIL_ASSIGN_OR_RETURN(auto c, Operand(b, 0, y, DType::kBool));
  VIGIL_ASSIGN_OR_RETURN(auto x, Operand(b, 1, y, y.dtype));
  VIGIL_ASSIGN_OR_RETURN(auto z, Operand(b, 2, y, y.dtype));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Where(y.ptr, c.first.ptr, c.second, x.first.ptr, x.second, z.first.ptr, z.second, et, s), "Where");
  });
}

// Cast: a converting copy (ONNX Cast rules, kernels.h StridedCopy). CastLike likewise.
StatusOr<std::unique_ptr<CudaKernel>> MakeCast(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType xt, yt;
  if (!ElemOfAny(x.dtype, &xt) || !ElemOfAny(y.dtype, &yt) || x.nhwc || y.nhwc) {
    return b.Unsupported("cast ", DTypeName(x.dtype), " to ", DTypeName(y.dtype));
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView v, MakeView({NumElements(y.shape)}, {1}));
  return Kernel("cuda", [=](cudaStream_t s) { return Launched(cuda::StridedCopy(y.ptr, yt, v, x.ptr, xt, v, s), "Cast"); });
}

// Expand (broadcast strides) and Tile (each repeated axis split in (repeats, size) with stride 0 on the first).
StatusOr<std::unique_ptr<CudaKernel>> MakeExpandTile(Build& b, bool tile) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype != y.dtype || x.nhwc || y.nhwc) return b.Unsupported("dtype or layout");
  StridedView sv, dv;
  if (!tile) {
    VIGIL_ASSIGN_OR_RETURN(sv, MakeView(y.shape, BroadcastStrides(x.shape, y.shape)));
    VIGIL_ASSIGN_OR_RETURN(dv, MakeView(y.shape, ContiguousStrides(y.shape)));
  } else {
    if (x.shape.size() != y.shape.size()) return b.Unsupported("rank");
    const std::vector<int64_t> xs = ContiguousStrides(x.shape);
    Shape shape;
    std::vector<int64_t> src;
    for (size_t d = 0; d < x.shape.size(); ++d) {
      const int64_t reps = x.shape[d] == 0 ? 0 : y.shape[d] / x.shape[d];
      if (reps != 1) shape.push_back(reps), src.push_back(0);
      shape.push_back(x.shape[d]), src.push_back(xs[d]);
    }
    VIGIL_ASSIGN_OR_RETURN(sv, MakeView(shape, src));
    VIGIL_ASSIGN_OR_RETURN(dv, MakeView(shape, ContiguousStrides(shape)));
  }
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, et, dv, x.ptr, et, sv, s), tile ? "Tile" : "Expand");
  });
}

// DepthToSpace (DCR / CRD) and SpaceToDepth: 6-D strided copies.
StatusOr<std::unique_ptr<CudaKernel>> MakeDepthSpace(Build& b, bool to_space) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype != y.dtype || x.nhwc || y.nhwc || x.shape.size() != 4) {
    return b.Unsupported("dtype, layout or rank");
  }
  const int64_t bs = b.node.GetInt("blocksize", 0);
  if (bs <= 0) return NodeError(b.node, "blocksize must be positive");
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  Shape shape;
  std::vector<int64_t> src;
  if (to_space) {  // y [n, c/bs², h·bs, w·bs] as [n, c', h, bs, w, bs]
    const int64_t cp = c / (bs * bs);
    const bool crd = b.node.GetString("mode", "DCR") == "CRD";
    shape = {n, cp, h, bs, w, bs};
    // x channel of (c', i, j): DCR (i·bs + j)·c' + c'; CRD c'·bs² + i·bs + j.
    const int64_t hw = h * w;
    src = {c * hw, (crd ? bs * bs : 1) * hw, w, (crd ? bs : bs * cp) * hw, 1, (crd ? 1 : cp) * hw};
  } else {  // y [n, c·bs², h/bs, w/bs] as [n, bs, bs, c, h', w'] (channel (i·bs + j)·c + c)
    shape = {n, bs, bs, c, h / bs, w / bs};
    src = {c * h * w, w, 1, h * w, bs * w, bs};
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(shape, ContiguousStrides(shape)));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, et, dv, x.ptr, et, sv, s), to_space ? "DepthToSpace" : "SpaceToDepth");
  });
}

// Reduce* (axes as the host reference reads them), ArgMax / ArgMin, GlobalAveragePool / GlobalMaxPool.
StatusOr<std::unique_ptr<CudaKernel>> MakeReduce(Build& b, cuda::ReduceOp op) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype == DType::kBool) return b.Unsupported("dtype ", DTypeName(x.dtype));
  if (op == cuda::ReduceOp::kL2 && !IsFloat(x.dtype)) return b.Unsupported("integer ReduceL2");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  const std::string& name = node.op_type;
  std::vector<int64_t> axes;
  bool select_last = false;
  if (name == "GlobalAveragePool" || name == "GlobalMaxPool") {
    for (int64_t d = 2; d < r; ++d) axes.push_back(d);
  } else if (name == "ArgMax" || name == "ArgMin") {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, node.GetInt("axis", 0), r));
    axes = {a};
    select_last = node.GetInt("select_last_index", 0) != 0;
  } else {
    const int64_t axes_input = name == "ReduceSum" ? 13 : 18;
    if (b.opset >= axes_input) {
      if (node.HasInput(1)) {
        VIGIL_ASSIGN_OR_RETURN(axes, ConstInts(b, 1, "axes"));
      }
    } else {
      axes = node.GetInts("axes");
    }
    if (axes.empty()) {
      if (node.GetInt("noop_with_empty_axes", 0) != 0) return MakeCopy(b);
      for (int64_t d = 0; d < r; ++d) axes.push_back(d);
    }
    VIGIL_ASSIGN_OR_RETURN(axes, NormalizeAxes(node, axes, r));
  }
  // Kept and reduced axes through the input's own strides (NHWC too: global pooling in the region's reader).
  const std::vector<int64_t> xs = LogicalStrides(x);
  Shape kept_shape, red_shape;
  std::vector<int64_t> kept_strides, red_strides;
  for (int64_t d = 0; d < r; ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    (reduced ? red_shape : kept_shape).push_back(x.shape[static_cast<size_t>(d)]);
    (reduced ? red_strides : kept_strides).push_back(xs[static_cast<size_t>(d)]);
  }
  if (y.nhwc) return b.Unsupported("layout");
  VIGIL_ASSIGN_OR_RETURN(StridedView kept, MakeView(kept_shape, kept_strides));
  VIGIL_ASSIGN_OR_RETURN(StridedView red, MakeView(red_shape, red_strides));
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Reduce(op, y.ptr, x.ptr, et, kept, red, select_last, s), "reduce");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeTopK(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& values = b.Out(0);
  const Value& indices = b.Out(1);
  ElemType et;
  if (!ElemOfAny(x.dtype, &et) || x.dtype == DType::kBool || x.nhwc || values.dtype != x.dtype) {
    return b.Unsupported("dtype or layout");
  }
  const int64_t r = static_cast<int64_t>(x.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", -1), r));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < r; ++d) inner *= x.shape[static_cast<size_t>(d)];
  const int64_t n = x.shape[static_cast<size_t>(axis)], k = values.shape[static_cast<size_t>(axis)];
  const bool largest = b.opset < 11 || node.GetInt("largest", 1) != 0;
  VIGIL_ASSIGN_OR_RETURN(void* scratch, b.res.Alloc(cuda::TopKScratchBytes(outer * inner, k), node.name + " scratch"));
  auto* idx = static_cast<int64_t*>(indices.ptr);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::TopK(values.ptr, idx, x.ptr, et, outer, n, inner, k, largest, scratch, s), "TopK");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeGather(Build& b, bool elements) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value data, b.In(0));
  VIGIL_ASSIGN_OR_RETURN(Value idx, b.In(1));
  const Value& y = b.Out(0);
  if (!Storable(data.dtype) || data.nhwc || y.dtype != data.dtype) return b.Unsupported("dtype or layout");
  if (idx.dtype != DType::kInt64 && idx.dtype != DType::kInt32) return b.Unsupported("index dtype");
  const int64_t r = static_cast<int64_t>(data.shape.size());
  VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", 0), r));
  const int64_t dim = data.shape[static_cast<size_t>(axis)];
  const int bytes = static_cast<int>(DTypeSize(data.dtype));
  const ElemType it = AnyElemOf(idx.dtype);
  VIGIL_ASSIGN_OR_RETURN(FaultWord fault, FaultWord::Create(b.res, node.name + " index check"));
  if (!elements) {
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data.shape[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < r; ++d) inner *= data.shape[static_cast<size_t>(d)];
    const int64_t nidx = NumElements(idx.shape);
    return std::unique_ptr<CudaKernel>(std::make_unique<IndexKernel>(node, dim, fault, [=](cudaStream_t s) {
      return Launched(cuda::Gather(y.ptr, data.ptr, bytes, outer, dim, inner, idx.ptr, it, nidx, fault.get(), s), "Gather");
    }));
  }
  std::vector<int64_t> strides = ContiguousStrides(data.shape);
  const int64_t axis_stride = strides[static_cast<size_t>(axis)];
  strides[static_cast<size_t>(axis)] = 0;
  VIGIL_ASSIGN_OR_RETURN(StridedView view, MakeView(idx.shape, strides));
  return std::unique_ptr<CudaKernel>(std::make_unique<IndexKernel>(node, dim, fault, [=](cudaStream_t s) {
    return Launched(cuda::GatherElements(y.ptr, data.ptr, bytes, view, axis_stride, dim, idx.ptr, it, fault.get(), s),
                    "GatherElements");
  }));
}

// Pad-2/11/13/18: pads (and axes) constant; the value constant too; constant, reflect or edge.
StatusOr<std::unique_ptr<CudaKernel>> MakePad(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!Storable(x.dtype) || x.nhwc || y.dtype != x.dtype) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  if (r > cuda::kMaxDims) return b.Unsupported("rank ", r);
  cuda::PadSpec spec;
  const std::string mode = node.GetString("mode", "constant");
  if (mode == "reflect") spec.mode = cuda::PadMode::kReflect;
  else if (mode == "edge") spec.mode = cuda::PadMode::kEdge;
  else if (mode != "constant") return b.Unsupported("mode '", mode, "'");
  std::vector<int64_t> pads, axes;
  float value = 0.0f;
  if (b.opset < 11) {
    pads = node.GetInts("pads");
    value = node.GetFloat("value", 0.0f);
  } else {
    VIGIL_ASSIGN_OR_RETURN(pads, ConstInts(b, 1, "pads"));
    if (node.HasInput(3)) {
      VIGIL_ASSIGN_OR_RETURN(axes, ConstInts(b, 3, "axes"));
    }
  }
  if (axes.empty())
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  if (pads.size() != 2 * axes.size()) return NodeError(node, pads.size(), " pads for ", axes.size(), " axes");
  spec.ndim = static_cast<int>(r);
  for (int64_t d = 0; d < r; ++d) {
    spec.in_shape[d] = x.shape[static_cast<size_t>(d)];
    spec.out_shape[d] = y.shape[static_cast<size_t>(d)];
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, axes[i], r));
    spec.begin[a] = pads[i];
  }
  // The constant's bytes in the element type: the input's own bytes when it has x's dtype, else converted.
  bool have_bytes = false;
  if (b.opset >= 11 && node.HasInput(2)) {
    const Tensor* t = b.Init(2);
    if (t == nullptr) return b.Unsupported("constant_value must be a constant");
    if (t->numel() == 1 && t->dtype() == x.dtype) {
      std::memcpy(&spec.value, t->raw(), DTypeSize(x.dtype));
      have_bytes = true;
    } else if (t->numel() == 1) {
      value = t->ToFloatVector()[0];
    }
  }
  if (!have_bytes) {
    Tensor one(x.dtype, {});
    switch (x.dtype) {
      case DType::kFloat32: *one.data<float>() = value; break;
      case DType::kFloat16: *one.data<uint16_t>() = FloatToHalf(value); break;
      case DType::kInt64: *one.data<int64_t>() = static_cast<int64_t>(value); break;
      case DType::kInt32: *one.data<int32_t>() = static_cast<int32_t>(value); break;
      case DType::kInt8: *one.data<int8_t>() = static_cast<int8_t>(value); break;
      case DType::kUInt8: *one.data<uint8_t>() = static_cast<uint8_t>(value); break;
      default: *one.data<bool>() = value != 0.0f; break;
    }
    std::memcpy(&spec.value, one.raw(), DTypeSize(x.dtype));
  }
  const int bytes = static_cast<int>(DTypeSize(x.dtype));
  return Kernel("cuda", [=](cudaStream_t s) { return Launched(cuda::Pad(y.ptr, x.ptr, bytes, spec, s), "Pad"); });
}

// BatchNormalization at inference (scale, B, mean, var constant): y = x · s + t with s = scale / sqrt(var + ε),
// t = B − mean · s, folded here in double.
StatusOr<std::unique_ptr<CudaKernel>> MakeBatchNorm(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc || x.shape.size() < 2) {
    return b.Unsupported("dtype, layout or rank");
  }
  if (node.outputs.size() > 1) return b.Unsupported("training outputs");
  std::vector<float> p[4];
  for (size_t i = 0; i < 4; ++i) {
    const Tensor* t = b.Init(i + 1);
    if (t == nullptr) return b.Unsupported("scale, B, mean and var must be constants");
    p[i] = t->ToFloatVector();
  }
  const int64_t c = x.shape[1];
  for (const auto& v : p) {
    if (static_cast<int64_t>(v.size()) != c) return NodeError(node, "parameters of ", v.size(), " values for ", c, " channels");
  }
  const double eps = node.GetFloat("epsilon", 1e-5f);
  std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (size_t i = 0; i < scale.size(); ++i) {
    const double s = p[0][i] / std::sqrt(static_cast<double>(p[3][i]) + eps);
    scale[i] = static_cast<float>(s);
    shift[i] = static_cast<float>(p[1][i] - p[2][i] * s);
  }
  VIGIL_ASSIGN_OR_RETURN(void* sd, b.res.Upload(scale.data(), scale.size() * 4, node.name + " scale"));
  VIGIL_ASSIGN_OR_RETURN(void* td, b.res.Upload(shift.data(), shift.size() * 4, node.name + " shift"));
  const int64_t n = NumElements(x.shape), inner = x.nhwc ? 1 : n / (x.shape[0] * c);
  const ElemType et = ElemOf(x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::ChannelAffine(y.ptr, x.ptr, et, static_cast<const float*>(sd), static_cast<const float*>(td), n, c,
                                        inner, s),
                    "BatchNormalization");
  });
}

StatusOr<std::unique_ptr<CudaKernel>> MakeAvgPool(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (x.shape.size() != 4 || !IsFloat(x.dtype) || !IsFloat(y.dtype)) return b.Unsupported("only 2-D float pooling");
  const std::vector<int64_t> ks = node.GetInts("kernel_shape"), st = node.GetInts("strides", {1, 1});
  const std::vector<int64_t> dl = b.opset >= 19 ? node.GetInts("dilations", {1, 1}) : std::vector<int64_t>{1, 1};
  if (ks.size() != 2) return b.Unsupported("only 2-D pooling");
  cuda::Pool2d p{};
  p.n = x.shape[0], p.c = x.shape[1], p.h = x.shape[2], p.w = x.shape[3], p.oh = y.shape[2], p.ow = y.shape[3];
  p.kh = ks[0], p.kw = ks[1], p.sh = st[0], p.sw = st[1], p.dh = dl[0], p.dw = dl[1];
  const auto [ph, peh] = Pads(node, 0, 2, p.h, p.oh, p.kh, p.sh, p.dh);
  const auto [pw, pew] = Pads(node, 1, 2, p.w, p.ow, p.kw, p.sw, p.dw);
  p.ph = ph, p.pw = pw;
  p.in = StridesOf(x);
  p.out = StridesOf(y);
  const bool include_pad = node.GetInt("count_include_pad", 0) != 0;
  const int64_t eh = peh, ew = pew;
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::AvgPool2d(y.ptr, ElemOf(y.dtype), x.ptr, ElemOf(x.dtype), p, eh, ew, include_pad, s), "AveragePool");
  });
}

// QuantizeLinear / DequantizeLinear: scale and zero point device values (constants or activations), per tensor
// or per axis.
StatusOr<std::unique_ptr<CudaKernel>> MakeQuant(Build& b, bool quantize) {
  const Node& node = b.node;
  if (node.GetInt("block_size", 0) != 0) return b.Unsupported("blocked quantization");
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  VIGIL_ASSIGN_OR_RETURN(Value scale, b.In(1));
  const Value& y = b.Out(0);
  if (x.nhwc || y.nhwc || !IsFloat(scale.dtype)) return b.Unsupported("layout or scale dtype");
  Value zp;
  if (node.HasInput(2)) {
    VIGIL_ASSIGN_OR_RETURN(zp, b.In(2));
  }
  const Value& q = quantize ? y : x;
  if (q.dtype != DType::kUInt8 && q.dtype != DType::kInt8 && !(q.dtype == DType::kInt32 && !quantize)) {
    return b.Unsupported("quantized dtype ", DTypeName(q.dtype));
  }
  if (zp.ptr != nullptr && zp.dtype != q.dtype) return b.Unsupported("zero point dtype");
  const int64_t n = NumElements(x.shape), channels = NumElements(scale.shape);
  int64_t inner = 1;
  if (channels != 1) {
    VIGIL_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.GetInt("axis", 1), static_cast<int64_t>(x.shape.size())));
    for (size_t d = static_cast<size_t>(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  }
  const ElemType qt = AnyElemOf(q.dtype), ft = ElemOf(quantize ? x.dtype : y.dtype), st = ElemOf(scale.dtype);
  if (quantize) {
    return Kernel("cuda", [=](cudaStream_t s) {
      return Launched(cuda::Quantize(y.ptr, qt, x.ptr, ft, scale.ptr, st, zp.ptr, n, channels, inner, s), "QuantizeLinear");
    });
  }
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Dequantize(y.ptr, ft, x.ptr, qt, scale.ptr, st, zp.ptr, n, channels, inner, s), "DequantizeLinear");
  });
}

// vigil DynamicFakeQuantize (int8-dynamic models as exported): elementwise given its global range, so in the NHWC
// region too (layout_plan.h).
StatusOr<std::unique_ptr<CudaKernel>> MakeFakeQuantize(Build& b) {
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.dtype != y.dtype || x.nhwc != y.nhwc) return b.Unsupported("dtype or layout");
  const bool centered = b.node.GetInt("centered", 0) != 0;
  float* scale = nullptr;
  if (b.node.outputs.size() > 1 && !b.node.outputs[1].empty()) {
    const Value& s = b.Out(1);
    if (s.dtype != DType::kFloat32) return b.Unsupported("scale dtype");
    scale = static_cast<float*>(s.ptr);
  }
  VIGIL_ASSIGN_OR_RETURN(void* scratch, b.res.Alloc(cuda::DynamicFakeQuantizeScratchBytes(), b.node.name + " range"));
  const int64_t n = NumElements(x.shape);
  const ElemType et = ElemOf(x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::DynamicFakeQuantize(y.ptr, x.ptr, et, n, centered, scale, scratch, s), "DynamicFakeQuantize");
  });
}

// Gemm-11/13: y = alpha · A' · B' + beta · C (A' = transA ? Aᵀ : A; C broadcast to [M, N]) on cuBLAS; C is
// first copied into y, then the product accumulated onto it.
StatusOr<std::unique_ptr<CudaKernel>> MakeGemm(Build& b) {
  const Node& node = b.node;
  const Value& y = b.Out(0);
  if (!IsFloat(y.dtype) || y.shape.size() != 2) return b.Unsupported("dtype");
  VIGIL_ASSIGN_OR_RETURN(Value a, b.In(0, y.dtype));
  VIGIL_ASSIGN_OR_RETURN(Value w, b.In(1, y.dtype));
  if (a.dtype != y.dtype || w.dtype != y.dtype || a.shape.size() != 2 || w.shape.size() != 2 || a.nhwc) {
    return b.Unsupported("operands");
  }
  const bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.0f), beta_attr = node.GetFloat("beta", 1.0f);
  const int64_t m = y.shape[0], n = y.shape[1], k = ta ? a.shape[0] : a.shape[1];
  Value c;
  StridedView cv, yv;
  const bool has_c = node.HasInput(2);
  if (has_c) {
    VIGIL_ASSIGN_OR_RETURN(c, b.In(2, y.dtype));
    if (c.dtype != y.dtype) return b.Unsupported("C dtype");
    VIGIL_ASSIGN_OR_RETURN(cv, MakeView(y.shape, BroadcastStrides(c.shape, y.shape)));
    VIGIL_ASSIGN_OR_RETURN(yv, MakeView(y.shape, ContiguousStrides(y.shape)));
  }
  const float beta = has_c ? beta_attr : 0.0f;
  const cudaDataType_t dt = y.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_32F;
  const ElemType et = ElemOf(y.dtype);
  cublasHandle_t handle = b.res.cublas;
  return Kernel("cublas", [=](cudaStream_t s) -> Status {
    if (has_c) VIGIL_RETURN_IF_ERROR(Launched(cuda::StridedCopy(y.ptr, et, yv, c.ptr, et, cv, s), "Gemm C"));
    // Row-major Y[m,n] = A'[m,k]·B'[k,n] is column-major Yᵀ = B'ᵀ·A'ᵀ; a row-major X read column-major is Xᵀ.
    VIGIL_CUBLAS(cublasGemmEx(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, w.ptr, dt,
                              static_cast<int>(tb ? k : n), a.ptr, dt, static_cast<int>(ta ? m : k), &beta, y.ptr, dt,
                              static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  });
}

// The GPU kernel of a node, Unimplemented when there is none (the caller falls back).
StatusOr<std::unique_ptr<CudaKernel>> MakeGpuKernel(Build& b) {
  const Node& n = b.node;
  if (n.domain == kCpuDomain && n.op_type == kToNchwOp) return MakeToNchw(b);
  if ((n.domain.empty() && n.op_type == "Conv") || (n.domain == "vigil" && n.op_type == "FusedConv")) return MakeConv(b);
  if (n.domain == "vigil" && n.op_type == "DynamicFakeQuantize") return MakeFakeQuantize(b);
  if (!n.domain.empty()) return b.Unsupported("domain '", n.domain, "'");
  const std::string& op = n.op_type;
  if (op == "MaxPool") return MakeMaxPool(b);
  if (op == "Identity" || op == "Dropout") return MakeCopy(b);
  if (auto u = UnaryOps().find(op); u != UnaryOps().end()) return MakeUnary(b, u->second);
  if (auto bi = BinaryOps().find(op); bi != BinaryOps().end()) return MakeBinary(b, bi->second);
  if (op == "Concat") return MakeConcatSplit(b, true);
  if (op == "Split") return MakeConcatSplit(b, false);
  if (op == "Transpose") return MakeTranspose(b);
  if (op == "Slice") return MakeSlice(b);
  if (op == "Softmax" || op == "LogSoftmax") return MakeSoftmax(b);
  if (op == "Resize" || op == "Upsample") return MakeResize(b);
  if (op == "MatMul") return MakeMatMul(b);
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") return MakeReshape(b);
  if (op == "Not") return MakeNot(b);
  if (op == "Where") return MakeWhere(b);
  if (op == "Cast") return MakeCast(b);
  if (op == "Expand" || op == "Tile") return MakeExpandTile(b, op == "Tile");
  if (op == "DepthToSpace" || op == "SpaceToDepth") return MakeDepthSpace(b, op == "DepthToSpace");
  if (auto r = ReduceOps().find(op); r != ReduceOps().end()) return MakeReduce(b, r->second);
  if (op == "TopK") return MakeTopK(b);
  if (op == "Gather" || op == "GatherElements") return MakeGather(b, op == "GatherElements");
  if (op == "Pad") return MakePad(b);
  if (op == "BatchNormalization") return MakeBatchNorm(b);
  if (op == "AveragePool") return MakeAvgPool(b);
  if (op == "QuantizeLinear" || op == "DequantizeLinear") return MakeQuant(b, op == "QuantizeLinear");
  if (op == "Gemm") return MakeGemm(b);
  return b.Unsupported("op");
}

// Which convolutions and pools the layout planner may put in the NHWC region.
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
