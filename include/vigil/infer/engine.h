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
#include <mutex>
#include <span>
#include <string>
#include <vector>

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

struct EngineOptions {
  std::string device = "cpu";  // "cpu" now; "cuda:N" with the CUDA backend. Default: "cpu".
  int threads = 0;             // kernel threads; 0 = all cores available to the process
  int64_t batch = 0;           // fixes a symbolic batch dim; 0 = model's (1 when symbolic)
  int64_t height = 0;          // fixes symbolic H of image inputs; 0 = metadata imgsz
  int64_t width = 0;           // fixes symbolic W of image inputs; 0 = metadata imgsz
  std::map<std::string, Shape> input_shapes;  // full input shapes by name (win over the above)
  bool use_onednn = true;      // CPU: oneDNN fast paths (false = reference kernels only)
  bool optimize = true;        // run the fusion/no-op passes (folding and dequantization always run)
  bool profile = false;        // per-node timings, see Profile()
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
  Status Run(std::span<const Tensor> inputs, std::vector<Tensor>* outputs);

  std::vector<NodeTiming> Profile() const;
  size_t ArenaBytes() const;

 private:
  Engine();
  Graph graph_;
  ModelSummary summary_;
  std::vector<TensorInfo> inputs_, outputs_;
  std::unique_ptr<CompiledModel> compiled_;
  mutable std::mutex mu_;  // serialises Run
};

}  // namespace vigil::infer
