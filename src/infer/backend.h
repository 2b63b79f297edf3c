// backend.h — the interface every execution backend implements (CPU, CUDA).
//
// Levels, after ggml's backend / ONNX Runtime's execution provider: a Backend says which nodes it
// supports, then compiles a whole (shape-inferred, static) Graph into a CompiledModel that runs it.
// Thread-safety: Backend methods are thread-safe. A CompiledModel is NOT: one Run at a time
// (it owns one arena); use one CompiledModel per worker thread.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/infer/engine.h"  // NodeTiming
#include "vigil/infer/graph.h"

namespace vigil::infer {

struct CompileOptions {
  int threads = 0;          // worker threads for kernels; 0 = all cores of the process's cpuset
  bool use_onednn = true;   // CPU: oneDNN for Conv/FusedConv/MaxPool where it supports them
  bool profile = false;     // collect per-node timings (small overhead: one clock read per node)
  // CUDA backend only:
  int device_ordinal = 0;   // the GPU (CUDA ordinal)
  bool fp16 = false;        // 4-D activations and convolutions in float16 (else float32)
  bool allow_tf32 = false;  // let float32 convolutions use TF32 tensor cores (off: results within rounding)
  bool cuda_graph = true;   // capture Run into a CUDA graph after the first call (off while profiling)
  std::string cudnn_plan_cache;  // EngineOptions::cudnn_plan_cache
};

class CompiledModel {
 public:
  virtual ~CompiledModel() = default;
  // Runs the graph. `inputs` are index-aligned with graph.inputs and must match graph.types
  // (dtype and shape); `outputs` is resized to graph.outputs and each element receives an owned
  // tensor. Errors: InvalidArgument for a mismatching input (naming it), Internal for a kernel failure.
  virtual Status Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) = 0;
  virtual std::vector<NodeTiming> Profile() const = 0;
  virtual void ResetProfile() = 0;
  virtual size_t ArenaBytes() const = 0;  // bytes of the intermediate-value arena
  // Device-resident I/O (CUDA backend; nullptr elsewhere): see Engine::device_io().
  virtual const DeviceIo* device_io() const { return nullptr; }
  virtual Status EnqueueOnDevice() { return absl::UnimplementedError("this backend has no device-resident run"); }
  virtual Status SynchronizeDevice() { return absl::UnimplementedError("this backend has no device-resident run"); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether Compile accepts the op at all (CUDA: a GPU kernel or the host fallback). Plan says which.
  virtual bool Supports(const Node& node, int64_t opset) const = 0;
  // Which kernel each node gets, decided as Compile decides it, without a device (ggml's supports_op, ONNX
  // Runtime's GetCapability). CUDA: the layout plan and every node's GPU kernel or host fallback with its
  // reason; one thing only the device can tell is assumed: that cuDNN has an engine for each convolution
  // (Compile falls back to the host where it has none, and logs it). Default: every node on `name()`.
  // REQUIRES: as Compile. Errors: as Compile's for an op no backend kernel exists for.
  virtual StatusOr<BackendPlan> Plan(const Graph& graph, const CompileOptions& options) const;
  // REQUIRES: graph shape-inferred (graph.types complete) and valid.
  virtual StatusOr<std::unique_ptr<CompiledModel>> Compile(const Graph& graph, const CompileOptions& options) = 0;
};

// The CPU backend: oneDNN (when built with VIGIL_WITH_ONEDNN) for Conv/FusedConv/MaxPool, the
// reference kernels of op_registry.h for everything else.
std::unique_ptr<Backend> CreateCpuBackend();

#ifdef VIGIL_HAVE_CUDA
// The CUDA backend (infer/cuda/cuda_backend.h): cuDNN, cuBLAS and vigil's kernels; every op it has
// no kernel for runs on the host reference kernel inside the same stream.
std::unique_ptr<Backend> CreateCudaBackend();
#endif

}  // namespace vigil::infer
