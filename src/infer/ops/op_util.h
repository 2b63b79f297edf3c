// op_util.h — helpers shared by the reference kernels and shape-inference functions in ops/*.cc.
//
// Contents: error helpers that name the node ("node 'n' (Add): ..."), input/dtype/axis validation,
// numpy-style multidirectional broadcasting (ONNX "Broadcasting in ONNX", docs/Broadcasting.md:
// shapes are right-aligned; each pair of dimensions must be equal or one of them 1), an iteration
// plan over broadcast operands, dtype dispatch, float16-via-float32 execution, and RunReference
// (infer + allocate + run one node, used by tests and the constant folder).
//
// Shapes are static (every dimension >= 0); sizes, strides and offsets are in elements.
// Thread-safety: free functions and immutable values; BroadcastPlan is read-only after
// construction and may be used from several threads (e.g. inside an OpenMP loop).
// Errors: validation helpers return InvalidArgument whose message starts with Node::Describe();
// nothing here throws or aborts on bad input.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infer/op_registry.h"
#include "vigil/common/status.h"
#include "vigil/common/tensor.h"
#include "vigil/infer/graph.h"

namespace vigil::infer {

// ---- Errors ------------------------------------------------------------------------------------

// InvalidArgument "node 'n' (Op): <args...>", the arguments concatenated by vigil::StrCat.
template <typename... Args>
Status NodeError(const Node& node, const Args&... args) {
  return absl::InvalidArgumentError(vigil::StrCat(node.Describe(), ": ", args...));
}
// Unimplemented "node 'n' (Op): <args...>" — for valid ONNX that vigil does not support.
template <typename... Args>
Status NodeUnimplemented(const Node& node, const Args&... args) {
  return absl::UnimplementedError(vigil::StrCat(node.Describe(), ": ", args...));
}

// ---- Validation (for InferFn) ------------------------------------------------------------------

// Checks that the node has between `min` and `max` inputs (Node::NumInputs) and that the first
// `min` are present (non-empty name and a defined type in ctx.input_types).
Status CheckInputCount(const ShapeContext& ctx, size_t min, size_t max);
// Checks that the node has between `min` and `max` outputs (omitted trailing ones included).
Status CheckOutputCount(const Node& node, size_t min, size_t max);
// Checks that input `i` (present) has one of `allowed` dtypes:
// "input 1 has dtype int8; expected one of float32, float16".
Status CheckDType(const ShapeContext& ctx, size_t i, std::initializer_list<DType> allowed);
// Checks that inputs `a` and `b` (present) have the same dtype.
Status CheckSameDType(const ShapeContext& ctx, size_t a, size_t b);
// "float32, float16" — for messages.
std::string DTypeList(std::initializer_list<DType> dtypes);

// Normalises `axis` in [-rank, rank-1] to [0, rank-1]; otherwise
// "axis 4 is out of range for rank 4".
StatusOr<int64_t> NormalizeAxis(const Node& node, int64_t axis, int64_t rank);
// Normalises each axis and returns them sorted; a repeated axis is an error.
StatusOr<std::vector<int64_t>> NormalizeAxes(const Node& node, const std::vector<int64_t>& axes,
                                             int64_t rank);

// The value of input `i` as int64 values (integer dtypes) when it is known at load
// (ctx.input_values[i] non-null). `what` names the input in errors ("axes"); a missing value is
// Unimplemented ("input 1 (axes) must be a constant known at load").
StatusOr<std::vector<int64_t>> ConstInt64Input(const ShapeContext& ctx, size_t i, std::string_view what);

// ---- Broadcasting ------------------------------------------------------------------------------

// The multidirectional (numpy) broadcast of `a` and `b`, or false when they do not broadcast.
bool BroadcastShapes(const Shape& a, const Shape& b, Shape* out);
// The broadcast of all `shapes`; on failure "inputs [1,3] and [1,4] do not broadcast"
// (naming the accumulated shape so far and the offending one).
StatusOr<Shape> BroadcastShapes(const Node& node, std::span<const Shape> shapes);
// Element strides of a row-major tensor of shape `in` read as shape `out` (right-aligned):
// 0 on broadcast (size-1 or missing) dimensions. Result has out.size() entries.
// REQUIRES: `in` broadcasts to `out`.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out);

// An iteration plan for an output of shape `out` computed from inputs broadcast to it: the output
// is walked as rows() contiguous rows of row_length() elements (adjacent dimensions with compatible
// strides merged, so same-shape operands give one long row). Within a row input k advances by
// inner_stride(k) (0 or 1); offset(k, r) is its element offset at the start of row r.
// Rows are independent: iterate them in any order, in parallel.
// REQUIRES: every input broadcasts to `out`.
class BroadcastPlan {
 public:
  BroadcastPlan(std::span<const Shape> inputs, const Shape& out);
  int64_t rows() const { return rows_; }
  int64_t row_length() const { return row_length_; }
  int64_t inner_stride(size_t k) const { return inner_stride_[k]; }
  int64_t offset(size_t k, int64_t row) const;

 private:
  std::vector<int64_t> outer_dims_;                  // collapsed output dims except the innermost
  std::vector<std::vector<int64_t>> outer_strides_;  // per input, aligned with outer_dims_
  std::vector<int64_t> inner_stride_;
  int64_t rows_ = 1, row_length_ = 1;
};

// ---- Dtype dispatch ----------------------------------------------------------------------------

// Calls fn(T{}) with T the first of `Ts` whose DTypeOf<T>() equals `dtype`; returns false when
// none matches. Usage:
//   DispatchDType<float, int32_t, int64_t>(t.dtype(), [&](auto tag) { using T = decltype(tag); ... });
// float16 has no C++ arithmetic type here: run such kernels through RunAsFloat32.
template <typename... Ts, typename Fn>
bool DispatchDType(DType dtype, Fn&& fn) {
  return ((DTypeOf<Ts>() == dtype ? (fn(Ts{}), true) : false) || ...);
}

// Runs `run` with every float16 input converted to float32 and every float16 output computed into
// a float32 temporary, then rounded back to float16 (round to nearest even). Non-float16 tensors
// pass through unchanged. The CPU computes float16 models in float32 this way.
Status RunAsFloat32(const KernelContext& ctx, RunFn run);

// Number of OpenMP threads worth using for `work` elementwise operations (1 below ~32K elements).
int ThreadsFor(int64_t work);

// ---- Running one node --------------------------------------------------------------------------

// Runs `node` with the reference kernels: looks up its schema (FindOp), infers output types with
// all inputs treated as known values, allocates owned outputs (an undefined Tensor for an omitted
// output name) and runs the kernel. Errors: Unimplemented for an unknown op, or whatever infer/run
// return. `outputs` is resized to node.outputs.size().
Status RunReference(const Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                    std::vector<Tensor>* outputs);

}  // namespace vigil::infer
