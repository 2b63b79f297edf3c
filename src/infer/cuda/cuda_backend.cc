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
ElemType ElemOf(DType t) { return t == DType::kFloat16 ? ElemType::kF16 : ElemType::kF32; }

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
      {"Identity", cuda::UnaryOp::kIdentity}};
  return *ops;
}

const std::map<std::string, cuda::BinaryOp>& BinaryOps() {
  static const auto* ops = new std::map<std::string, cuda::BinaryOp>{
      {"Add", cuda::BinaryOp::kAdd}, {"Sub", cuda::BinaryOp::kSub}, {"Mul", cuda::BinaryOp::kMul},
      {"Div", cuda::BinaryOp::kDiv}, {"Pow", cuda::BinaryOp::kPow}, {"Max", cuda::BinaryOp::kMax},
      {"Min", cuda::BinaryOp::kMin}};
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

StatusOr<std::unique_ptr<CudaKernel>> MakeBinary(Build& b, cuda::BinaryOp op) {
  const Node& node = b.node;
  if (node.NumInputs() != 2) return b.Unsupported(node.NumInputs(), " inputs");
  const Value& y = b.Out(0);
  if (!IsFloat(y.dtype)) return b.Unsupported("dtype ", DTypeName(y.dtype));
  Value in[2];
  StridedView views[2];
  for (size_t i = 0; i < 2; ++i) {
    VIGIL_ASSIGN_OR_RETURN(in[i], b.In(i, y.dtype));
    if (in[i].dtype != y.dtype) return b.Unsupported("mixed dtypes");
    const bool one = NumElements(in[i].shape) == 1;
    if (y.nhwc) {  // same-shape NHWC operands or one element (layout_plan.h kAgnostic)
      if (!one && (!in[i].nhwc || in[i].shape != y.shape)) return b.Unsupported("operand layout");
      VIGIL_ASSIGN_OR_RETURN(views[i], MakeView({NumElements(y.shape)}, {one ? 0 : 1}));
    } else {
      if (in[i].nhwc) return b.Unsupported("operand layout");
      VIGIL_ASSIGN_OR_RETURN(views[i], MakeView(y.shape, BroadcastStrides(in[i].shape, y.shape)));
    }
  }
  const Value a = in[0], c = in[1];
  const StridedView av = views[0], cv = views[1];
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::Binary(op, y.ptr, a.ptr, av, c.ptr, cv, ElemOf(y.dtype), s), "binary");
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
  if (!IsFloat(whole.dtype)) return b.Unsupported("dtype ", DTypeName(whole.dtype));
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
  const ElemType et = ElemOf(whole.dtype);
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
  if (!IsFloat(x.dtype) || x.nhwc) return b.Unsupported("dtype or layout");
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
    return Launched(cuda::StridedCopy(y.ptr, ElemOf(y.dtype), dv, x.ptr, ElemOf(x.dtype), sv, s), "Transpose");
  });
}

// Slice-10+ (starts, ends, axes, steps as constant inputs) and Slice-1 (attributes), ONNX clamping rules.
StatusOr<std::unique_ptr<CudaKernel>> MakeSlice(Build& b) {
  const Node& node = b.node;
  VIGIL_ASSIGN_OR_RETURN(Value x, b.In(0));
  const Value& y = b.Out(0);
  if (!IsFloat(x.dtype) || x.nhwc) return b.Unsupported("dtype or layout");
  const int64_t r = static_cast<int64_t>(x.shape.size());
  std::vector<int64_t> starts, axes, steps;
  auto ints = [&](size_t i) -> StatusOr<std::vector<int64_t>> {
    const Tensor* t = b.Init(i);
    if (t == nullptr) return b.Unsupported("input ", i, " must be an initializer");
    std::vector<int64_t> v;
    for (float f : t->ToFloatVector()) v.push_back(static_cast<int64_t>(f));
    if (t->dtype() == DType::kInt64) v.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
    return v;
  };
  if (b.opset < 10) {
    starts = node.GetInts("starts");
    axes = node.GetInts("axes");
  } else {
    VIGIL_ASSIGN_OR_RETURN(starts, ints(1));
    if (node.HasInput(3)) {
      VIGIL_ASSIGN_OR_RETURN(axes, ints(3));
    }
    if (node.HasInput(4)) {
      VIGIL_ASSIGN_OR_RETURN(steps, ints(4));
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  const std::vector<int64_t> xs = ContiguousStrides(x.shape);
  std::vector<int64_t> src = xs;
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    VIGIL_ASSIGN_OR_RETURN(int64_t a, NormalizeAxis(node, axes[i], r));
    const int64_t dim = x.shape[static_cast<size_t>(a)];
    const int64_t step = i < steps.size() ? steps[i] : 1;
    int64_t start = starts[i] < 0 ? starts[i] + dim : starts[i];
    start = step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, 0, dim - 1);
    base += start * xs[static_cast<size_t>(a)];
    src[static_cast<size_t>(a)] = xs[static_cast<size_t>(a)] * step;
  }
  VIGIL_ASSIGN_OR_RETURN(StridedView sv, MakeView(y.shape, src));
  VIGIL_ASSIGN_OR_RETURN(StridedView dv, MakeView(y.shape, ContiguousStrides(y.shape)));
  const void* from = Offset(x.ptr, base, x.dtype);
  return Kernel("cuda", [=](cudaStream_t s) {
    return Launched(cuda::StridedCopy(y.ptr, ElemOf(y.dtype), dv, from, ElemOf(x.dtype), sv, s), "Slice");
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

// The GPU kernel of a node, Unimplemented when there is none (the caller falls back).
StatusOr<std::unique_ptr<CudaKernel>> MakeGpuKernel(Build& b) {
  const Node& n = b.node;
  if (n.domain == kCpuDomain && n.op_type == kToNchwOp) return MakeToNchw(b);
  if ((n.domain.empty() && n.op_type == "Conv") || (n.domain == "vigil" && n.op_type == "FusedConv")) return MakeConv(b);
  if (!n.domain.empty()) return b.Unsupported("domain '", n.domain, "'");
  const std::string& op = n.op_type;
  if (op == "MaxPool") return MakeMaxPool(b);
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
