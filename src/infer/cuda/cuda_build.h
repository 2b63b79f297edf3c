// Internal to infer/cuda: what the CUDA backend's kernel construction shares — device values and their views,
// the per-model Resources (device memory, uploads, handles; a dry mode for Backend::Plan), the kernel wrappers
// (a lambda, a cuDNN convolution, the host reference kernel between copies), `Build` (one node's inputs and
// outputs as device values) and the makers of each op's kernel: cuda_kernels_body.cc (the detection body:
// convolutions, pooling, elementwise, concat/split, slices, resize, MatMul, ...) and cuda_kernels_reference.cc
// (the rest of the reference op set: reductions, TopK, Gather, Pad, Cast, quantization, ...). cuda_backend.cc plans
// with them and runs the compiled model.
//
// Ownership: Resources owns the model's device memory (weights, uploads, scratch), pinned staging, the stream and
// the cuDNN/cuBLAS handles, freed at its destruction; a Build borrows the graph, the node, the device values and the
// Resources; each maker returns a kernel that owns its own state and points into the Resources, which outlive it.
// Thread-safety: a Build and its Resources belong to one Compile or Plan call. Errors: makers return
// Unimplemented (no CUDA kernel for this node: the host runs it) or the CUDA/cuDNN error that stopped them.
#pragma once

#include <algorithm>
#include <cstdint>
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
#include "infer/cuda/cuda_backend.h"
#include "infer/cpu/blocked_kernels.h"
#include "infer/cpu/layout_plan.h"
#include "vigil/infer/cuda_util.h"
#include "infer/cuda/cudnn_conv.h"
#include "infer/cuda/kernels.h"
#include "infer/cuda/plan_cache.h"
#include "infer/op_registry.h"
#include "infer/ops/op_util.h"
#include "infer/passes/memory_plan.h"
#include "vigil/infer/engine.h"

namespace vigil::infer::cuda_build {

using cuda::DeviceBuffer;
using cuda::ElemType;
using cuda::PinnedBuffer;
using cuda::StridedView;

inline constexpr size_t kArenaAlignment = 256;
inline constexpr size_t kAutotuneWorkspace = size_t{256} << 20;

inline bool IsFloat(DType t) { return t == DType::kFloat32 || t == DType::kFloat16; }
// The kernels' element type of a float dtype (anything else reads as float32: call for floats only).
inline ElemType ElemOf(DType t) { return t == DType::kFloat16 ? ElemType::kF16 : ElemType::kF32; }
// The kernels' element type of any dtype they store; false for float64 and int16 (the host runs those).
inline bool ElemOfAny(DType t, ElemType* e) {
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
inline bool Storable(DType t) {
  ElemType e;
  return ElemOfAny(t, &e);
}
inline ElemType AnyElemOf(DType t) {
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

inline cuda::Strides4d StridesOf(const Value& v) {
  return v.nhwc ? cuda::NhwcStrides(v.shape[1], v.shape[2], v.shape[3])
                : cuda::NchwStrides(v.shape[1], v.shape[2], v.shape[3]);
}

// Physical (storage-order) shape and the physical position of each logical axis.
inline Shape PhysicalShape(const Value& v) {
  return v.nhwc ? Shape{v.shape[0], v.shape[2], v.shape[3], v.shape[1]} : v.shape;
}
inline int64_t PhysicalAxis(const Value& v, int64_t axis) {
  if (!v.nhwc) return axis;
  static constexpr int64_t kMap[4] = {0, 3, 1, 2};
  return kMap[axis];
}

inline std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

inline StatusOr<StridedView> MakeView(const Shape& shape, const std::vector<int64_t>& strides) {
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

inline void* Offset(void* p, int64_t elements, DType t) {
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

inline std::unique_ptr<CudaKernel> Kernel(std::string_view name, LambdaKernel::Fn fn) {
  return std::make_unique<LambdaKernel>(name, std::move(fn));
}

inline Status Launched(cudaError_t e, const char* what) { return cuda::CudaStatus(e, what); }

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
inline std::pair<int64_t, int64_t> Pads(const Node& node, size_t axis, size_t spatial, int64_t in, int64_t out, int64_t k,
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

// ---- The op makers (each: the node's kernel, or Unimplemented with the reason) -------------------------------
StatusOr<std::unique_ptr<CudaKernel>> MakeConv(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeMaxPool(Build& b);
const std::map<std::string, cuda::UnaryOp>& UnaryOps();
const std::map<std::string, cuda::BinaryOp>& BinaryOps();
const std::map<std::string, cuda::ReduceOp>& ReduceOps();
StatusOr<std::unique_ptr<CudaKernel>> MakeUnary(Build& b, cuda::UnaryOp op);
StatusOr<DType> OperandDType(Build& b);
StatusOr<std::pair<Value, StridedView>> Operand(Build& b, size_t i, const Value& y, DType dtype);
StatusOr<std::unique_ptr<CudaKernel>> MakeBinary(Build& b, cuda::BinaryOp op);
StatusOr<std::unique_ptr<CudaKernel>> MakeConcatSplit(Build& b, bool concat);
StatusOr<std::unique_ptr<CudaKernel>> MakeTranspose(Build& b);
// Element strides of each logical axis of a value: row-major for NCHW / any rank, channels innermost for NHWC.
std::vector<int64_t> LogicalStrides(const Value& v);
// An integer initializer input as int64 values, Unsupported when it is not an initializer.
StatusOr<std::vector<int64_t>> ConstInts(Build& b, size_t i, std::string_view what);
StatusOr<std::unique_ptr<CudaKernel>> MakeSlice(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeSoftmax(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeResize(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeMatMul(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeReshape(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeToNchw(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeHost(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeCopy(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeNot(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeWhere(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeCast(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeExpandTile(Build& b, bool tile);
StatusOr<std::unique_ptr<CudaKernel>> MakeDepthSpace(Build& b, bool to_space);
StatusOr<std::unique_ptr<CudaKernel>> MakeReduce(Build& b, cuda::ReduceOp op);
StatusOr<std::unique_ptr<CudaKernel>> MakeTopK(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeGather(Build& b, bool elements);
StatusOr<std::unique_ptr<CudaKernel>> MakePad(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeBatchNorm(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeAvgPool(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeQuant(Build& b, bool quantize);
StatusOr<std::unique_ptr<CudaKernel>> MakeFakeQuantize(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeGemm(Build& b);
StatusOr<std::unique_ptr<CudaKernel>> MakeGpuKernel(Build& b);

}  // namespace vigil::infer::cuda_build
