// op_registry.h — what vigil knows about each operator: shape inference and the reference kernel.
//
// Every op the engine runs has one OpSchema here. The reference kernel (`run`) is plain, portable
// C++ that follows the ONNX operator specification at the node's opset; it is the oracle every
// faster path (oneDNN, CUDA) is tested against, and the constant folder runs it at load time.
//
// Conventions for both functions:
//  - inputs are index-aligned with Node::inputs; an omitted optional input is an undefined Tensor
//    (ShapeContext: TensorType with dtype kUndefined, value nullptr);
//  - outputs are index-aligned with Node::outputs.
// Thread-safety: schemas are immutable after static initialisation; `run` may be called
// concurrently on distinct tensors (it keeps no state).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

struct ShapeContext {
  const Node& node;
  int64_t opset;
  std::vector<TensorType> input_types;       // kUndefined dtype for omitted inputs
  std::vector<const Tensor*> input_values;   // non-null when the input's value is known at load
};

struct KernelContext {
  const Node& node;
  int64_t opset;
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;  // allocated by the caller with the inferred dtype and shape
};

// Computes the dtype and static shape of every output. Returns InvalidArgument (naming the node
// via Node::Describe()) when inputs are inconsistent, or Unimplemented for an unsupported
// attribute value; must not crash on any input.
using InferFn = Status (*)(const ShapeContext& ctx, std::vector<TensorType>* outputs);
// Computes the outputs. REQUIRES: inputs match what `infer` accepted.
using RunFn = Status (*)(const KernelContext& ctx);

struct OpSchema {
  std::string_view domain;   // "" = ai.onnx
  std::string_view op_type;
  int64_t min_opset = 1;     // oldest opset version whose semantics `run` implements
  InferFn infer = nullptr;
  RunFn run = nullptr;
};

// The schema for (domain, op_type), or nullptr when vigil does not support the op.
// Domain "ai.onnx" is treated as "".
const OpSchema* FindOp(std::string_view domain, std::string_view op_type);
// All supported ops, for `vigil model inspect` and tests.
std::vector<const OpSchema*> AllOps();

}  // namespace vigil::infer
