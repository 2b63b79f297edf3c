// cudnn_conv.h — a 2-D convolution (+ bias + activation) as one cuDNN graph-API execution plan.
//
// Built with cuDNN 9's backend descriptors (cudnn_graph.h; the cudnn-frontend headers are not
// installed): an operation graph of CONVOLUTION_FORWARD and, when `fuse_epilogue`, POINTWISE ADD
// (bias, broadcast over [1,K,1,1]) and the activation (SWISH_FWD with beta 1 = SiLU, RELU_FWD,
// SIGMOID_FWD) into the output, intermediates virtual in float32. cuDNN's runtime-fusion engines run
// that graph as one kernel where they support it (fp16 NHWC with tensor cores on sm_80+); where no
// engine accepts the fused graph the caller builds the plain convolution and applies bias and
// activation with its own kernel (kernels.h BiasActivation).
//
// Tensors are described logically as [N,C,H,W] with element strides (NCHW or NHWC), the filter as
// [K, C/group, R, S] (group = C / filter C; cuDNN infers grouped convolution from that) with its
// strides. Engine choice: heuristics mode A, then the first `max_candidates` plans that finalize are
// timed on the bound buffers (3 runs each after one warm-up, CUDA events) and the fastest kept.
// With `allow_tensor_core_fp32` false, plans whose engine carries the TENSOR_CORE or
// DOWN_CONVERT_INPUTS numerical note are skipped for float32 data (no TF32), so fp32 results stay
// within rounding of the reference.
// With a PlanLookup (plan_cache.h) the choice is first looked up by PlanKey: a hit rebuilds the
// cached engine with its knobs (one plan finalized and run once to check it, nothing timed); a miss,
// or an entry that does not rebuild, times as above and records the winner (or that no engine
// supports the graph).
// Thread-safety: a CudnnConv is used by one stream at a time. Errors: Status naming the cuDNN call.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cudnn.h>

#include "infer/cuda/plan_cache.h"
#include "vigil/common/status.h"

namespace vigil::cuda {

enum class ConvActivation : uint8_t { kNone, kRelu, kSiLU, kSigmoid };

struct ConvSpec {
  std::array<int64_t, 4> x_dims{}, x_strides{};  // [N,C,H,W]
  std::array<int64_t, 4> w_dims{}, w_strides{};  // [K,C/group,R,S]
  std::array<int64_t, 4> y_dims{}, y_strides{};  // [N,K,OH,OW]
  std::array<int64_t, 2> pre_pad{}, post_pad{}, stride{1, 1}, dilation{1, 1};
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;  // x, w, y (and bias when fused)
  bool fuse_epilogue = false;  // bias and/or activation inside the plan
  bool has_bias = false;
  ConvActivation activation = ConvActivation::kNone;
  bool allow_tensor_core_fp32 = false;
  int max_candidates = 6;
  size_t workspace_limit = size_t{256} << 20;
};

// The plan cache CudnnConv::Create consults (all optional).
struct PlanLookup {
  PlanCache* cache = nullptr;       // null: always time
  std::string device;               // DeviceSignature of the handle's device
  PlanCacheStats* stats = nullptr;  // counts of the caller's load
};

// "<name>|sm<major><minor>|<SMs>sm|cudnn<cudnnGetVersion()>" of CUDA device `ordinal`: identical GPUs
// share entries (a plan chosen on GPU 0 serves GPU 1); a MIG slice (fewer SMs) does not.
StatusOr<std::string> DeviceSignature(int ordinal);
// The cache key: `device` and every ConvSpec field, as readable text.
std::string PlanKey(const ConvSpec& spec, const std::string& device);

class CudnnConv {
 public:
  ~CudnnConv();
  // Builds the graph, finds the plans that finalize and times them on x, w, bias (null without
  // bias), y with a scratch workspace of spec.workspace_limit bytes (`scratch`, at least that big).
  // NotFound when no engine supports the graph (the caller then falls back).
  static StatusOr<std::unique_ptr<CudnnConv>> Create(cudnnHandle_t handle, const ConvSpec& spec, const void* x,
                                                     const void* w, const void* bias, void* y, void* scratch,
                                                     cudaStream_t stream, const PlanLookup& lookup = {});
  size_t workspace_bytes() const { return workspace_; }
  const std::string& engine_name() const { return engine_; }
  // Fixes the buffers (the plan's variant pack). REQUIRES: workspace of workspace_bytes().
  Status Bind(const void* x, const void* w, const void* bias, void* y, void* workspace);
  // Enqueues the plan on the handle's stream.
  Status Run();

 private:
  CudnnConv() = default;
  cudnnHandle_t handle_ = nullptr;
  cudnnBackendDescriptor_t plan_ = nullptr, pack_ = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned_;  // descriptors kept alive with the plan
  size_t workspace_ = 0;
  bool has_bias_ = false;
  std::string engine_;
};

}  // namespace vigil::cuda
