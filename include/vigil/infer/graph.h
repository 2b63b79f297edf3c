// vigil/infer/graph.h — the engine's graph IR, imported from ONNX and rewritten by passes.
//
// A Graph is a list of Nodes in topological order; values are named (ONNX names) and flow from
// graph inputs, initializers (constant tensors) and node outputs to node inputs. Operator
// semantics follow the ONNX operator specification (https://onnx.ai/onnx/operators/) at the
// model's opset (`Graph::opset`), including version differences (YOLO-NOTES.md lists those that bite).
//
// Dimensions: a graph input may have symbolic dimensions ("batch", "height"); they are fixed to
// concrete values at load (FixInputShapes) so that every later pass and backend sees static
// shapes: `Graph::types` then holds the dtype and shape of every value.
//
// Thread-safety: a Graph is a plain value; passes mutate it and are not thread-safe.
// Errors: validation returns InvalidArgument naming the node, its op type and the offending input.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"

namespace vigil::infer {

// One dimension of a declared (possibly symbolic) shape: value >= 0 when known, else -1 with
// an optional symbol name (ONNX dim_param).
struct Dim {
  int64_t value = -1;
  std::string symbol;
  bool is_static() const { return value >= 0; }
};

// A declared graph input or output.
struct ValueInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<Dim> dims;  // empty with has_shape=false when the model declares no shape
  bool has_shape = false;
};

// A value's concrete type after shape inference.
struct TensorType {
  DType dtype = DType::kUndefined;
  Shape shape;
  bool operator==(const TensorType&) const = default;
};

// ONNX attribute value. Graph-valued attributes (If/Loop bodies) are not supported.
using AttrValue = std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>,
                               std::vector<std::string>, Tensor>;

struct Node {
  std::string name;     // may be empty in ONNX; the importer fills "<op_type>_<index>" then
  std::string op_type;  // "Conv", "Sigmoid", ...; vigil's fused ops use domain "vigil"
  std::string domain;   // "" for ai.onnx, "com.microsoft", "vigil", ...
  std::vector<std::string> inputs;   // "" marks an omitted optional input
  std::vector<std::string> outputs;  // "" marks an omitted optional output
  std::map<std::string, AttrValue> attrs;

  bool HasAttr(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t GetInt(const std::string& key, int64_t fallback) const;
  float GetFloat(const std::string& key, float fallback) const;
  std::string GetString(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> GetInts(const std::string& key, const std::vector<int64_t>& fallback = {}) const;
  std::vector<float> GetFloats(const std::string& key, const std::vector<float>& fallback = {}) const;
  const Tensor* GetTensor(const std::string& key) const;  // nullptr when absent
  // Number of inputs present (non-empty names), counting only up to the last present one.
  size_t NumInputs() const;
  bool HasInput(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  // "node '/model.0/conv/Conv' (Conv)" — for error messages.
  std::string Describe() const;
  // op_type, domain-qualified outside ai.onnx: "Conv", "vigil.FusedConv", "com.microsoft.QuickGelu".
  std::string QualifiedOpType() const;
};

struct Graph {
  int64_t ir_version = 0;
  int64_t opset = 0;                          // ai.onnx opset
  std::map<std::string, int64_t> opset_imports;  // domain → version ("" is ai.onnx)
  std::string producer_name, producer_version;
  std::map<std::string, std::string> metadata;   // ONNX metadata_props (Ultralytics: names, stride, imgsz, ...)

  std::vector<ValueInfo> inputs;   // real inputs only (initializers listed as inputs are dropped)
  std::vector<ValueInfo> outputs;
  std::unordered_map<std::string, Tensor> initializers;
  std::vector<Node> nodes;
  // Nodes per op type as the file has them (Constant nodes included, although import turns them
  // into initializers); op types outside ai.onnx are "domain.OpType". For `model inspect`.
  std::map<std::string, int> file_op_counts;

  // Filled by shape inference (passes/shape_inference.h): every value's dtype and static shape.
  std::unordered_map<std::string, TensorType> types;

  bool IsInitializer(const std::string& name) const { return initializers.count(name) != 0; }
  // The opset version a node of `domain` follows: `opset` for ai.onnx ("") and for domains the model
  // does not import (vigil's own), else that domain's import.
  int64_t OpsetOf(const std::string& domain) const {
    auto it = opset_imports.find(domain);
    return domain.empty() || it == opset_imports.end() ? opset : it->second;
  }
  const Tensor* FindInitializer(const std::string& name) const;
};

// Checks structure: every node input is a graph input, an initializer or an earlier node's
// output; no value is produced twice; graph outputs are produced. REQUIRES: nodes topologically
// sorted (call TopologicalSort first for untrusted files). Returns InvalidArgument naming the node.
Status ValidateGraph(const Graph& graph);

// Sorts `graph.nodes` topologically (stable: keeps file order where possible). Returns
// InvalidArgument naming a node on a cycle or with an input nobody produces.
Status TopologicalSort(Graph& graph);

}  // namespace vigil::infer
