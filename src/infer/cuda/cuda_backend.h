// cuda_backend.h — internals of the CUDA backend (CreateCudaBackend in infer/backend.h).
//
// Compile (cuda_backend.cc) takes a shape-inferred static graph and:
//  - plans layouts with the CPU backend's planner (layout_plan.h, block 1): 4-D float32 activations
//    that convolutions and MaxPool write, and the chains of elementwise ops, channel Concat/Split and
//    nearest Resize between them, are stored channels-last (NHWC) in the compute precision
//    (CompileOptions::fp16: float16, else float32); every other value is stored NCHW / row-major in
//    its declared dtype. ToNchw nodes convert (and cast back to the declared dtype) where a value
//    leaves the NHWC region, so the network's tail (box decoding, DFL softmax) runs in float32 even at
//    fp16;
//  - binds every node to a kernel: cuDNN graph-API convolutions with bias and activation fused where
//    an engine supports it (cudnn_conv.h), else the plain convolution and vigil's BiasActivation
//    kernel; cuBLAS for MatMul; vigil's kernels (kernels.h) for pooling, elementwise ops, Concat,
//    Split, Slice, Transpose, Softmax, Resize (nearest), reshapes and layout conversions; and, for
//    every other op or dtype, the op's reference kernel on the host ("host" kernel: device → pinned
//    host copy, cudaLaunchHostFunc, copy back), so every model vigil imports runs, with the host
//    steps named in the profile. A node in the NHWC region whose GPU kernel cannot be built is
//    re-planned NCHW (as on the CPU);
//  - plans one device arena for all node outputs (memory_plan.h; 256-byte aligned), one cuDNN
//    workspace (the largest chosen plan's), pinned staging buffers for the graph's inputs and outputs.
// Run copies inputs to pinned staging, then enqueues H2D copies, every kernel and D2H copies on the
// model's own stream. The first Run is eager; the second captures the whole sequence into a CUDA graph
// (CompileOptions::cuda_graph) and later Runs replay it (one launch per inference). Profiling runs
// eagerly with CUDA events around each node.
// Device: CompileOptions::device_ordinal, made current (cudaSetDevice) on the calling thread at
// Compile and at every Run. Thread-safety: one Run at a time per compiled model; several compiled
// models (each with its own stream, cuDNN and cuBLAS handle) run concurrently on one device.
// Errors: no device / bad ordinal → FailedPrecondition; allocation → ResourceExhausted; any CUDA,
// cuDNN or cuBLAS failure → Internal naming the node and the call.
#pragma once

#include <span>
#include <string_view>

#include <cuda_runtime_api.h>

#include "vigil/common/status.h"

namespace vigil::infer {

class CudaKernel {
 public:
  virtual ~CudaKernel() = default;
  // "cudnn", "cublas", "cuda" (vigil's kernels), "copy" or "host": NodeTiming::kernel.
  virtual std::string_view name() const = 0;
  virtual Status Enqueue(cudaStream_t stream) = 0;
  // After the stream has synchronised: errors the kernel could only learn then (host kernels).
  virtual Status Check() { return absl::OkStatus(); }
  // cuDNN workspace wanted, and the shared workspace once allocated.
  virtual size_t WorkspaceBytes() const { return 0; }
  virtual Status BindWorkspace(void* /*workspace*/) { return absl::OkStatus(); }
};

}  // namespace vigil::infer
