// vigil/infer/engine.h — load a YOLO (or any supported) ONNX model and run it on host tensors.
//
//   auto engine = vigil::infer::Engine::Load("yolov8n.onnx", {.threads = 2});
//   if (!engine.ok()) { /* engine.status().message() names file, node, op and reason */ }
//   std::vector<vigil::Tensor> outputs;
//   vigil::Status st = (*engine)->Run({input}, &outputs);
//
// Load = ONNX import → fix symbolic dims (batch/height/width from options, else metadata, else 1
// for batch) → passes (dequantize weights, shape inference + constant folding, no-op removal,
// Conv+SiLU fusion) → memory plan → backend compile. Every op is checked at load: an unsupported op
// fails Load with Unimplemented naming op type, node name and opset.
//
// Shapes: inputs()/outputs() are the concrete shapes after fixing dims (e.g. images [1,3,640,640]
// float32, output0 [1,84,8400]). Tensors are row-major host memory (common/tensor.h).
// Thread-safety: Load is thread-safe. An Engine runs one Run at a time (calls are serialised by an
// internal mutex); create one Engine per worker for parallel inference. Accessors are thread-safe.
// Ownership: the Engine owns the graph, weights and arena; outputs returned by Run are owned copies.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

class CompiledModel;

// Per-node timing, collected when EngineOptions::profile is set.
struct NodeTiming {
  std::string node_name;
  std::string op_type;
  std::string kernel;       // "onednn", "reference", ...
  double total_ms = 0.0;    // wall time summed over calls, milliseconds
  int64_t calls = 0;
};

// Compute precision of the CUDA backend: fp16 stores 4-D activations and runs convolutions in
// IEEE float16 (float32 accumulation); values outside the convolutional body stay float32.
enum class Precision : uint8_t { kFp32, kFp16 };
// "fp32" / "fp16"; InvalidArgument naming the value otherwise.
StatusOr<Precision> ParsePrecision(std::string_view text);
// Activations of int8-dynamic models (DynamicQuantizeLinear → ConvInteger / MatMulInteger, as onnxruntime's
// quantize_dynamic writes them). Either way the weights are dequantized once at load and the convolution runs
// in float (oneDNN / cuDNN):
//  - kQuantized (default, "as exported"): each activation is quantized to uint8 over its whole tensor's range
//    exactly as DynamicQuantizeLinear defines it, then dequantized (vigil DynamicFakeQuantize) — ONNX Runtime's
//    results up to the float rounding of the sums. The range is the whole tensor's, the batch included, as ONNX
//    defines it: at batch > 1 an image's result depends on the other images of its batch.
//  - kFloat: activations kept in float (no range pass per convolution: faster; borderline boxes differ from
//    ONNX Runtime's, as a float model's would).
enum class Int8Activations : uint8_t { kQuantized, kFloat };
// "quantized" / "float"; InvalidArgument naming the value otherwise.
StatusOr<Int8Activations> ParseInt8Activations(std::string_view text);
// EngineOptions::device → CUDA ordinal: "cpu" → -1, "cuda" → 0, "cuda:N" → N. Errors: InvalidArgument naming the text.
StatusOr<int> ParseDevice(const std::string& device);

struct EngineOptions {
  std::string device = "cpu";  // "cpu", or "cuda:N" / "cuda" (= cuda:0) in a build with the CUDA backend
  int threads = 0;             // kernel threads; 0 = all cores available to the process
  int64_t batch = 0;           // fixes a symbolic batch dim; 0 = model's (1 when symbolic)
  int64_t height = 0;          // fixes symbolic H of image inputs; 0 = metadata imgsz
  int64_t width = 0;           // fixes symbolic W of image inputs; 0 = metadata imgsz
  std::map<std::string, Shape> input_shapes;  // full input shapes by name (win over the above)
  bool use_onednn = true;      // CPU: oneDNN fast paths (false = reference kernels only)
  bool optimize = true;        // run the fusion/no-op passes (folding and dequantization always run)
  bool profile = false;        // per-node timings, see Profile()
  Precision precision = Precision::kFp32;  // CUDA only (the CPU backend computes in float32)
  Int8Activations int8_activations = Int8Activations::kQuantized;  // int8-dynamic models only
  bool allow_tf32 = false;     // CUDA: TF32 tensor cores for float32 convolutions
  bool cuda_graph = true;      // CUDA: replay Run as one CUDA graph after the first call
  // CUDA: a file keeping the cuDNN plan choices between processes ("" = $VIGIL_CUDNN_PLAN_CACHE, else
  // none); read at load, rewritten atomically after a load that timed a convolution. Within a process
  // the choices are always shared by all Engines. See docs/architecture.md, "cuDNN plan cache".
  std::string cudnn_plan_cache;
};

// Where a device backend keeps a model's inputs and outputs (CUDA: device pointers, row-major in the
// dtypes and shapes of Engine::inputs()/outputs(), valid for the Engine's lifetime) and the stream
// (cudaStream_t) its work is enqueued on. Producers (GPU preprocessing) write the inputs on that
// stream, or synchronise with it, before EnqueueOnDevice; consumers read the outputs after it.
struct DeviceIo {
  int device = 0;
  void* stream = nullptr;
  std::vector<void*> inputs, outputs;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
};

// What the file says about itself, before any pass: for `vigil model inspect` and family detection.
struct ModelSummary {
  std::string path;
  int64_t ir_version = 0, opset = 0;
  std::string producer;                       // "pytorch 1.13.1"
  std::vector<ValueInfo> inputs, outputs;     // as declared (symbolic dims kept)
  std::map<std::string, std::string> metadata;
  std::map<std::string, int> op_counts;       // op_type (domain-qualified unless ai.onnx) → count
  std::vector<std::string> unsupported_ops;   // "Einsum (node 'x', opset 17)"
};

// Imports `path` and summarises it without compiling. Errors as ImportOnnxFile.
StatusOr<ModelSummary> InspectModel(const std::string& path);

// Where one node runs once compiled (PlanModel, infer/backend.h's Backend::Plan), in the order it runs.
struct NodePlacement {
  std::string node;    // the node's name (Node::Describe() when it has none)
  std::string op;      // op_type, domain-qualified outside ONNX's ("vigil.FusedConv", "vigil.cpu.ToNchw")
  std::string kernel;  // CUDA: "cudnn", "cublas", "cuda" (vigil's kernels), "copy", "host" (the reference kernel
                       // between device copies); CPU: "cpu"
  std::string reason;  // kernel "host": why the GPU has no kernel for it (the op, a dtype, a layout, an input
                       // that must be constant); else ""
  bool channels_last = false;  // CUDA: its outputs stored NHWC (in the compute precision)
  bool conversion = false;     // a layout conversion the planner added (no node of the model)
};

// A backend's plan for a model, made without running anything (and, for CUDA, without a GPU).
struct BackendPlan {
  std::vector<NodePlacement> nodes;
  int host_nodes = 0;           // nodes with kernel "host"
  int conversions = 0;          // layout conversions added (NHWC → NCHW)
  int channels_last_values = 0; // values stored NHWC
};

// The plan of the model at `path` for `options` (device, precision, batch and sizes, optimize): the graph Load
// would compile, and where each of its nodes would run — without loading it onto a device (a CUDA plan is
// made on a machine without a GPU too). Errors: as Load's, but never for a missing device; Unimplemented for
// "cuda" in a build without the CUDA backend. Thread-safe (it shares nothing between calls).
StatusOr<BackendPlan> PlanModel(const std::string& path, const EngineOptions& options);


class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Load(const std::string& path, const EngineOptions& options);
  // Same, from an already imported graph (tests, generated graphs). `name` labels errors.
  static StatusOr<std::unique_ptr<Engine>> FromGraph(Graph graph, const EngineOptions& options,
                                                     const std::string& name = "graph");
  ~Engine();

  const std::vector<TensorInfo>& inputs() const { return inputs_; }
  const std::vector<TensorInfo>& outputs() const { return outputs_; }
  const ModelSummary& summary() const { return summary_; }
  const std::map<std::string, std::string>& metadata() const { return summary_.metadata; }
  // The optimised graph the backend runs (for tests and tools).
  const Graph& graph() const { return graph_; }

  // Runs the model. `inputs` index-aligned with inputs(); float32 inputs are converted to float16
  // when the model takes float16 (and vice versa). `outputs` receives owned tensors aligned with
  // outputs(). Errors: InvalidArgument naming the input whose count, dtype or shape mismatches.
  Status Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs) VIGIL_EXCLUDES(mu_);

  std::vector<NodeTiming> Profile() const VIGIL_EXCLUDES(mu_);
  size_t ArenaBytes() const;

  // Device-resident inference (CUDA backend): nullptr on the CPU backend. EnqueueOnDevice enqueues one
  // inference from device_io()->inputs to device_io()->outputs on device_io()->stream and returns
  // without waiting (a CUDA graph launch after the first call); SynchronizeDevice waits for it and
  // reports errors of host-fallback kernels. Not to be mixed concurrently with Run (same buffers);
  // one thread at a time. Errors: Unimplemented on the CPU backend, Internal for CUDA failures.
  const DeviceIo* device_io() const;
  Status EnqueueOnDevice() VIGIL_EXCLUDES(mu_);
  Status SynchronizeDevice() VIGIL_EXCLUDES(mu_);

 private:
  Engine();
  Graph graph_;
  ModelSummary summary_;
  std::vector<TensorInfo> inputs_, outputs_;
  // Set at load, never reset. Run, Profile, EnqueueOnDevice and SynchronizeDevice call into it holding mu_
  // (one inference at a time: the model's arena and buffers are shared); ArenaBytes and device_io read
  // what compiling fixed, without the lock. mu_ serialises calls into it; it guards no field here.
  std::unique_ptr<CompiledModel> compiled_;
  mutable Mutex mu_;
};

}  // namespace vigil::infer
