#include "infer/ops/op_util.h"

#include <omp.h>

#include <algorithm>

namespace vigil::infer {

Status CheckInputCount(const ShapeContext& ctx, size_t min, size_t max) {
  const size_t n = ctx.node.NumInputs();
  if (n < min || n > max) {
    return min == max ? NodeError(ctx.node, "expected ", min, " inputs, got ", n)
                      : NodeError(ctx.node, "expected ", min, " to ", max, " inputs, got ", n);
  }
  for (size_t i = 0; i < min; ++i) {
    if (!ctx.node.HasInput(i) || i >= ctx.input_types.size() ||
        ctx.input_types[i].dtype == DType::kUndefined) {
      return NodeError(ctx.node, "required input ", i, " is missing");
    }
  }
  if (ctx.input_types.size() < n) return NodeError(ctx.node, "input types not known for all ", n, " inputs");
  return absl::OkStatus();
}

Status CheckOutputCount(const Node& node, size_t min, size_t max) {
  const size_t n = node.outputs.size();
  if (n < min || n > max) {
    return min == max ? NodeError(node, "expected ", min, " outputs, got ", n)
                      : NodeError(node, "expected ", min, " to ", max, " outputs, got ", n);
  }
  return absl::OkStatus();
}

std::string DTypeList(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += StrCat(s.empty() ? "" : ", ", DTypeName(d));
  return s;
}

Status CheckDType(const ShapeContext& ctx, size_t i, std::initializer_list<DType> allowed) {
  const DType d = ctx.input_types[i].dtype;
  if (std::find(allowed.begin(), allowed.end(), d) != allowed.end()) return absl::OkStatus();
  return NodeError(ctx.node, "input ", i, " has dtype ", DTypeName(d), "; expected one of ",
                   DTypeList(allowed));
}

Status CheckSameDType(const ShapeContext& ctx, size_t a, size_t b) {
  const DType da = ctx.input_types[a].dtype, db = ctx.input_types[b].dtype;
  if (da == db) return absl::OkStatus();
  return NodeError(ctx.node, "inputs ", a, " and ", b, " have different dtypes (", DTypeName(da), ", ",
                   DTypeName(db), ")");
}

StatusOr<int64_t> NormalizeAxis(const Node& node, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return NodeError(node, "axis ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

StatusOr<std::vector<int64_t>> NormalizeAxes(const Node& node, const std::vector<int64_t>& axes,
                                             int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t a : axes) {
    VIGIL_ASSIGN_OR_RETURN(int64_t n, NormalizeAxis(node, a, rank));
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) {
    return NodeError(node, "axes ", ShapeToString(axes), " repeat an axis");
  }
  return out;
}

StatusOr<std::vector<int64_t>> ConstInt64Input(const ShapeContext& ctx, size_t i, std::string_view what) {
  const Tensor* t = i < ctx.input_values.size() ? ctx.input_values[i] : nullptr;
  if (t == nullptr)
    return NodeUnimplemented(ctx.node, "input ", i, " (", what, ") must be a constant known at load");
  switch (t->dtype()) {
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt8: return t->ToInt64Vector();
    default:
      return NodeError(ctx.node, "input ", i, " (", what, ") has dtype ", DTypeName(t->dtype()),
                       "; expected int64");
  }
}

bool BroadcastShapes(const Shape& a, const Shape& b, Shape* out) {
  const size_t r = std::max(a.size(), b.size());
  Shape s(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    s[i] = da == 1 ? db : da;
  }
  *out = std::move(s);
  return true;
}

StatusOr<Shape> BroadcastShapes(const Node& node, std::span<const Shape> shapes) {
  Shape acc;
  for (const Shape& s : shapes) {
    if (!BroadcastShapes(acc, s, &acc)) {
      return NodeError(node, "inputs ", ShapeToString(acc), " and ", ShapeToString(s), " do not broadcast");
    }
  }
  return acc;
}

std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t j = 0; j < in.size(); ++j) {
    const size_t i_in = in.size() - 1 - j, i_out = out.size() - 1 - j;
    strides[i_out] = in[i_in] == 1 ? 0 : stride;
    stride *= in[i_in];
  }
  return strides;
}

BroadcastPlan::BroadcastPlan(std::span<const Shape> inputs, const Shape& out) {
  const size_t k = inputs.size();
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& s : inputs) strides.push_back(BroadcastStrides(s, out));
  // Collapse: drop size-1 output dims, merge a dim into the previous one when every input's
  // stride is contiguous across the pair (equal pattern of broadcast / not broadcast).
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> st(k);
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t i = 0; merge && i < k; ++i) merge = st[i].back() == strides[i][d] * out[d];
    if (merge) {
      dims.back() *= out[d];
      for (size_t i = 0; i < k; ++i) st[i].back() = strides[i][d];
    } else {
      dims.push_back(out[d]);
      for (size_t i = 0; i < k; ++i) st[i].push_back(strides[i][d]);
    }
  }
  inner_stride_.assign(k, 0);
  if (!dims.empty()) {
    row_length_ = dims.back();
    dims.pop_back();
    for (size_t i = 0; i < k; ++i) {
      inner_stride_[i] = st[i].back();
      st[i].pop_back();
    }
  }
  outer_dims_ = std::move(dims);
  outer_strides_ = std::move(st);
  rows_ = NumElements(outer_dims_);
  if (NumElements(out) == 0) rows_ = row_length_ = 0;
}

int64_t BroadcastPlan::offset(size_t k, int64_t row) const {
  int64_t off = 0;
  const std::vector<int64_t>& s = outer_strides_[k];
  for (size_t d = outer_dims_.size(); d-- > 0;) {
    off += (row % outer_dims_[d]) * s[d];
    row /= outer_dims_[d];
  }
  return off;
}

int ThreadsFor(int64_t work) { return work < (int64_t{1} << 15) ? 1 : omp_get_max_threads(); }

Status RunAsFloat32(const KernelContext& ctx, RunFn run) {
  auto to_float = [](const Tensor& h) {
    Tensor f(DType::kFloat32, h.shape());
    const uint16_t* src = h.data<uint16_t>();
    float* dst = f.data<float>();
    const int64_t n = h.numel();
#pragma omp parallel for num_threads(ThreadsFor(n))
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
    return f;
  };
  std::vector<Tensor> in(ctx.inputs.begin(), ctx.inputs.end());
  for (Tensor& t : in) {
    if (t.dtype() == DType::kFloat16) t = to_float(t);
  }
  std::vector<Tensor> out(ctx.outputs.begin(), ctx.outputs.end());
  for (Tensor& t : out) {
    if (t.dtype() == DType::kFloat16) t = Tensor(DType::kFloat32, t.shape());
  }
  VIGIL_RETURN_IF_ERROR(run(KernelContext{ctx.node, ctx.opset, in, out}));
  for (size_t o = 0; o < out.size(); ++o) {
    if (ctx.outputs[o].dtype() != DType::kFloat16) continue;
    const float* src = out[o].data<float>();
    uint16_t* dst = ctx.outputs[o].data<uint16_t>();
    const int64_t n = out[o].numel();
#pragma omp parallel for num_threads(ThreadsFor(n))
    for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
  }
  return absl::OkStatus();
}

Status RunReference(const Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                    std::vector<Tensor>* outputs) {
  const OpSchema* schema = FindOp(node.domain, node.op_type);
  if (schema == nullptr || schema->infer == nullptr || schema->run == nullptr) {
    return absl::UnimplementedError(
        StrCat("unsupported op '", node.op_type, "' (node '", node.name, "', opset ", opset, ")"));
  }
  ShapeContext sctx{node, opset, {}, {}};
  for (const Tensor& t : inputs) {
    sctx.input_types.push_back(TensorType{t.dtype(), t.defined() ? t.shape() : Shape{}});
    sctx.input_values.push_back(t.defined() ? &t : nullptr);
  }
  std::vector<TensorType> types;
  VIGIL_RETURN_IF_ERROR(schema->infer(sctx, &types));
  if (types.size() != node.outputs.size()) {
    return absl::InternalError(StrCat(node.Describe(), ": shape inference returned ", types.size(),
                                      " output types for ", node.outputs.size(), " outputs"));
  }
  outputs->assign(node.outputs.size(), Tensor());
  for (size_t i = 0; i < types.size(); ++i) {
    if (!node.outputs[i].empty()) (*outputs)[i] = Tensor(types[i].dtype, types[i].shape);
  }
  return schema->run(KernelContext{node, opset, inputs, *outputs});
}

}  // namespace vigil::infer
